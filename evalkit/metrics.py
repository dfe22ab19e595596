"""Metrics, implemented here and tested against hand-computed values: top-k accuracy; mIoU
and pixel accuracy from a dataset-wide confusion matrix (docs/protocols.md, "ADE20k"); monocular depth
errors over valid pixels (docs/protocols.md, "Monocular depth"), computed per image and averaged over
images; calibration's bins (effect-table row 11; docs/protocols.md, "Calibration"): a reliability
diagram's bins, pooled over sets, and ECE from per-image bins (the binning of tensors, NLL, Brier
and the fitted temperature are in ``evalkit.protocols.calibration``); decisions against people's
(docs/protocols.md, "Shape bias and human alignment"): shape bias on cue-conflict images,
accuracy difference, observed and error consistency, as the model-vs-human benchmark defines
them; standard errors over the test items.

Nothing here imports torch (a tensor is read through its own methods), so the result commands,
which read these constants and the numpy metrics, never load it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

IGNORE = 255


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> float:
    """Percentage of rows whose label is among the ``k`` highest logits (ties: lowest index
    wins, as in ``torch.topk``)."""
    return 100.0 * topk_hits(logits, labels, k).double().mean().item()


TOP_K = re.compile(r"top(\d+)(?:/|$)")


def reported_ks(classes: int, ks: tuple[int, ...] = (1, 5)) -> tuple[int, ...]:
    """The top-k accuracies worth reporting over ``classes`` scored classes: top-1 always, a
    larger k only below the class count (top-5 of two classes is 100% whatever the model)."""
    return tuple(k for k in ks if k == 1 or k < classes)


def beyond_classes(metric: str, classes: int) -> bool:
    """Whether ``metric`` is a top-k that ``reported_ks`` leaves out for ``classes``."""
    found = TOP_K.match(metric)
    return bool(found and classes and int(found.group(1)) > 1 and int(found.group(1)) >= classes)


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> torch.Tensor:
    """Per row: is the label among the ``k`` highest logits (chunks of a split concatenate)."""
    k = min(k, logits.shape[1])
    return (logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1)


def confusion_matrix(pred: np.ndarray, target: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) counts, rows = ground truth; ``IGNORE`` pixels left out."""
    keep = target != IGNORE
    index = target[keep].astype(np.int64) * num_classes + pred[keep].astype(np.int64)
    return np.bincount(index, minlength=num_classes**2).reshape(num_classes, num_classes)


def miou_of_classes(intersection: np.ndarray, union: np.ndarray) -> float:
    """mIoU (%) from each class's summed intersection and union, over the classes present in
    the ground truth or the prediction (0 when none is)."""
    present = union > 0
    return 100.0 * float((intersection[present] / union[present]).mean()) if present.any() else 0.0


def segmentation_scores(confusion: np.ndarray) -> dict[str, float]:
    """mIoU (%) over classes present in the ground truth or the prediction (intersection and
    union summed over the whole set first), pixel accuracy (%), and the number of classes."""
    intersection = np.diag(confusion).astype(np.float64)
    union = confusion.sum(0) + confusion.sum(1) - intersection
    present = union > 0
    labelled = confusion.sum()
    return {
        "miou": miou_of_classes(intersection, union),
        "pixel_acc": 100.0 * float(intersection.sum() / labelled) if labelled else 0.0,
        "classes": int(present.sum()),
    }


DEPTH_METRICS = (
    "mse",
    "mse_log",
    "rmse",
    "abs_rel",
    "log10",
    "delta1.1",
    "delta1",
    "delta2",
    "delta3",
)


