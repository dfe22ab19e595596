"""The paper's effect table, measured.

Modules: ``rows`` (its rows, scales and verdicts), ``scales`` (the scales it runs at),
``reproduce`` (the runs that measure it), ``resolve`` (how each row ends: agrees,
disagrees or a margin, and adding seeds to undecided rows until decided), ``table`` (its Markdown, JSON and picture),
``paper_scale`` (the paper-scale sweep and its compute estimate), ``sweep`` (plans of jobs,
local or on Slurm) and ``sbatch`` (the Slurm batch script a dry run prints)."""
