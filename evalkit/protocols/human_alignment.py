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

The conditions left out (``EXCLUDED``, compared by ``kept_conditions``) and the paired tests of
OOD accuracy and shape bias are in ``evalkit.protocols.paired_tests``, which imports no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from evalkit.errors import EvalkitError
from evalkit.metrics import accuracy_difference, error_consistency, shape_bias
from evalkit.protocols.paired_tests import kept_conditions

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
