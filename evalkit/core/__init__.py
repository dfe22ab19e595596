"""The run's core: a task (``task``: settings, metrics, what it costs), the registries of tasks
(``catalog``), the driver that runs tasks on backbones and writes rows (``runner``), the rows
and their tables (``results``), and what a run will cost before it runs (``plan``)."""
