"""Whether two backbones really differ on the same test images: paired tests on per-image
outputs, and Holm's correction over the pairs of a leaderboard (``evalkit leaderboard``,
``evalkit compare --paired``; docs/results.md, "Leaderboard").

- Accuracy (one right/wrong per image): the exact McNemar test. Only the images where the two
  disagree carry information; under "no difference" each of them is equally likely to favour
  either model, so the count that favours A is Binomial(disagreements, 1/2), and the two-sided
  p-value is twice the smaller tail (at most 1), as ``scipy.stats.binomtest`` computes it.
- Any other metric recomputable from per-image parts (mean error, mIoU from per-image
  intersections and unions, a mean of per-seed correctness): a paired bootstrap over images.
  Images are resampled with replacement, the same draw for both models; the interval of the
  difference is the resamples' percentile interval, and the two-sided p-value is twice the
  share of resampled differences on the far side of zero, counted as (far + 1) / (resamples
  + 1) so that it is never 0 (the smallest is 2 / 2001), and at most 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from evalkit.metrics import binned_ece, confidence_bins, miou_of_classes

RESAMPLES = 2000
LEVEL = 0.05


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A and B on the same images: the difference of the metric
    (A − B), its 95% interval where a bootstrap gives one, and the p-value of "no difference"."""

    difference: float
    p: float
    test: str
    interval: tuple[float, float] | None = None
    images: int = 0


def mcnemar(a_right: np.ndarray, b_right: np.ndarray) -> Paired:
    """The exact McNemar test of two models' per-image correctness on the same images."""
    a_right, b_right = np.asarray(a_right, bool), np.asarray(b_right, bool)
    only_a = int((a_right & ~b_right).sum())
    only_b = int((~a_right & b_right).sum())
    difference = 100.0 * (only_a - only_b) / max(len(a_right), 1)
    test = f"exact McNemar ({only_a} images only A right, {only_b} only B)"
    return Paired(
        difference,
        binomial_two_sided(min(only_a, only_b), only_a + only_b),
        test,
        images=len(a_right),
    )


def binomial_two_sided(k: int, n: int) -> float:
    """P(X ≤ k or X ≥ n − k) for X ~ Binomial(n, 1/2), k ≤ n/2: twice the lower tail."""
    if n == 0 or 2 * k >= n:
        return 1.0
    log_half = -n * math.log(2.0)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(terms)
    tail = math.exp(top + log_half) * sum(math.exp(t - top) for t in terms)
    return min(1.0, 2.0 * tail)


def paired_bootstrap(
    parts_a: np.ndarray,
    parts_b: np.ndarray,
    metric: Callable[[np.ndarray], float],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Paired:
    """A paired bootstrap over images of ``metric`` (computed from per-image parts, rows of
    ``parts_*``) for A − B."""
    parts_a, parts_b = np.asarray(parts_a, float), np.asarray(parts_b, float)
    count = len(parts_a)
    observed = metric(parts_a) - metric(parts_b)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, count, size=(resamples, count))
    differences = np.array([metric(parts_a[d]) - metric(parts_b[d]) for d in draws])
    low, high = np.percentile(differences, [2.5, 97.5])
    far_side = int((differences <= 0).sum() if observed > 0 else (differences >= 0).sum())
    p = 1.0 if observed == 0 else min(1.0, 2.0 * (far_side + 1) / (resamples + 1))
    test = f"paired bootstrap over {count} images ({resamples} resamples)"
    return Paired(float(observed), p, test, (float(low), float(high)), count)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one family): the adjusted p-values, in the
    given order; reject where an adjusted value is at most the level."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def mean_of(parts: np.ndarray) -> float:
    """The mean over images of a per-image value (the first column when there are several)."""
    return float(parts.reshape(len(parts), -1)[:, 0].mean())


def miou_of(parts: np.ndarray) -> float:
    """Mean IoU (×100) from per-image intersections and unions, laid side by side per image
    (classes first, then the same classes' unions), summed over the images first."""
    intersections, unions = np.split(parts.sum(axis=0), 2)
    return miou_of_classes(intersections, unions)


def ece_of(parts: np.ndarray, bins: int) -> float:
    """ECE from per-image (confidence, correct) rows, binned as the calibration task bins."""
    confidence, correct = parts[:, 0], parts[:, 1]
    return binned_ece(confidence_bins(confidence, bins), correct, confidence, bins)
