"""Fairness under a demographic-parity constraint on CelebA (the paper's fairness evaluation;
docs/protocols.md, "Fairness").

A binary linear head (logistic regression, its L2 chosen on a seeded hold-out of train as
``imagenet-linear`` chooses it, then refitted on all of train) reads frozen features of the
aligned faces and predicts the target attribute (``Smiling`` or ``Attractive``). Its scores
are then post-processed, per demographic-parity level ε of ``levels``, to subgroup-specific
randomised thresholds whose selection rates differ by at most ε (evalkit.heads.fairness),
fitted on the ``valid`` partition and applied to ``test``. Sensitive attribute: ``Male``
(binary sex, as annotated).

Rows, on test: ``accuracy``, ``accuracy/<subgroup>`` and ``parity_gap`` of the head as it is;
then the same at each level (``accuracy@0.05`` …), expected values under the thresholds'
randomness. The gap achieved on test can exceed ε a little: the thresholds meet ε on valid.
A plot of accuracy against the constraint is written beside the rows (and for many backbones
by ``evalkit leaderboard``).

Paper: accuracy improves with scale at every level of the constraint and the gap between
subgroups shrinks; it gives curves, not numbers, so no reference is set beside these rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evalkit.cache.settings import FeatureRequest
from evalkit.core.task import (
    POSITIVE,
    Metric,
    Rule,
    Stage,
    extraction_stage,
    one_of,
    resolve_pool,
    setting,
)
from evalkit.data.resolve import open_dataset
from evalkit.heads.debias import fit_rto
from evalkit.heads.fairness import expected_accuracy, fit_parity, parity_gap
from evalkit.heads.linear import fit_logistic
from evalkit.protocols.classification import ProbeData, stratified_holdout
from evalkit.protocols.error_tables import fairness_tables
from evalkit.protocols.linear_classifier import FrozenLinearClassifier
from evalkit.seeds import numpy_generator

LEVELS = Rule(
    "a non-empty list of parity levels in [0, 1]", lambda v: bool(v) and all(0 <= x <= 1 for x in v)
)


def subgroups(group: str) -> dict[int, str]:
    """Names of the subgroups an attribute's values 0 and 1 (CelebA's -1 and 1) make."""
    if group == "Male":
        return {0: "female", 1: "male"}
    return {0: f"not_{group.lower()}", 1: group.lower()}


@dataclass(frozen=True)
class Fairness(FrozenLinearClassifier):
    name: str = "celeba-fairness-smiling"
    error_tables = staticmethod(fairness_tables)  # declared in error_tables.DECLARED too
    dataset: str = "celeba"
    attribute: str = "Smiling"  # the target attribute
    group: str = "Male"
    train_split: str = "train"
    fit_split: str = "valid"  # where the thresholds are fitted
    eval_split: str = "test"
    levels: tuple[float, ...] = setting((0.0, 0.01, 0.02, 0.05, 0.1, 0.2), LEVELS)
    # rto: the paper's randomized threshold optimizer (label-free, anchored at the mean
    # score); labelled: the accuracy-optimal post-processing on labels (Hardt et al. 2016)
    debiaser: str = setting("rto", one_of("rto", "labelled"))
    rto_gamma: float = setting(0.05, POSITIVE)  # RTO's randomised band, on scores in [-1, 1]

    version = 2  # 2: the paper's debiaser (RTO) by default; accuracy rows with their intervals

    def metrics(self) -> list[str]:
        return [
            f"{metric}{suffix}"
            for suffix in ["", *(f"@{level:g}" for level in self.levels)]
            for metric in ("accuracy", *self.subgroup_metrics(), "parity_gap")
        ]

    def subgroup_metrics(self) -> list[str]:
        return [f"accuracy/{name}" for name in subgroups(self.group).values()]

    def splits(self) -> tuple[str, ...]:
        return (self.train_split, self.fit_split, self.eval_split)

    def plan(self, inputs) -> list[Stage]:
        rows = sum(inputs.sizes.get(s, 0) for s in self.splits())
        return [extraction_stage(inputs, rows, layers=len(self.layers))]

    def run(self, backbone, ctx):
        request = FeatureRequest(layers=self.layers, pool=resolve_pool(self.pool, backbone))
        view = self.transform(backbone, ctx)
        parts = {
            split: self.features(split, view, backbone, request, ctx) for split in self.splits()
        }
        train = parts[self.train_split][0]
        fit_idx, held_idx = stratified_holdout(train.labels, self.holdout, seed=ctx.seed)
        data = ProbeData.build(train, None, self, ctx.device, 2)
        l2, init, sweep, _ = self.select_l2(data, fit_idx, held_idx, 2)
        model = fit_logistic(
            data.train_rows(), None, num_classes=2, l2=l2, init=init, max_iter=self.refit_max_iter
        )
        scores = {s: _positive_scores(model, data.rows_of(f)) for s, (f, _) in parts.items()}
        faces = parts[self.fit_split][1], parts[self.eval_split][1]
        extra = {
            "classifier": "logistic regression on frozen features",
            "l2": l2,
            "holdout_accuracy_by_l2": sweep,
            "target": self.attribute,
            "group": self.group,
            "thresholds_fitted_on": self.fit_split,
            "n_train": len(train),
        }
        yield from self.rows(scores, faces, extra, ctx, backbone)

    def features(self, split, view, backbone, request, ctx):
        """A split's features with its target as labels, and the split's reader."""
        faces = open_dataset(
            self.dataset, split, ctx.data, transform=view, target=self.attribute, group=self.group
        )
        feats = ctx.features(backbone, faces, split=split, request=request)
        feats.labels = torch.as_tensor(faces.targets)[feats.labels]  # items are (image, index)
        return feats, faces

    def rows(self, scores: dict, faces: tuple, extra: dict, ctx, backbone):
        """Per level, the thresholds fitted on ``faces[0]`` and their outcome on ``faces[1]``."""
        fitted, tested = faces
        test, targets, groups = scores[self.eval_split], tested.targets, tested.groups
        names = subgroups(self.group)
        positives = {"unconstrained": (test > 0.5).astype(float)}
        rules = {}
        for level in self.levels:
            rule = self.debias(scores[self.fit_split], fitted, level)
            rules[f"{level:g}"] = {names[g]: rate for g, rate in rule.rates.items()}
            positives[level] = rule.positive_probability(test, groups)
        curves = {key: _outcome(p, targets, groups, names) for key, p in positives.items()}
        save_outcomes(ctx, tested, test, positives)
        extra = {**extra, "selection_rates_by_level": rules, "debiaser": self.debiaser_name()}
        extra["picture"] = self.plot(curves, backbone, ctx)
        for key, outcome in curves.items():
            suffix = "" if key == "unconstrained" else f"@{key:g}"
            right = np.where(targets == 1, positives[key], 1 - positives[key])
            for metric, value in outcome.items():
                spread = {}
                if metric == "accuracy":  # each point of the curve with its interval
                    spread = accuracy_spread(right, ctx.seed)
                yield Metric(
                    f"{metric}{suffix}",
                    value,
                    higher_is_better=metric != "parity_gap",
                    n=len(targets),
                    stderr=spread.pop("stderr", None),
                    extra={**extra, **spread},
                )

    def debiaser_name(self) -> str:
        if self.debiaser == "rto":
            return (
                f"randomized threshold optimizer (Alabdulmohsin & Lucic 2021), γ={self.rto_gamma:g}"
            )
        return "labelled post-processing (Hardt et al. 2016)"

    def debias(self, scores: np.ndarray, fitted, level: float):
        """The rule that holds the subgroups' selection rates within ``level`` of each other
        where it is fitted: RTO from the scores alone, or the labelled post-processing."""
        if self.debiaser == "rto":
            return fit_rto(scores, fitted.groups, level, self.rto_gamma)
        return fit_parity(scores, fitted.targets, fitted.groups, level)

    def plot(self, curves: dict, backbone, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import parity_plot

        levels = {k: v for k, v in curves.items() if k != "unconstrained"}
        series = {backbone.info.name: {lv: out["accuracy"] for lv, out in levels.items()}}
        slug = f"{self.name}--{backbone.info.name}".replace("/", "_")
        return str(parity_plot(series, self.attribute, Path(ctx.artifacts) / f"{slug}.png"))


INTERVAL_RESAMPLES = 1000


def accuracy_spread(right: np.ndarray, seed: int) -> dict:
    """The expected accuracy's uncertainty over test images: its standard error, and a 95%
    percentile interval from a bootstrap of the images (as fairlearn's ``MetricFrame`` with
    ``n_boot`` draws them), seeded by the job."""
    rng = numpy_generator(seed, "fairness-interval")
    means = np.empty(INTERVAL_RESAMPLES)
    for start in range(0, INTERVAL_RESAMPLES, 100):
        draws = rng.integers(0, len(right), size=(min(100, INTERVAL_RESAMPLES - start), len(right)))
        means[start : start + len(draws)] = right[draws].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "stderr": float(right.std(ddof=1) / np.sqrt(len(right))),
        "interval95": [float(low), float(high)],
        "interval_method": f"bootstrap over {len(right)} test images, {INTERVAL_RESAMPLES} draws",
    }


def save_outcomes(ctx, faces, scores: np.ndarray, positives: dict):
    """Per test image (``--save-predictions``): its score, and its expected correctness as it
    is (``accuracy``) and at each level (``accuracy@<ε>``), whose means are the rows."""
    right = {
        "accuracy" if key == "unconstrained" else f"accuracy@{key:g}": np.where(
            faces.targets == 1, p, 1 - p
        ).tolist()
        for key, p in positives.items()
    }
    ctx.save_predictions(
        {
            "image": list(faces.images),
            "target": faces.targets.tolist(),
            "group": faces.groups.tolist(),
            "score": scores.tolist(),
            **right,
        }
    )


def _positive_scores(model, rows) -> np.ndarray:
    """P(target) of every row, in float64."""
    parts = [torch.softmax(model.logits(x).double(), 1)[:, 1].cpu() for x, _ in rows.chunks()]
    return torch.cat(parts).numpy()


def _outcome(positive, targets, groups, names: dict[int, str]) -> dict[str, float]:
    """Expected accuracy overall and per subgroup, and the parity gap, of ``positive``."""
    accuracy = expected_accuracy(positive, targets, groups)
    out = {"accuracy": accuracy["all"]}
    out |= {f"accuracy/{name}": accuracy[g] for g, name in names.items() if g in accuracy}
    out["parity_gap"] = parity_gap(positive, groups)
    return out
