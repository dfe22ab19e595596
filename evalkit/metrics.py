"""Metrics, implemented here and tested against hand-computed values: top-k accuracy; mIoU
and pixel accuracy from a dataset-wide confusion matrix (docs/protocols.md, "ADE20k"); monocular depth
errors over valid pixels (docs/protocols.md, "Monocular depth"), computed per image and averaged over images."""

from __future__ import annotations

import numpy as np
import torch

IGNORE = 255


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> float:
    """Percentage of rows whose label is among the ``k`` highest logits (ties: lowest index
    wins, as in ``torch.topk``)."""
    return 100.0 * topk_hits(logits, labels, k).double().mean().item()


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, k: int = 1) -> torch.Tensor:
    """Per row: is the label among the ``k`` highest logits (chunks of a split concatenate)."""
    k = min(k, logits.shape[1])
    return (logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1)


def confusion_matrix(pred: np.ndarray, target: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) counts, rows = ground truth; ``IGNORE`` pixels left out."""
    keep = target != IGNORE
    index = target[keep].astype(np.int64) * num_classes + pred[keep].astype(np.int64)
    return np.bincount(index, minlength=num_classes**2).reshape(num_classes, num_classes)


def segmentation_scores(confusion: np.ndarray) -> dict[str, float]:
    """mIoU (%) over classes present in the ground truth or the prediction (intersection and
    union summed over the whole set first), pixel accuracy (%), and the number of classes."""
    intersection = np.diag(confusion).astype(np.float64)
    union = confusion.sum(0) + confusion.sum(1) - intersection
    present = union > 0
    labelled = confusion.sum()
    return {
        "miou": 100.0 * float((intersection[present] / union[present]).mean())
        if present.any()
        else 0.0,
        "pixel_acc": 100.0 * float(intersection.sum() / labelled) if labelled else 0.0,
        "classes": int(present.sum()),
    }


DEPTH_METRICS = (
    "mse", "mse_log", "rmse", "abs_rel", "log10", "delta1.1", "delta1", "delta2", "delta3"
)  # fmt: skip


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
        mask[int(0.40810811 * height) : int(0.99189189 * height),
             int(0.03594771 * width) : int(0.96405229 * width)] = True  # fmt: skip
    elif crop == "nyu":
        mask[round(45 / 480 * height) : round(471 / 480 * height),
             round(41 / 640 * width) : round(601 / 640 * width)] = True  # fmt: skip
    else:
        raise ValueError(f"unknown evaluation crop {crop!r}")
    return mask
