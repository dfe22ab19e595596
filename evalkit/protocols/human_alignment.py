"""Decisions of a classifier on the model-vs-human stimuli, scored as the benchmark scores them
(docs/protocols.md, "Shape bias and human alignment").

- Decision: the classifier's softmax over its own classes; each entry-level category's
  probability is the mean over the classes mapped to it (ImageNet's 1000 → 16 by the
  benchmark's table); the decision is the most probable category.
- OOD accuracy: per condition, the share of decisions that are the image's category; a set's
  value is the mean over its conditions, leaving out those the benchmark leaves out of its
  tables (no distortion, or human accuracy below 0.2); the overall value the mean over sets.
- Against people, per set, condition and observer, on the trials that observer saw:
  accuracy difference (squared), observed consistency and error consistency
  (``evalkit.metrics``); averaged over conditions, then observers, then sets, in that order.
  The same between every pair of observers gives the people's own level, for context.
- Shape bias on cue-conflict (``evalkit.metrics.shape_bias``), overall and per shape category.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from evalkit.errors import EvalkitError
from evalkit.metrics import accuracy_difference, error_consistency, shape_bias
from evalkit.significance import PerImageTest

AGAINST_PEOPLE = ("accuracy_difference", "observed_consistency", "error_consistency")


def category_classes(categories: dict[str, list[str]], classes: list[str]) -> list[list[int]]:
    """For each category (sorted), the positions of its classes among the classifier's."""
    position = {name: i for i, name in enumerate(classes)}
    out = []
    for category in sorted(categories):
        found = [position[c] for c in categories[category] if c in position]
        if not found:
            raise EvalkitError(
                f"the classifier has none of category {category!r}'s classes "
                f"({', '.join(categories[category][:3])}, …): its classes must be ImageNet's "
                "WordNet ids (train the probe on ImageNet class folders)"
            )
        out.append(found)
    return out


def decide(logits: torch.Tensor, groups: list[list[int]]) -> np.ndarray:
    """Each image's category: the largest mean softmax probability over a category's classes."""
    probs = torch.softmax(logits.double(), dim=1)
    scores = torch.stack([probs[:, g].mean(1) for g in groups], dim=1)
    return scores.argmax(1).numpy()


@dataclass
class SetScore:
    """One set's numbers: OOD accuracy per condition and overall, and the mean against people
    (None without human trials), with the people's own level."""

    accuracy: dict[str, float]
    ood_accuracy: float
    against_people: dict[str, float] | None = None
    people: dict[str, float] | None = None
    observers: int = 0
    extra: dict = field(default_factory=dict)


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


def score_set(decisions: np.ndarray, stimuli, trials, excluded=()) -> SetScore:
    """One set's OOD accuracy, and where ``trials`` (a DataFrame, or None) are given its
    metrics against every observer and between observers, over the conditions not
    ``excluded``."""
    categories = stimuli.classes
    truth = np.asarray(stimuli.labels)
    conditions = np.asarray(stimuli.conditions)
    accuracy = {
        c: float(np.mean(decisions[conditions == c] == truth[conditions == c]))
        for c in dict.fromkeys(stimuli.conditions)
    }
    kept = kept_conditions(stimuli.conditions, excluded)
    score = SetScore(accuracy, statistics.mean(accuracy[c] for c in kept))
    if trials is None:
        return score
    answers = _model_answers(decisions, stimuli, categories)
    observers = sorted(trials["subj"].unique())
    model_rows = [_versus(answers, trials, s, kept, stimuli.name) for s in observers]
    score.against_people = _mean_rows(model_rows)
    pairs = [
        _versus(_observer_answers(trials, a), trials, b, kept, stimuli.name)
        for i, a in enumerate(observers)
        for b in observers[i + 1 :]
    ]
    score.people = _mean_rows(pairs) if pairs else None
    score.observers = len(observers)
    return score


def _model_answers(decisions, stimuli, categories) -> dict:
    """(condition, image id) → (response, category)."""
    return {
        (condition, image): (categories[d], categories[label])
        for condition, image, d, label in zip(
            stimuli.conditions, stimuli.image_ids, decisions, stimuli.labels, strict=True
        )
    }


def _observer_answers(trials, observer) -> dict:
    rows = trials[trials["subj"] == observer]
    return {
        (c, i): (r, t)
        for c, i, r, t in zip(
            rows["condition"],
            rows["image_id"],
            rows["object_response"],
            rows["category"],
            strict=True,
        )
    }


def _versus(answers: dict, trials, observer, kept, name: str) -> dict[str, float]:
    """One observer against ``answers`` on the trials the observer saw, per kept condition,
    then averaged over those conditions."""
    rows = trials[(trials["subj"] == observer) & trials["condition"].isin(kept)]
    per_condition = []
    for condition, group in rows.groupby("condition", sort=True):
        keys = list(zip([condition] * len(group), group["image_id"], strict=True))
        missing = [k[1] for k in keys if k not in answers]
        if missing:
            raise EvalkitError(
                f"model-vs-human {name}: {observer}'s trial image {missing[0]} (condition "
                f"{condition}) is not among the set's stimuli: use the datasets/ and raw-data/ "
                "of one benchmark release"
            )
        other = np.array([answers[k][0] == answers[k][1] for k in keys])
        own = (group["object_response"] == group["category"]).to_numpy()
        consistency = error_consistency(other, own)
        per_condition.append(
            {
                "accuracy_difference": accuracy_difference(other.mean(), own.mean()),
                "observed_consistency": consistency["observed"],
                "error_consistency": consistency["kappa"],
            }
        )
    return _mean_rows(per_condition)


def _mean_rows(rows: list[dict]) -> dict[str, float]:
    """The mean of each metric over conditions where it is defined (error consistency is not
    where both observers are perfect); NaN where it is defined in none."""
    return {metric: defined_mean(r[metric] for r in rows) for metric in AGAINST_PEOPLE}


def defined_mean(values) -> float:
    """The mean of the values that are numbers (NaN: undefined, left out); NaN if none is."""
    defined = [v for v in values if not math.isnan(v)]
    return statistics.mean(defined) if defined else math.nan


def cue_conflict(decisions: np.ndarray, stimuli) -> dict:
    """Shape bias overall and per shape category."""
    categories = stimuli.classes
    made = np.array([categories[d] for d in decisions])
    shapes = np.array([categories[label] for label in stimuli.labels])
    textures = np.array(stimuli.textures())
    overall = shape_bias(made, shapes, textures)
    per_category = {
        c: shape_bias(made[shapes == c], shapes[shapes == c], textures[shapes == c])["shape_bias"]
        for c in categories
        if (shapes == c).any()
    }
    return {**overall, "shape_bias_by_category": per_category}


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
