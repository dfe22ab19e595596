"""The paper's effect table, measured: its rows, scales and verdicts (``rows``), the runs
that measure them (``reproduce``), the table and picture (``table``), the paper-scale sweep and
its compute estimate (``paper_scale``) and sweeps of jobs, local or on Slurm (``sweep``)."""
