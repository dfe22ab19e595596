"""Calibration of a classifier on the backbone, on clean ImageNet and on ImageNet-C
(effect-table row 11; docs/protocols.md, "Calibration").

The classifier is the linear probe on frozen features by default (its L2 chosen on a 20%
hold-out of train as ``imagenet-linear`` does, then refitted on the other 80%), or, with
``--set finetune=true``, the backbone fine-tuned with a linear classifier on those 80%, as the
paper's numbers were measured. A temperature is fitted on the held-out 20% by NLL; every
score is given without it (``ece``) and with it (``ece_ts``). Metrics: ECE over 15
equal-width bins of top-1 confidence (and over equal-mass bins), NLL, Brier score, top-1.

``imagenet-ece`` scores ImageNet val. ``imagenet-c-ece`` also scores every corruption ×
severity of ImageNet-C: ECE per (corruption, severity) in the rows' ``extra``, averaged over
the corruptions per severity (``ece/s<k>``) and then over severities (``ece/mean``). Both
write a reliability diagram (accuracy against confidence per bin, with counts) beside the rows.

Paper: ECE ViT-L/32 0.05 → ViT-22B 0.01, fine-tuned at 384 px (Plex's benchmark; whether clean
or corrupted data is unconfirmed): set beside fine-tuned runs only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from evalkit.core.task import Metric, Rule, Stage, extraction_stage, setting
from evalkit.data.corrupted import split_name
from evalkit.data.corruptions import NAMES, SEVERITIES
from evalkit.metrics import ECE_BINS, ece_bootstrap_stderr, topk_hits
from evalkit.protocols.calibration import (
    brier_score,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    reliability,
)
from evalkit.protocols.classification import percent
from evalkit.protocols.error_tables import classification_tables
from evalkit.protocols.linear_classifier import LinearClassifier
from evalkit.protocols.paired_tests import calibration_test
from evalkit.protocols.predictions import class_name, image_ids
from evalkit.protocols.scorer import Scorer

PAPER_ECE = {"ViT-22B (fine-tuned, 384 px)": 0.01, "ViT-L/32 (Plex)": 0.05}
CORRUPTION_NAMES = Rule(
    "ImageNet-C corruption names", lambda v: bool(v) and all(c in NAMES for c in v)
)
SEVERITY_LEVELS = Rule("severities from 1 to 5", lambda v: bool(v) and set(v) <= set(SEVERITIES))


@dataclass(frozen=True)
class Calibration(LinearClassifier):
    name: str = "imagenet-ece"
    corrupted: bool = False  # imagenet-c-ece: score ImageNet-C too
    bins: int = setting(ECE_BINS, Rule("at least 2 bins", lambda v: v >= 2))
    corruptions: tuple[str, ...] = setting(NAMES, CORRUPTION_NAMES)
    severities: tuple[int, ...] = setting(SEVERITIES, SEVERITY_LEVELS)

    version = 3  # 2: ImageNet-C stand-in, noise drawn by evalkit.seeds; 3: per-image ids, names

    paired_test = staticmethod(calibration_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(classification_tables)  # declared in error_tables.DECLARED too

    @property
    def reference(self) -> dict:
        if not self.finetune:
            return {}  # the paper's ECE is of a fine-tuned classifier
        return {"ece/mean" if self.corrupted else "ece": PAPER_ECE}

    def metrics(self) -> list[str]:
        clean = ["ece", "ece_ts", "ece_mass", "nll", "nll_ts", "brier", "top1"]
        if not self.corrupted:
            return clean
        per_severity = [f"{m}/s{s}" for s in self.severities for m in ("ece", "ece_ts", "top1")]
        return [f"{m}/clean" for m in clean] + [
            "ece/mean",
            "ece_ts/mean",
            "top1/mean",
            "nll/mean",
            *per_severity,
        ]

    def datasets(self) -> tuple[str, ...]:
        return (self.dataset, "imagenet-c") if self.corrupted else (self.dataset,)

    def reads(self) -> dict[str, dict[str, str]]:
        reads = {
            self.dataset: {self.train_split: self.train_split, self.eval_split: self.eval_split}
        }
        if self.corrupted:
            splits = [split_name(c, s) for c in self.corruptions for s in self.severities]
            reads["imagenet-c"] = {split: split for split in splits}
        return reads

    def plan(self, inputs) -> list[Stage]:
        """The classifier's stages, and every corrupted set scored by it."""
        stages = super().plan(inputs)
        corrupted = sum(
            n
            for split, n in inputs.sizes.items()
            if split not in (self.train_split, self.eval_split)
        )
        if self.finetune:
            stages[-1].forward_passes += corrupted
            return stages
        return [
            *stages,
            replace(extraction_stage(inputs, corrupted), name="extract corrupted sets"),
        ]

    def run(self, backbone, ctx):
        scorer = Scorer.fit(self, backbone, ctx)
        temperature = fit_temperature(*scorer.held_out)
        extra = {**scorer.extra, "temperature": temperature, "bins": self.bins}
        clean_set = scorer.opened(self.dataset, self.eval_split)
        clean_logits, clean_labels = scorer.score_opened(clean_set, self.eval_split)
        clean = scores(clean_logits, clean_labels, temperature, self.bins)
        save_confidences(ctx, (clean_logits, clean_labels), clean_set, temperature, self.bins)
        noise = {
            "clean": ece_bootstrap_stderr(torch.softmax(clean_logits, 1), clean_labels, self.bins)
        }
        diagrams = {"clean": reliability(torch.softmax(clean_logits, 1), clean_labels, self.bins)}
        if not self.corrupted:
            extra["picture"] = self.plot(diagrams, backbone, ctx)
            for metric, value in clean.items():
                stderr = noise["clean"] if metric == "ece" else None
                yield self.metric(metric, value, len(clean_labels), ctx, extra, stderr)
            return
        by_set, sizes = {}, {}
        for corruption in self.corruptions:
            for severity in self.severities:
                logits, labels = scorer.score("imagenet-c", split_name(corruption, severity))
                by_set[(corruption, severity)] = scores(logits, labels, temperature, self.bins)
                noise[(corruption, severity)] = ece_bootstrap_stderr(
                    torch.softmax(logits, 1), labels, self.bins
                )
                sizes[(corruption, severity)] = len(labels)
                diagrams[f"{corruption}/{severity}"] = reliability(
                    torch.softmax(logits, 1), labels, self.bins
                )
        extra["ece_by_corruption"] = {f"{c}/{s}": v["ece"] for (c, s), v in by_set.items()}
        extra["picture"] = self.plot(diagrams, backbone, ctx)
        counts = {s: sum(n for (_, sev), n in sizes.items() if sev == s) for s in self.severities}
        for metric, value in corrupted_summary(by_set, self.severities, clean).items():
            level = metric.rpartition("/s")[2]
            n = (
                len(clean_labels)
                if metric.endswith("/clean")
                else (counts[int(level)] if level.isdigit() else sum(counts.values()))
            )
            yield self.metric(metric, value, n, ctx, extra, ece_noise(metric, noise))

    def metric(self, name: str, value: float, n: int, ctx, extra: dict, stderr=None) -> Metric:
        lower = not name.startswith("top1")
        return Metric(
            name,
            value,
            higher_is_better=not lower,
            stderr=stderr,
            n=n,
            extra=extra,
        )

    def plot(self, diagrams: dict, backbone, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import reliability_plot

        slug = f"{self.name}--{backbone.info.name}".replace("/", "_")
        return str(reliability_plot(diagrams, Path(ctx.artifacts) / f"{slug}.png"))


def save_confidences(ctx, scored: tuple, dataset, temperature, bins: int):
    """Per clean eval image (``--save-predictions``): its id (its path under the data root, as
    the classification files name it), its label and top-1 class with their names, its top-1
    confidence, raw and temperature scaled, and whether top-1 is right: what the ECEs are
    recomputed from (``bins`` wide). ``scored``: the images' logits and labels."""
    if ctx.predictions is None:
        return
    logits, labels = scored
    confidence, predicted = torch.softmax(logits, 1).max(dim=1)  # as ``scores`` computes them
    scaled = torch.softmax(logits / temperature, 1).max(dim=1).values
    ids, names = image_ids(dataset), list(getattr(dataset, "classes", []))
    ctx.save_predictions(
        {
            "image": ids if len(ids) == len(labels) else [str(i) for i in range(len(labels))],
            "label": labels.tolist(),
            "label_name": [class_name(names, i) for i in labels.tolist()],
            "prediction": predicted.tolist(),
            "prediction_name": [class_name(names, i) for i in predicted.tolist()],
            "correct": (predicted == labels).tolist(),
            "confidence": confidence.tolist(),
            "confidence_ts": scaled.tolist(),
            "bins": [bins] * len(labels),
        }
    )


def scores(logits: torch.Tensor, labels: torch.Tensor, temperature: float, bins: int) -> dict:
    probs, scaled = torch.softmax(logits, 1), torch.softmax(logits / temperature, 1)
    return {
        "ece": expected_calibration_error(probs, labels, bins),
        "ece_ts": expected_calibration_error(scaled, labels, bins),
        "ece_mass": expected_calibration_error(probs, labels, bins, scheme="mass"),
        "nll": negative_log_likelihood(logits, labels),
        "nll_ts": negative_log_likelihood(logits / temperature, labels),
        "brier": brier_score(probs, labels),
        "top1": percent(topk_hits(logits, labels, 1)),
    }


def ece_noise(metric: str, noise: dict) -> float | None:
    """The standard error of an ECE summary: a set's own by bootstrap over its images; for a
    mean over sets, the mean of theirs — the bound for sets that share their images (the
    corrupted sets are the same images), never smaller than the truth."""
    if not metric.startswith("ece/"):
        return None
    level = metric.removeprefix("ece/")
    if level == "clean":
        return noise["clean"]
    sets = [
        v for k, v in noise.items() if k != "clean" and (level == "mean" or f"s{k[1]}" == level)
    ]
    return statistics.mean(sets) if sets else None


def corrupted_summary(by_set: dict, severities, clean: dict) -> dict:
    """Per severity the mean over corruptions; then the mean over severities."""
    out = {f"{m}/clean": v for m, v in clean.items()}
    for metric in ("ece", "ece_ts", "top1", "nll"):
        per = {
            s: statistics.mean(v[metric] for (_, sev), v in by_set.items() if sev == s)
            for s in severities
        }
        if metric != "nll":
            out |= {f"{metric}/s{s}": value for s, value in per.items()}
        out[f"{metric}/mean"] = statistics.mean(per.values())
    return out
