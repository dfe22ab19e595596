"""Metrics, implemented here and tested against hand-computed values: top-k accuracy."""

from __future__ import annotations

import torch


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> float:
    """Percentage of rows whose label is among the ``k`` highest logits (ties: lowest index
    wins, as in ``torch.topk``)."""
    k = min(k, logits.shape[1])
    hits = (logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1)
    return 100.0 * hits.double().mean().item()
