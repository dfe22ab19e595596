"""Training backbones (effect-table rows 1–4): one loop with resumable checkpoints
(``evalkit.training.loop``) and attention statistics read from outside the model
(``evalkit.training.probes``)."""
