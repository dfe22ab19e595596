"""The QK-norm stability ablation (effect-table row 1; docs/protocols.md, "Stability").

The paper: without QK-norm an ~8B ViT diverged after a few thousand steps — the attention
logits grew until attention was one-hot — and with it training was stable. Wortsman et al.
(2023) reproduce the effect in small models at high learning rates. This task trains the same
small model of the built-in family with and without QK-norm at every learning rate of ``lrs``
(AdamW, β2 0.95, warm-up + cosine, clip 1) on a seeded stream of the dataset's training images,
and reports per (variant, LR): the final loss, the largest attention logit at the end and its
growth over training, the last attention entropy, and whether the run diverged; per variant,
the LR sensitivity: the mean over LRs of min(final loss, initial loss) − the best final loss
(a diverged run counts as the initial loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.core.task import NON_NEGATIVE, POSITIVE, POSITIVES, Metric, Rule, Stage, Task, setting
from evalkit.models.vit22b import SIZES, build, config
from evalkit.parallel.sizing import training_flops
from evalkit.protocols.small_training import SIZE, load_images
from evalkit.schedule import declared_schedule
from evalkit.seeds import generator, seeded_build
from evalkit.training.loop import Diverged, fit
from evalkit.training.pretrain import Classifier
from evalkit.training.probes import AttentionStats

VARIANTS = {"qk_norm": True, "no_qk_norm": False}
TRACE_EVERY = 10  # steps between the points of the curves kept in the rows


@dataclass(frozen=True)
class SmallTraining(Task):
    """What the training ablations share: small models of the built-in family trained from
    scratch on a split's images, resized to ``image`` px, with one schedule."""

    name: str = ""
    dataset: str = "imagenet"
    split: str = "train"
    image: int = setting(32, POSITIVE)  # images are resized to this square side
    patch: int = setting(8, POSITIVE)
    steps: int = setting(300, POSITIVE)
    batch_size: int = setting(64, POSITIVE)
    warmup: int = setting(30, NON_NEGATIVE)
    weight_decay: float = setting(1e-4, NON_NEGATIVE)
    z_loss: float = setting(0.0, NON_NEGATIVE)

    version = 2  # 2: batches drawn by evalkit.seeds
    trains_own_model = True

    def splits(self) -> tuple[str, ...]:
        return (self.split,)

    def plan(self, inputs) -> list[Stage]:
        """The task's own models trained from scratch; the backbone is not used."""
        runs = self.runs()
        flops = sum(
            training_flops(self.model_config(size, qk_norm), self.steps * self.batch_size)
            for size, qk_norm in runs
        )
        return [Stage("train ablation models", f"{len(runs)} runs from scratch", flops=flops)]

    def runs(self) -> list[tuple[str, bool]]:
        """(size, QK-norm) of every training run."""
        raise NotImplementedError

    def model_config(self, size: str, qk_norm: bool):
        return config(size, qk_norm=qk_norm, image=self.image, patch=self.patch, pool="gap")