def depth_errors(pred: np.ndarray, gt: np.ndarray, valid: np.ndarray) -> dict[str, float] | None:
    """Errors of one image over its valid pixels (depths in metres, pred > 0); None when the
    image has no valid pixel (the caller counts it as skipped)."""
    if not valid.any():
        return None
    d, p = gt[valid].astype(np.float64), pred[valid].astype(np.float64)
    ratio = np.maximum(d / p, p / d)
    squared = (d - p) ** 2
    return {
        "mse": float(squared.mean()),  # metres²
        "mse_log": float(((np.log(d) - np.log(p)) ** 2).mean()),  # on natural-log depth
        "rmse": float(np.sqrt(squared.mean())),
        "abs_rel": float((np.abs(d - p) / d).mean()),
        "log10": float(np.abs(np.log10(d) - np.log10(p)).mean()),
        "delta1.1": float((ratio < 1.1).mean()),
        "delta1": float((ratio < 1.25).mean()),
        "delta2": float((ratio < 1.25**2).mean()),
        "delta3": float((ratio < 1.25**3).mean()),
    }


def eval_crop(shape: tuple[int, int], crop: str | None) -> np.ndarray:
    """Boolean mask of the evaluation crop: Garg (KITTI) or the NYU crop, scaled to ``shape``."""
    height, width = shape
    mask = np.zeros(shape, dtype=bool)
    if crop is None:
        mask[:] = True
    elif crop == "garg":
        mask[
            int(0.40810811 * height) : int(0.99189189 * height),
            int(0.03594771 * width) : int(0.96405229 * width),
        ] = True
    elif crop == "nyu":
        mask[
            round(45 / 480 * height) : round(471 / 480 * height),
            round(41 / 640 * width) : round(601 / 640 * width),
        ] = True
    else:
        raise ValueError(f"unknown evaluation crop {crop!r}")
    return mask


# --- calibration ---------------------------------------------------------------------------

ECE_BINS = 15


@dataclass(frozen=True)
class Reliability:
    """Per bin of top-1 confidence: how many predictions fell in it, their mean confidence and
    their accuracy (NaN for an empty bin); ``edges`` are the bins' upper bounds."""

    edges: list[float]
    counts: list[int]
    confidence: list[float]
    accuracy: list[float]

    @property
    def ece(self) -> float:
        total = sum(self.counts)
        return sum(
            n / total * abs(a - c)
            for n, a, c in zip(self.counts, self.accuracy, self.confidence, strict=True)
            if n
        )


def pooled(parts: list[Reliability]) -> Reliability:
    """Equal-width bins of several sets as one: counts added, means weighted by counts."""
    counts = [sum(p.counts[b] for p in parts) for b in range(len(parts[0].counts))]

    def mean(field: str, b: int) -> float:
        total = sum(p.counts[b] * getattr(p, field)[b] for p in parts if p.counts[b])
        return total / counts[b] if counts[b] else math.nan

    return Reliability(
        parts[0].edges,
        counts,
        [mean("confidence", b) for b in range(len(counts))],
        [mean("accuracy", b) for b in range(len(counts))],
    )


# --- uncertainty of a metric over the test items (effect-table verdicts) --------------------

BOOTSTRAP_DRAWS = 200


def accuracy_stderr(hits: torch.Tensor) -> float:
    """Binomial standard error, in percentage points, of the accuracy of ``hits`` (bools)."""
    n = len(hits)
    p = float(hits.double().mean()) if n else 0.0
    return 100.0 * math.sqrt(p * (1 - p) / n) if n else math.nan


