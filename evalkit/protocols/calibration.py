"""Calibration of a classifier's probabilities, on torch tensors (effect-table row 11;
docs/protocols.md, "Calibration"): the reliability diagram's bins of top-1 confidence,
equal-width or equal-mass, and the expected calibration error over them; negative
log-likelihood; Brier score; and the temperature fitted to held-out logits. The bins' record
(``Reliability``) and everything computed from per-image numbers are in ``evalkit.metrics``,
which imports no torch."""

from __future__ import annotations

import math

import torch

from evalkit.metrics import ECE_BINS, Reliability


def reliability(
    probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS, scheme: str = "width"
) -> Reliability:
    """Bin the top-1 confidences: ``width`` — ``bins`` equal-width bins over [0, 1], each
    (lower, upper] with the first closed at 0 (a confidence of exactly 1.0 is in the last);
    ``mass`` — ``bins`` bins of (as near as possible) equal counts, sorted by confidence."""
    confidence, predicted = probs.double().max(dim=1)
    correct = (predicted == labels).double()
    if scheme == "width":
        edges = [(b + 1) / bins for b in range(bins)]
        # Against the edges themselves: ceil(0.6 · 5) is 4 in floating point, not 3.
        index = torch.searchsorted(torch.tensor(edges, dtype=torch.float64), confidence)
        index = index.clamp(0, bins - 1)
    elif scheme == "mass":
        order = confidence.argsort()
        index = torch.empty_like(order)
        index[order] = torch.arange(len(order)) * bins // max(1, len(order))
        edges = [
            confidence[index == b].max().item() if (index == b).any() else math.nan
            for b in range(bins)
        ]
    else:
        raise ValueError(f"unknown binning {scheme!r}: width or mass")
    counts = torch.bincount(index, minlength=bins)

    def mean(values):
        sums = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, values)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan).tolist()

    return Reliability(edges, counts.tolist(), mean(confidence), mean(correct))


def expected_calibration_error(
    probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS, scheme: str = "width"
) -> float:
    """Σ_bins (n_b / N) · |accuracy_b − confidence_b| over the top-1 confidences."""
    return reliability(probs, labels, bins, scheme).ece


def negative_log_likelihood(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(logits.double(), labels).item()


def brier_score(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over rows of Σ_classes (p − one-hot)² (0 is perfect, 2 the worst)."""
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).double()
    return (probs.double() - onehot).pow(2).sum(dim=1).mean().item()


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature T > 0 that minimises the NLL of ``softmax(logits / T)`` (L-BFGS on
    log T, from T = 1)."""
    logits, log_t = logits.double(), torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return log_t.exp().item()
