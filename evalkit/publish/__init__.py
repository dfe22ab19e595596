"""Results where users already look: experiment trackers (``tracking``: W&B, MLflow,
TensorBoard) and Hugging Face model cards (``card``), docs/ecosystem.md; and the leaderboard of
a zoo with its paired tests (``leaderboard``, ``significance``), docs/results.md."""
