"""The paired test each built-in task declares: how a metric is recomputed from a task's
per-image outputs, for the leaderboard's and ``evalkit compare --paired``'s tests
(``Task.paired_test``). It imports no torch and no task, so the result commands read which test a
task declares without importing the task: ``DECLARED`` names it for every class the catalog
(``evalkit.core.catalog``) registers, and each of those classes declares the same function
(``paired_test = staticmethod(...)``; ``tests/test_light_imports.py`` checks the two agree).
Model-vs-human's tests need which conditions the benchmark leaves out (``EXCLUDED``) and how
it compares them (``kept_conditions``): they are here too, and its scoring reads them here."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from evalkit.significance import (
    PerImageTest,
    column_mean,
    default_paired_test,
    ece_of,
    ece_sums,
    miou_of,
    miou_sums,
    right_or_wrong,
)


def classification_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """The paired test of a classification task's metric on what ``save_classifications``
    keeps: top-1 from each image's right or wrong, top-5 from whether any of its correct
    classes is among its five (exact McNemar for one-seed cells, else a bootstrap)."""
    if metric.startswith("top1") and "correct" in columns:
        return right_or_wrong(lambda frame: frame["correct"])
    if metric.startswith("top5") and {"top5", "label_classes"} <= columns:
        return right_or_wrong(top5_right)
    return column_mean(metric) if metric in columns else None


def top5_right(frame) -> np.ndarray:
    """Whether any of an image's correct classes is among its top five."""
    pairs = zip(frame["label_classes"], frame["top5"], strict=True)
    return np.array([bool(set(classes) & set(top)) for classes, top in pairs])


# Conditions the benchmark leaves out of its summary tables: no distortion at all, or human
# accuracy below 0.2 (where agreement with people means little).
EXCLUDED = {
    "colour": ("cr",),
    "contrast": ("c100", "c03", "c01"),
    "high-pass": ("inf", "0.55", "0.45", "0.4"),
    "low-pass": ("0", "15", "40"),
    "phase-scrambling": ("0", "150", "180"),
    "power-equalisation": ("0",),
    "false-colour": ("True",),
    "rotation": ("0",),
    "eidolonI": ("1-10-10", "64-10-10", "128-10-10"),
    "eidolonII": ("1-3-10", "32-3-10", "64-3-10", "128-3-10"),
    "eidolonIII": ("1-0-10", "16-0-10", "32-0-10", "64-0-10", "128-0-10"),
    "uniform-noise": ("0.0", "0.6", "0.9"),
}


def kept_conditions(conditions, excluded) -> list[str]:
    """A set's conditions in the summaries: all but the excluded, unless that leaves none.
    Conditions compare by meaning (``condition_meaning``), as the benchmark's own code sees
    them after reading its CSV files: the release writes ``true`` and ``0.60`` where the
    benchmark's exclusions say ``True`` and ``0.6``."""
    found = list(dict.fromkeys(conditions))
    dropped = {condition_meaning(c) for c in excluded}
    kept = [c for c in found if condition_meaning(c) not in dropped]
    return kept or found


def condition_meaning(text) -> bool | float | str:
    """What a condition's spelling means: ``true``/``True`` a truth value, ``0.00``/``0.0`` a
    number, anything else (``c100``, ``1-10-10``) its text."""
    text = str(text).strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text)
    except ValueError:
        return text


