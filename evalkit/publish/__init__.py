"""Results where users already look: experiment trackers (``tracking``: W&B, MLflow,
TensorBoard) and Hugging Face model cards (``card``); docs/ecosystem.md."""
