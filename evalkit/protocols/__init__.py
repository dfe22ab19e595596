"""What the paper's protocols share: the library the task plugins (``tasks/``) are written
against. ``classification`` (splits, rows, hold-out, scoring), ``linear_classifier`` (the probe's
L2 path and its fine-tuning mode), ``scorer`` (the classifier calibration and distillation
score with), ``predictions`` (per-image Parquet), ``dense`` (patch grids, subsets, pictures),
``finetuning`` (end-to-end training of a backbone with a head) and ``small_training`` (the
ablations' sizes and image sets). A task module imports these and never another task."""