def mean_stderr(values) -> float:
    """Standard error of the mean of per-item values (sample standard deviation / √n)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def bootstrap_stderr(statistic, n: int, *, seed: int = 0, draws: int = BOOTSTRAP_DRAWS) -> float:
    """Standard deviation of ``statistic(indices)`` over ``draws`` resamplings of the ``n``
    test items with replacement: the standard error of a statistic that is not a mean of
    per-item values (mIoU, ECE)."""
    rng = np.random.default_rng(seed)
    values = [statistic(rng.integers(0, n, n)) for _ in range(draws)]
    return float(np.std(values, ddof=1))


def miou_bootstrap_stderr(intersections: np.ndarray, unions: np.ndarray, *, seed: int = 0) -> float:
    """mIoU's standard error (percentage points) over images: ``intersections`` and
    ``unions`` are (images, classes) counts, summed over the resampled images as
    ``segmentation_scores`` sums the confusion."""

    def miou(rows: np.ndarray) -> float:
        return miou_of_classes(intersections[rows].sum(0), unions[rows].sum(0))

    return bootstrap_stderr(miou, len(intersections), seed=seed)


def confidence_bins(confidence: np.ndarray, bins: int) -> np.ndarray:
    """Each top-1 confidence's equal-width bin (a confidence on an edge in the bin below it)."""
    return np.clip(np.searchsorted(np.arange(1, bins + 1) / bins, confidence), 0, bins - 1)


def binned_ece(index: np.ndarray, correct: np.ndarray, confidence: np.ndarray, bins: int) -> float:
    """Σ_b (n_b/N)·|accuracy_b − confidence_b| from per-image bins, correctness, confidence."""
    gap = np.bincount(index, correct - confidence, minlength=bins)
    return float(np.abs(gap).sum() / len(index))


def ece_bootstrap_stderr(
    probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS, *, seed: int = 0
) -> float:
    """ECE's standard error over the images (equal-width bins)."""
    confidence, predicted = probs.double().max(dim=1)
    correct = (predicted == labels).double().numpy()
    confidence = confidence.numpy()
    index = confidence_bins(confidence, bins)

    def ece(rows: np.ndarray) -> float:
        return binned_ece(index[rows], correct[rows], confidence[rows], bins)

    return bootstrap_stderr(ece, len(labels), seed=seed)


def shape_bias(decisions, shapes, textures) -> dict[str, float]:
    """Shape bias on cue-conflict trials (Geirhos et al. 2019, as model-vs-human scores it):
    the shares of *all* trials whose decision is the shape's category and the texture's, counted
    only where the two differ (an image whose shape and texture are one category has no
    conflict); shape bias = shape share / (shape share + texture share), NaN when no decision
    follows either."""
    decisions, shapes, textures = (np.asarray(v) for v in (decisions, shapes, textures))
    conflict = shapes != textures
    shape = float(np.sum(conflict & (decisions == shapes)) / len(decisions))
    texture = float(np.sum(conflict & (decisions == textures)) / len(decisions))
    bias = shape / (shape + texture) if shape + texture else math.nan
    return {"shape_fraction": shape, "texture_fraction": texture, "shape_bias": bias}


def error_consistency(correct_a, correct_b) -> dict[str, float]:
    """Agreement of two observers' errors on the same trials (Geirhos, Meding & Wichmann 2020):
    observed consistency c_obs = share of trials both get right or both get wrong; expected
    c_exp = p_a·p_b + (1−p_a)(1−p_b) from their accuracies alone; error consistency is Cohen's
    kappa (c_obs − c_exp)/(1 − c_exp). Where c_exp is 1 — both observers perfect, or both
    always wrong — kappa is 0/0 and undefined: NaN (Klein et al. 2025 show that the benchmark's
    own code returns 1 there, which inflates consistency on easy conditions)."""
    a, b = (np.asarray(v, dtype=bool) for v in (correct_a, correct_b))
    if len(a) != len(b) or not len(a):
        raise ValueError(f"error consistency needs the same trials: {len(a)} vs {len(b)}")
    observed = float(np.mean(a == b))
    p_a, p_b = float(a.mean()), float(b.mean())
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    kappa = math.nan if expected == 1.0 else (observed - expected) / (1 - expected)
    return {"observed": observed, "expected": expected, "kappa": kappa}


def accuracy_difference(accuracy_a: float, accuracy_b: float) -> float:
    """model-vs-human's accuracy difference of two observers: the squared difference."""
    return (accuracy_a - accuracy_b) ** 2
