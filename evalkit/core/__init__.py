"""The run's core: what a task is, which tasks exist, the driver that runs tasks on backbones,
what a row records, and what a run will cost before it runs.

Modules: ``task`` (settings, metrics, paired tests), ``catalog`` (the built-in tasks),
``suites`` (named sets of tasks), ``spec`` (what a run asks for: its RunSpec), ``cells`` (the
unit of work, a (backbone setup, seed, task) cell: its keys, whether it is done, shares of a
zoo, the per-job lock), ``runner`` (the one driver), ``rows`` (what a row records),
``results`` (rows and their files), ``labels`` (which rows are one run, and its name in
every view), ``tables`` (rows aggregated over seeds, and printed), ``gate`` (baseline against
new rows), ``merge`` (rows written on several machines),
``costs`` (the plan of a run), ``budget`` (the machine it is planned for, and whether it
fits), ``shapes`` (a backbone's size as the plan sees it), ``rates`` (this machine's speed),
``numerics`` (how a run's arithmetic is set), ``run_options`` (the options of evalkit run,
and the run they ask for), ``preflight`` (what a run refuses before torch is imported) and
``settings_table`` (a task's settings read from its source, for ``evalkit ls settings``)."""
