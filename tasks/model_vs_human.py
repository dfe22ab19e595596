"""Shape bias and alignment with human vision on the model-vs-human benchmark (Geirhos et al.;
docs/protocols.md, "Shape bias and human alignment").

The classifier is the backbone's own ImageNet head where it has one (``classifier=own``, or
``auto`` when the backbone keeps a 1000-class head), else evalkit's ImageNet probe on frozen
features (the linear probe of ``imagenet-linear``, refitted on all of train), or with
``finetune=true`` the backbone fine-tuned with a linear classifier. The row says which.
Its decisions over the benchmark's 16 categories (evalkit.protocols.human_alignment) give, per
set of ``sets``: OOD accuracy (per condition in the row's ``extra``); on cue-conflict the shape
bias (overall and per category); and where the data root holds the human trials, accuracy
difference, observed consistency and error consistency against every observer, with the
observers' own level beside them in ``extra``.

``model-vs-human`` scores all 17 sets; ``shape-bias`` cue-conflict alone.

Paper: ViT-22B-384 (fine-tuned) shape bias 0.87 (humans 0.96); on the benchmark's human-likeness
ranking accuracy difference .018, observed consistency .783, error consistency .258, OOD
accuracy ≈ 0.837. Set beside a fine-tuned classifier only (``finetune=true`` or
``classifier=own``), the benchmark-wide numbers only beside all 17 sets.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch

from evalkit.core.task import Metric, Rule, Stage, extraction_stage, setting
from evalkit.data.model_vs_human import (
    SETS,
    categories_of,
    imagenet_wnids,
    read_trials,
)
from evalkit.data.resolve import data_kind, dataset_root, open_dataset
from evalkit.errors import EvalkitError
from evalkit.protocols.classification import predict
from evalkit.protocols.error_tables import human_alignment_tables
from evalkit.protocols.human_alignment import (
    AGAINST_PEOPLE,
    category_classes,
    cue_conflict,
    decide,
    defined_mean,
    score_set,
)
from evalkit.protocols.linear_classifier import LinearClassifier
from evalkit.protocols.paired_tests import EXCLUDED, human_alignment_test
from evalkit.protocols.predictions import image_ids
from evalkit.protocols.scorer import Scorer

STIMULI = "model-vs-human"
SET_NAMES = Rule("model-vs-human set names", lambda v: bool(v) and all(s in SETS for s in v))
CLASSIFIERS = Rule("one of auto, own, probe", lambda v: v in ("auto", "own", "probe"))
PAPER = "ViT-22B-384 (fine-tuned)"


@dataclass(frozen=True)
class ModelVsHuman(LinearClassifier):
    name: str = "model-vs-human"
    sets: tuple[str, ...] = setting(SETS, SET_NAMES)
    classifier: str = setting("auto", CLASSIFIERS)

    version = 1

    @property
    def reference(self) -> dict:
        """The paper's numbers, beside a fine-tuned classifier only (``finetune=true``, or a
        backbone's own head, ``classifier=own``); the benchmark-wide ones beside all 17 sets."""
        if not (self.finetune or self.classifier == "own"):
            return {}  # the paper's numbers are of a fine-tuned ViT-22B at 384 px
        reference = {"shape_bias": {PAPER: 0.87, "humans": 0.96}}
        if set(self.sets) == set(SETS):
            reference |= {
                "ood_accuracy": {PAPER: 0.837},
                "accuracy_difference": {PAPER: 0.018},
                "observed_consistency": {PAPER: 0.783},
                "error_consistency": {PAPER: 0.258},
            }
        return reference

    def metrics(self) -> list[str]:
        """The headline first (what a leaderboard ranks by): OOD accuracy over the sets, or
        shape bias when cue-conflict is the only set."""
        names = ["ood_accuracy"] if len(self.sets) > 1 else []
        if "cue-conflict" in self.sets:
            names += ["shape_bias", "shape_fraction", "texture_fraction"]
        return names + [f"ood_accuracy/{s}" for s in self.sets]  # people's: where trials are

    paired_test = staticmethod(human_alignment_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(human_alignment_tables)  # declared in error_tables.DECLARED too

    def datasets(self) -> tuple[str, ...]:
        return (STIMULI,) if self.classifier == "own" else (self.dataset, STIMULI)

    def reads(self) -> dict[str, dict[str, str]]:
        stimuli = {STIMULI: {s: s for s in self.sets}}
        if self.classifier == "own":
            return stimuli
        return {self.dataset: {self.train_split: self.train_split}, **stimuli}

    def splits(self) -> tuple[str, ...]:
        return (self.train_split, *self.sets)

    def plan(self, inputs) -> list[Stage]:
        stimuli = sum(inputs.sizes.get(s, 0) for s in self.sets)
        if self.classifier == "own":
            return [extraction_stage(inputs, stimuli)]
        train = inputs.sizes.get(self.train_split, 0)
        return [extraction_stage(inputs, train + stimuli, layers=len(self.layers))]

    def lacks(self, backbone) -> str | None:
        if self.classifier == "own" and own_head(backbone) is None:
            return f"{backbone.info.name} has no ImageNet-1k head of its own (classifier=own)"
        return None

    def run(self, backbone, ctx):
        root = dataset_root(data_kind(STIMULI), ctx.data)
        decisions_of, extra = self.classifier_for(backbone, ctx, categories_of(root))
        results, saved = {}, []
        for name in self.sets:
            stimuli, decisions = decisions_of(name)
            trials = read_trials(root, name)
            results[name] = (
                stimuli,
                decisions,
                score_set(decisions, stimuli, trials, EXCLUDED.get(name, ())),
            )
            saved.append(_predictions(stimuli, decisions))
        if ctx.predictions is not None:
            ctx.save_predictions({k: sum((s[k] for s in saved), []) for k in saved[0]})
        yield from self.rows(results, extra)

    def classifier_for(self, backbone, ctx, categories: dict[str, list[str]]):
        """``set name → (stimuli, decisions)`` over ``categories``, and what the classifier is."""
        head = own_head(backbone) if self.classifier != "probe" else None
        if self.classifier == "own" and head is None:
            raise EvalkitError(self.lacks(backbone))
        if head is not None:
            classes, transform = head.classes, backbone.transform()
            extra = {"classifier": f"{backbone.info.name}'s own ImageNet-1k head"}
            groups = category_classes(categories, classes)

            def decisions_of(name):
                stimuli = open_dataset(STIMULI, name, ctx.data, transform=transform)
                logits, _ = predict(head, stimuli, ctx)
                return stimuli, decide(logits, groups)

            return decisions_of, extra
        scorer = Scorer.fit(self, backbone, ctx, refit_all=True)
        groups = category_classes(categories, scorer.classes)

        def decisions_of(name):
            stimuli = open_dataset(STIMULI, name, ctx.data, transform=scorer.transform)
            logits, _ = scorer.score_opened(stimuli, f"{STIMULI}/{name}")
            return stimuli, decide(logits, groups)

        return decisions_of, {**scorer.extra, "probe_data": self.dataset}

    def rows(self, results: dict, extra: dict):
        per_set = {name: score for name, (_, _, score) in results.items()}
        shared = {
            **extra,
            "sets": list(per_set),
            "accuracy_by_condition": {n: s.accuracy for n, s in per_set.items()},
        }
        made = {}
        for name, (stimuli, _, score) in results.items():
            made[f"ood_accuracy/{name}"] = Metric(
                f"ood_accuracy/{name}", score.ood_accuracy, n=len(stimuli), extra=shared
            )
        if len(per_set) > 1:
            value = statistics.mean(s.ood_accuracy for s in per_set.values())
            count = sum(len(st) for st, _, _ in results.values())
            made["ood_accuracy"] = Metric("ood_accuracy", value, n=count, extra=shared)
        if "cue-conflict" in results:
            stimuli, decisions, _ = results["cue-conflict"]
            bias = cue_conflict(decisions, stimuli)
            by_category = {"shape_bias_by_category": bias.pop("shape_bias_by_category")}
            for metric, value in bias.items():
                made[metric] = Metric(
                    metric, value, n=len(stimuli), extra={**shared, **by_category}
                )
        yield from (made[name] for name in self.metrics())
        yield from self.against_people(per_set, shared)

    def against_people(self, per_set: dict, shared: dict):
        """The means over the sets that have human trials, the people's own level beside."""
        judged = {n: s for n, s in per_set.items() if s.against_people is not None}
        if not judged:
            return
        people = [s.people for s in judged.values() if s.people]
        for metric in AGAINST_PEOPLE:
            extra = {
                **shared,
                "sets_with_people": list(judged),
                f"{metric}_by_set": {n: s.against_people[metric] for n, s in judged.items()},
                "people": defined_mean(p[metric] for p in people) if people else None,
                "observers": {n: s.observers for n, s in judged.items()},
            }
            yield Metric(
                metric,
                defined_mean(s.against_people[metric] for s in judged.values()),
                higher_is_better=metric != "accuracy_difference",
                n=len(judged),
                extra=extra,
            )


def _predictions(stimuli, decisions: np.ndarray) -> dict[str, list]:
    names = stimuli.classes
    textures = stimuli.textures() if stimuli.name == "cue-conflict" else [""] * len(stimuli)
    return {
        "image": image_ids(stimuli),
        "set": [stimuli.name] * len(stimuli),
        "condition": list(stimuli.conditions),
        "label": list(stimuli.labels),
        "category": [names[i] for i in stimuli.labels],
        "decision": [names[d] for d in decisions],
        "texture": textures,
        "correct": [bool(d == label) for d, label in zip(decisions, stimuli.labels, strict=True)],
    }


class OwnHead(torch.nn.Module):
    """A backbone's own ImageNet-1k classifier as a module ``predict`` can run."""

    def __init__(self, backbone, classes: list[str]):
        super().__init__()
        self.backbone, self.classes = backbone, classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.imagenet_logits(images)


def own_head(backbone) -> OwnHead | None:
    """The backbone's ImageNet-1k head, when its adapter keeps one."""
    if not getattr(backbone, "has_imagenet_head", False):
        return None
    return OwnHead(backbone, imagenet_wnids())
