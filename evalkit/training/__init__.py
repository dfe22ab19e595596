"""Training backbones (effect-table rows 1–4, 7–8 and 11).

Modules: ``loop`` (one loop with resumable checkpoints), ``probes`` (attention statistics
read from outside the model), ``pretrain`` (the built-in family from scratch) and
``finetune`` (a backbone end to end with a task head)."""
