"""The dataset owners' official files → the layouts evalkit's tasks read (docs/data.md).
``evalkit prepare`` (``evalkit.cli.prepare``) runs them.

Modules: ``waymo`` (Waymo Open v2 parquet → depth maps), ``imagenet`` (the official validation
folder and training archives → class folders), ``imagenet_c`` (a validation set → the 75
corrupted sets) and ``released`` (model-vs-human and CelebA as released)."""
