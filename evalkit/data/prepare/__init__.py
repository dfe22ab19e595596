"""The dataset owners' official files → the layouts evalkit's tasks read (docs/data.md):
``waymo`` (Waymo Open v2 parquet → depth maps), ``imagenet`` (the official validation folder
and training archives → class folders), ``imagenet_c`` (a validation set → the 75 corrupted
sets). ``evalkit prepare`` (``evalkit.cli.prepare``) runs them."""