def ood_accuracy_test(excluded: dict) -> PerImageTest:
    """OOD accuracy's paired test: per image, right or wrong, its (set, condition) group —
    conditions the benchmark leaves out marked −1 — and its set; the statistic is the mean over
    sets of the mean over kept conditions of the accuracy, as the rows compute it."""

    def parts(frame) -> np.ndarray:
        group, sets = np.full(len(frame), -1.0), np.zeros(len(frame))
        names = sorted(set(frame["set"]))
        for number, name in enumerate(names):
            mine = (frame["set"] == name).to_numpy()
            conditions = frame["condition"].to_numpy()[mine]
            kept = kept_conditions(conditions, excluded.get(name, ()))
            codes = {c: number * 10_000 + k for k, c in enumerate(kept)}
            group[mine] = [codes.get(c, -1) for c in conditions]
            sets[mine] = number
        return np.column_stack([frame["correct"].to_numpy(float), group, sets])

    def statistic(parts: np.ndarray) -> float:
        kept = parts[parts[:, 1] >= 0]
        groups, inverse = np.unique(kept[:, 1], return_inverse=True)
        accuracy = np.bincount(inverse, weights=kept[:, 0]) / np.bincount(inverse)
        per_set = defaultdict(list)
        for code, value in zip(groups, accuracy, strict=True):
            per_set[int(code) // 10_000].append(value)
        return float(np.mean([np.mean(values) for values in per_set.values()]))

    return PerImageTest(parts, statistic, sums=accuracy_sums)


def accuracy_sums(parts: np.ndarray):
    """``Sums`` of OOD accuracy: per image, its right-or-wrong in its kept group's column and a
    one in the group's count column; of the sums, the mean over sets of the mean over the
    set's groups present in that resample of their accuracy."""
    groups, index = np.unique(parts[:, 1], return_inverse=True)
    rows = np.zeros((len(parts), 2 * len(groups)))
    rows[np.arange(len(parts)), index] = parts[:, 0]
    rows[np.arange(len(parts)), len(groups) + index] = 1.0
    kept = groups >= 0
    sets = groups[kept] // 10_000
    rows = rows[:, np.concatenate([kept, kept])]

    def of_sums(totals: np.ndarray, images: int) -> np.ndarray:
        right, seen = np.split(totals, 2, axis=1)
        accuracy = np.divide(right, seen, out=np.zeros_like(right), where=seen > 0)
        per_set = []
        for number in np.unique(sets):
            present = seen[:, sets == number] > 0
            count = present.sum(axis=1)
            total = accuracy[:, sets == number].sum(axis=1)
            per_set.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
        return np.nanmean(np.stack(per_set, axis=1), axis=1)

    return rows, of_sums


def shape_bias_test() -> PerImageTest:
    """Shape bias's paired test on the cue-conflict images: per image whether its decision is
    its shape's category and whether it is its texture's, where the two differ; the statistic
    is shape / (shape + texture)."""

    def parts(frame) -> np.ndarray:
        cue = (frame["set"] == "cue-conflict").to_numpy()
        conflict = cue & (frame["category"] != frame["texture"]).to_numpy()
        shape = conflict & (frame["decision"] == frame["category"]).to_numpy()
        texture = conflict & (frame["decision"] == frame["texture"]).to_numpy()
        return np.column_stack([shape, texture]).astype(float)

    def statistic(parts: np.ndarray) -> float:
        shape, texture = parts.sum(axis=0)
        return float(shape / (shape + texture)) if shape + texture else math.nan

    def of_sums(totals: np.ndarray, images: int) -> np.ndarray:
        shape, texture = totals[:, 0], totals[:, 1]
        either = shape + texture
        return np.divide(shape, either, out=np.full_like(shape, math.nan), where=either > 0)

    return PerImageTest(parts, statistic, sums=lambda parts: (parts, of_sums))


def few_shot_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """Few-shot top-1 from each image's share of seeds right (its mean × 100 is the row)."""
    return column_mean("correct_share", 100.0) if metric == "top1" else None


def calibration_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """ECE (raw or temperature-scaled) from each image's confidence and right or wrong,
    binned as the task bins; anything else as a classification's."""
    if metric in ("ece", "ece_ts") and "confidence" in columns:
        column = "confidence" if metric == "ece" else "confidence_ts"
        return PerImageTest(
            lambda frame: np.column_stack([frame[column], frame["correct"], frame["bins"]]),
            lambda parts: ece_of(parts[:, :2], int(parts[0, 2])),
            sums=ece_sums,
        )
    return classification_test(metric, columns)


def segmentation_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """mIoU from each image's per-class intersections and unions (summed, then averaged
    over classes: the row's own arithmetic); anything else as a per-image column's mean."""
    if metric == "miou" and {"intersection", "union"} <= columns:
        return PerImageTest(
            lambda frame: np.hstack([np.stack(frame["intersection"]), np.stack(frame["union"])]),
            miou_of,
            sums=miou_sums,
        )
    return default_paired_test(metric, columns)


def human_alignment_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """OOD accuracy from each stimulus's right or wrong in its kept condition and set;
    shape bias from each cue-conflict image's shape or texture decision."""
    if not {"set", "condition", "correct"} <= columns:
        return None
    if metric == "ood_accuracy":
        return ood_accuracy_test(EXCLUDED)
    if metric == "shape_bias" and {"category", "decision", "texture"} <= columns:
        return shape_bias_test()
    return None


# Every built-in task class, as the catalog names it, and the paired test it declares.
DECLARED = {
    "evalkit.tasks.calibration:Calibration": calibration_test,
    "evalkit.tasks.depth:Depth": default_paired_test,
    "evalkit.tasks.distillation:Distillation": classification_test,
    "evalkit.tasks.efficiency:EfficiencyAblation": default_paired_test,
    "evalkit.tasks.fairness:Fairness": classification_test,
    "evalkit.tasks.fewshot:FewShot": few_shot_test,
    "evalkit.tasks.knn:KNN": classification_test,
    "evalkit.tasks.linear_probe:LinearProbe": classification_test,
    "evalkit.tasks.model_vs_human:ModelVsHuman": human_alignment_test,
    "evalkit.tasks.segmentation:Segmentation": segmentation_test,
    "evalkit.tasks.stability:QKNormLR": default_paired_test,
    "evalkit.tasks.stability:QKNormStability": default_paired_test,
    "evalkit.tasks.video:VideoClassification": classification_test,
    "evalkit.tasks.zeroshot:Lit": classification_test,
    "evalkit.tasks.zeroshot:ZeroShot": classification_test,
}
