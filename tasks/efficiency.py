"""The efficiency ablations (effect-table rows 3 and 4; docs/protocols.md, "Efficiency").

The paper: omitting the QKV and LayerNorm biases raised accelerator utilisation by ~3%, and
parallel attention + MLP blocks trained ~15% faster, neither at a loss of quality. Each task
builds two variants of the same model of the built-in family that differ only in that switch
(``bias-efficiency``: LayerNorms and QKV with biases vs without, both centred LayerNorms;
``parallel-efficiency``: parallel vs sequential blocks), measures their training throughput
interleaved — ``rounds`` alternating timings of ``timed_steps`` optimizer steps each, after one
untimed warm-up round, the median kept — and trains both for ``steps`` on the same seeded
batches to compare quality after the same budget.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.models.vit22b import build, config
from evalkit.task import NON_NEGATIVE, POSITIVE, Metric, Task, one_of, setting
from evalkit.training.loop import Schedule, fit, make_optimizer, train_step
from evalkit.training.pretrain import Classifier

from .stability import SIZE, load_images

VARIANTS = {
    "biases": {"without": {"qkv_bias": False, "ln_bias": False, "norm": "layer"},
               "with": {"qkv_bias": True, "ln_bias": True, "norm": "layer"}},
    "parallel": {"parallel": {"parallel": True}, "sequential": {"parallel": False}},
}  # fmt: skip
PAPER = {
    "biases": "~+3% utilisation without biases",
    "parallel": "~15% faster with parallel blocks",
}


@dataclass(frozen=True)
class EfficiencyAblation(Task):
    name: str = "parallel-efficiency"
    switch: str = setting("parallel", one_of(*VARIANTS))
    dataset: str = "imagenet"
    split: str = "train"
    size: str = setting("ti", SIZE)
    image: int = setting(64, POSITIVE)
    patch: int = setting(8, POSITIVE)
    batch_size: int = setting(32, POSITIVE)
    rounds: int = setting(5, POSITIVE)
    timed_steps: int = setting(5, POSITIVE)
    steps: int = setting(100, POSITIVE)  # the quality budget
    lr: float = setting(1e-3, POSITIVE)
    warmup: int = setting(10, NON_NEGATIVE)

    version = 1
    trains_own_model = True

    def splits(self) -> tuple[str, ...]:
        return (self.split,)

    def metrics(self) -> list[str]:
        names = list(VARIANTS[self.switch])
        return [f"{m}/{v}" for v in names for m in ("images_per_s", "final_loss")] + ["speedup"]

    def run(self, backbone, ctx):
        """``backbone`` is not used: the task trains its own models."""
        x, y = load_images(self, ctx)
        classes = int(y.max()) + 1
        schedule = Schedule(steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup=self.warmup,
                            seed=ctx.seed)  # fmt: skip

        def batch(step: int, micro: int):
            pick = torch.randint(
                0, len(y), (self.batch_size,), generator=torch.Generator().manual_seed(step)
            )
            return x[pick], y[pick]

        names = list(VARIANTS[self.switch])
        rates = self.throughput(names, classes, schedule, batch, ctx)
        losses = {name: self.quality(name, classes, schedule, batch, ctx) for name in names}
        first, second = names
        extra = {"rounds": self.rounds, "timed_steps": self.timed_steps, "device": ctx.extract.device,
                 "paper": PAPER[self.switch], "size": self.size, "image": self.image,
                 "picture": self.plot(rates, losses, ctx)}  # fmt: skip
        for name in names:
            yield Metric(f"images_per_s/{name}", statistics.median(rates[name]), seeds=[ctx.seed],
                         extra={**extra, "per_round": rates[name]})  # fmt: skip
            yield Metric(
                f"final_loss/{name}",
                losses[name],
                higher_is_better=False,
                seeds=[ctx.seed],
                extra=extra,
            )
        speedup = statistics.median(rates[first]) / statistics.median(rates[second])
        yield Metric(
            "speedup", speedup, seeds=[ctx.seed], extra={**extra, "ratio": f"{first} / {second}"}
        )

    def plot(self, rates: dict, losses: dict, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import throughput_plot

        return str(
            throughput_plot(rates, losses, self.name, Path(ctx.artifacts) / f"{self.name}.png")
        )

    def model(self, name: str, classes: int, seed: int) -> torch.nn.Module:
        cfg = config(self.size, image=self.image, patch=self.patch, **VARIANTS[self.switch][name])
        torch.manual_seed(seed)
        return Classifier(build(cfg, seed=seed), classes)

    def throughput(
        self, names, classes: int, schedule: Schedule, batch, ctx
    ) -> dict[str, list[float]]:
        """Images per second of each variant, timed in alternation so drift hits both."""
        loss = torch.nn.functional.cross_entropy
        state = {}
        for name in names:
            model = self.model(name, classes, ctx.seed).to(ctx.extract.device).train()
            state[name] = (model, make_optimizer(model, schedule))
        rates = {name: [] for name in names}
        for round_ in range(self.rounds + 1):
            for name in names:
                model, optimizer = state[name]
                start = time.perf_counter()
                for step in range(self.timed_steps):
                    train_step(
                        model, optimizer, batch, loss, schedule, step, ctx.extract.device, None
                    )
                if round_:  # the first round warms caches and allocators
                    rates[name].append(
                        self.timed_steps * self.batch_size / (time.perf_counter() - start)
                    )
        return rates

    def quality(self, name: str, classes: int, schedule: Schedule, batch, ctx) -> float:
        model = self.model(name, classes, ctx.seed).to(ctx.extract.device)
        log = fit(model, batch, torch.nn.functional.cross_entropy, schedule, device=ctx.extract.device,
                  progress=ctx.extract.progress)  # fmt: skip
        return sum(e["loss"] for e in log[-10:]) / len(log[-10:])