@dataclass(frozen=True)
class QKNormStability(SmallTraining):
    name: str = "qk-norm-stability"
    size: str = setting("test", SIZE)
    lrs: tuple[float, ...] = setting((1e-3, 1e-2, 1e-1, 3e-1), POSITIVES)

    def metrics(self) -> list[str]:
        per_run = [
            f"{m}/{v}/lr={lr:g}"
            for v in VARIANTS
            for lr in self.lrs
            for m in ("final_loss", "max_attention_logit")
        ]
        return per_run + [f"lr_sensitivity/{v}" for v in VARIANTS]

    def runs(self) -> list[tuple[str, bool]]:
        return [(self.size, qk_norm) for qk_norm in VARIANTS.values() for _ in self.lrs]

    def run(self, backbone, ctx):
        """``backbone`` is not used: the task trains its own models."""
        x, y = load_images(self, ctx)
        classes = int(y.max()) + 1
        rows, curves = [], {}
        for variant, qk_norm in VARIANTS.items():
            curves[variant] = {
                lr: _curves(self.train_one(x, y, classes, qk_norm, lr, ctx)) for lr in self.lrs
            }
            rows += list(self.variant_rows(variant, curves[variant], ctx))
        picture = self.plot(curves, ctx)
        for row in rows:
            row.extra["picture"] = picture
            yield row

    def plot(self, curves: dict, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import stability_plot

        return str(stability_plot(curves, Path(ctx.artifacts) / f"{self.name}.png"))

    def train_one(self, x, y, classes: int, qk_norm: bool, lr: float, ctx) -> dict:
        return train_run(self, self.size, (x, y, classes), qk_norm, lr, ctx)

    def variant_rows(self, variant: str, runs: dict, ctx):
        """Rows of one variant from its runs' curves (``_curves``), by learning rate."""
        finals = {lr: min(run["final"], run["initial"]) for lr, run in runs.items()}
        for lr, run in runs.items():
            logits = run["max_logit"] or [math.inf]
            extra = {
                "diverged": run["diverged"],
                "lr": lr,
                "qk_norm": variant == "qk_norm",
                "max_logit_curve": logits[::TRACE_EVERY],
                "loss_curve": run["loss"][::TRACE_EVERY],
                "first_max_logit": logits[0],
                "last_entropy": run["last_entropy"],
                "note": "a diverged run's loss is the initial loss, ln(classes)"
                if run["diverged"]
                else None,
            }
            yield Metric(
                f"final_loss/{variant}/lr={lr:g}",
                run["final"],
                higher_is_better=False,
                extra=extra,
            )
            yield Metric(
                f"max_attention_logit/{variant}/lr={lr:g}",
                logits[-1],
                higher_is_better=False,
                extra=extra,
            )
        sensitivity = sum(finals.values()) / len(finals) - min(finals.values())
        yield Metric(
            f"lr_sensitivity/{variant}",
            sensitivity,
            higher_is_better=False,
            extra={"final_loss_by_lr": {f"{k:g}": v for k, v in finals.items()}},
        )


def train_run(task, size: str, data: tuple, qk_norm: bool, lr: float, ctx) -> dict:
    """One training run of ``size`` with ``task``'s image, patch and schedule settings: its log,
    whether (and how) it diverged, and the loss at chance, ln(classes)."""
    x, y, classes = data
    cfg = task.model_config(size, qk_norm)
    vit = build(cfg, seed=ctx.seed)
    model = seeded_build(lambda: Classifier(vit, classes), ctx.seed, "model-weights")
    stats = AttentionStats(model.vit)
    schedule = declared_schedule(task, ctx.seed, lr=lr)

    def batch(step: int, micro: int):
        pick = torch.randint(
            0, len(y), (task.batch_size,), generator=generator(ctx.seed, "batch", step)
        )
        return x[pick], y[pick]

    log, diverged = [], None
    try:
        log = fit(
            model,
            batch,
            torch.nn.functional.cross_entropy,
            schedule,
            observe=stats.read,
            device=ctx.device,
            progress=ctx.extract.progress,
        )
    except Diverged as exc:
        log, diverged = exc.log, str(exc)
    finally:
        stats.close()
    return {"log": log, "diverged": diverged, "initial_loss": math.log(classes)}


def _curves(run: dict) -> dict:
    """A run's loss and max-logit curves over steps, its final loss (``_final``), its initial
    loss, whether it diverged and its last attention entropy: what rows and plot need."""
    log = run["log"]
    return {
        "steps": [e["step"] for e in log],
        "loss": [e["loss"] for e in log],
        "max_logit": [max(e["max_attention_logit"]) for e in log],
        "final": _final(run),
        "initial": run["initial_loss"],
        "diverged": run["diverged"],
        "last_entropy": log[-1]["attention_entropy"] if log else None,
    }


def _tail_mean(log: list[dict], key: str, tail: int = 10) -> float:
    values = [entry[key] for entry in log[-tail:]]
    return sum(values) / len(values)


@dataclass(frozen=True)
class QKNormLR(SmallTraining):
    """Effect-table row 2: with QK-norm, keep the learning rate at ``lr`` at every size of
    ``sizes`` ("kept") rather than lowering it in proportion to the width, as is usual without
    it ("lowered": ``lr`` × the first size's width / this size's width). Per size: both final
    losses and their difference (positive: keeping the LR trained to a lower loss). The paper's
    own statement of this is not confirmed in public text; the rows say so."""

    name: str = "qk-norm-lr"
    sizes: tuple[str, ...] = setting(
        ("test", "ti"),
        Rule("sizes of the built-in family", lambda v: bool(v) and all(s in SIZES for s in v)),
    )
    lr: float = setting(1e-3, POSITIVE)

    def metrics(self) -> list[str]:
        return [
            f"{m}/{size}"
            for size in self.sizes
            for m in ("final_loss/kept", "final_loss/lowered", "gain")
        ]

    def runs(self) -> list[tuple[str, bool]]:
        return [(size, True) for size in self.sizes for _ in ("kept", "lowered")]

    def run(self, backbone, ctx):
        """``backbone`` is not used: the task trains its own models."""
        x, y = load_images(self, ctx)
        data = (x, y, int(y.max()) + 1)
        base = SIZES[self.sizes[0]][0]
        note = "the paper's claim (keep LR 1e-3 with QK-norm up to ViT-L) is not confirmed in public text"
        rows, finals = [], {}
        for size in self.sizes:
            lrs = {"kept": self.lr, "lowered": self.lr * base / SIZES[size][0]}
            finals[size] = {}
            for variant, lr in lrs.items():
                run = train_run(self, size, data, True, lr, ctx)
                finals[size][variant] = _final(run)
                extra = {
                    "lr": lr,
                    "width": SIZES[size][0],
                    "diverged": run["diverged"],
                    "note": note,
                }
                rows.append(
                    Metric(
                        f"final_loss/{variant}/{size}",
                        finals[size][variant],
                        higher_is_better=False,
                        extra=extra,
                    )
                )
            rows.append(
                Metric(
                    f"gain/{size}",
                    finals[size]["lowered"] - finals[size]["kept"],
                    extra={"lrs": lrs, "note": note},
                )
            )
        picture = self.plot(finals, ctx)
        for row in rows:
            row.extra["picture"] = picture
            yield row

    def plot(self, finals: dict, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import lr_scaling_plot

        widths = {size: SIZES[size][0] for size in finals}
        return str(lr_scaling_plot(finals, widths, Path(ctx.artifacts) / f"{self.name}.png"))


def _final(run: dict) -> float:
    """The mean loss of the last steps, or the loss at chance when the run diverged."""
    return (
        run["initial_loss"] if run["diverged"] or not run["log"] else _tail_mean(run["log"], "loss")
    )
