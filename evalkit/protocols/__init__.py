"""What the paper's protocols share: the library the task plugins (``tasks/``) are written
against. A task module imports these and never another task.

Modules: ``classification`` (splits, rows, hold-out, scoring), ``linear_classifier`` (the
probe's L2 path and its fine-tuning mode), ``scorer`` (the classifier calibration and
distillation score with), ``predictions`` (per-image Parquet), ``paired_tests`` (the paired
test each task declares, read by the leaderboard without importing a task or torch),
``error_tables`` (the tables of its mistakes each task declares, read by ``evalkit errors``),
``grids`` (patch grids, subsets, pictures of the dense tasks), ``human_alignment``
(model-vs-human decisions and scores), ``calibration``
(reliability bins, ECE, NLL, Brier and the fitted temperature, on tensors), ``finetuning``
(end-to-end training of a backbone with a head) and ``small_training`` (the ablations' sizes
and image sets)."""
