"""The efficiency ablations (effect-table rows 3 and 4; docs/protocols.md, "Efficiency").

The paper: omitting the QKV and LayerNorm biases raised accelerator utilisation by ~3%, and
parallel attention + MLP blocks trained ~15% faster, neither at a loss of quality. Each task
builds two variants of the same model of the built-in family that differ only in that switch
(``bias-efficiency``: LayerNorms and QKV with biases vs without, both centred LayerNorms;
``parallel-efficiency``: parallel vs sequential blocks), measures their training throughput
interleaved — ``rounds`` alternating timings of ``timed_steps`` optimizer steps each, after one
untimed warm-up round; the speedup is the median of the rounds' ratios, with their spread and
standard error, since on a shared machine one round can be 20% off another — and trains both
for ``steps`` on the same seeded batches to compare quality after the same budget.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.core.task import NON_NEGATIVE, POSITIVE, Metric, Stage, Task, one_of, setting
from evalkit.device import peak_tflops
from evalkit.models.vit22b import build, config
from evalkit.parallel.sizing import training_flops
from evalkit.protocols.small_training import SIZE, load_images
from evalkit.schedule import Schedule, declared_schedule
from evalkit.seeds import generator, seed_global
from evalkit.training.loop import fit, make_optimizer, train_step
from evalkit.training.pretrain import Classifier

VARIANTS = {
    "biases": {
        "without": {"qkv_bias": False, "ln_bias": False, "norm": "layer"},
        "with": {"qkv_bias": True, "ln_bias": True, "norm": "layer"},
    },
    "parallel": {"parallel": {"parallel": True}, "sequential": {"parallel": False}},
}
# Dense bf16 peak TFLOP/s by device name, for model FLOPs utilisation (vendors' data sheets).
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
    peak_tflops: float = setting(0.0, NON_NEGATIVE)  # 0: the device's, where it is known

    version = 3  # 3: batches drawn by evalkit.seeds (they ignored the seed); 2: median speedup
    trains_own_model = True

    def splits(self) -> tuple[str, ...]:
        return (self.split,)

    def plan(self, inputs) -> list[Stage]:
        """Both variants trained for the quality budget and timed for ``rounds``; the backbone
        is not used."""
        images = (self.steps + self.rounds * self.timed_steps) * self.batch_size
        flops = sum(training_flops(self.model_config(n), images) for n in VARIANTS[self.switch])
        return [Stage("train and time both variants", "from scratch", flops=flops)]

    def metrics(self) -> list[str]:
        names = list(VARIANTS[self.switch])
        return [f"{m}/{v}" for v in names for m in ("images_per_s", "final_loss")] + ["speedup"]

    def run(self, backbone, ctx):
        """``backbone`` is not used: the task trains its own models."""
        x, y = load_images(self, ctx)
        classes = int(y.max()) + 1
        schedule = declared_schedule(self, ctx.seed)

        def batch(step: int, micro: int):
            pick = torch.randint(
                0, len(y), (self.batch_size,), generator=generator(ctx.seed, "batch", step)
            )
            return x[pick], y[pick]

        names = list(VARIANTS[self.switch])
        rates = self.throughput(names, classes, schedule, batch, ctx)
        losses = {name: self.quality(name, classes, schedule, batch, ctx) for name in names}
        first, second = names
        extra = {
            "rounds": self.rounds,
            "timed_steps": self.timed_steps,
            "device": ctx.device,
            "paper": PAPER[self.switch],
            "size": self.size,
            "image": self.image,
            "picture": self.plot(rates, losses, ctx),
        }
        for name in names:
            rate = statistics.median(rates[name])
            yield Metric(
                f"images_per_s/{name}",
                rate,
                extra={**extra, "per_round": rates[name], **self.utilisation(name, rate, ctx)},
            )
            yield Metric(
                f"final_loss/{name}",
                losses[name],
                higher_is_better=False,
                extra=extra,
            )
        # Rounds alternate the variants, so each round's ratio cancels the machine's drift
        ratios = [a / b for a, b in zip(rates[first], rates[second], strict=True)]
        spread = statistics.stdev(ratios) if len(ratios) > 1 else None
        yield Metric(
            "speedup",
            statistics.median(ratios),
            std=spread,
            stderr=spread / math.sqrt(len(ratios)) if spread is not None else None,
            n=len(ratios),
            extra={**extra, "ratio": f"{first} / {second}", "per_round": ratios},
        )

    def plot(self, rates: dict, losses: dict, ctx) -> str | None:
        if ctx.artifacts is None:
            return None
        from evalkit.plots import throughput_plot

        return str(
            throughput_plot(rates, losses, self.name, Path(ctx.artifacts) / f"{self.name}.png")
        )

    def model_config(self, name: str):
        return config(self.size, image=self.image, patch=self.patch, **VARIANTS[self.switch][name])

    def model(self, name: str, classes: int, seed: int) -> torch.nn.Module:
        seed_global(seed, "model-weights")
        return Classifier(build(self.model_config(name), seed=seed), classes)

    def utilisation(self, name: str, images_per_s: float, ctx) -> dict:
        """Model FLOPs utilisation: training FLOPs done per second (3× the forward pass's, the
        usual count) over the device's dense bf16 peak; measured on GPUs only."""
        from evalkit.parallel.sizing import forward_flops

        device = ctx.device
        peak = self.peak_tflops or peak_tflops(device)
        if not peak:
            why = "no GPU" if not device.startswith("cuda") else "peak unknown: --set peak_tflops"
            return {"mfu": None, "mfu_note": f"not measured ({why})"}
        achieved = images_per_s * 3 * forward_flops(self.model_config(name))
        return {"mfu": achieved / (peak * 1e12), "peak_tflops": peak}

    def throughput(
        self, names, classes: int, schedule: Schedule, batch, ctx
    ) -> dict[str, list[float]]:
        """Images per second of each variant, timed in alternation so drift hits both."""
        loss = torch.nn.functional.cross_entropy
        state = {}
        for name in names:
            model = self.model(name, classes, ctx.seed).to(ctx.device).train()
            state[name] = (model, make_optimizer(model, schedule))
        rates = {name: [] for name in names}
        for round_ in range(self.rounds + 1):
            for name in names:
                model, optimizer = state[name]
                start = time.perf_counter()
                for step in range(self.timed_steps):
                    train_step(model, optimizer, batch, loss, schedule, step, ctx.device, None)
                if torch.device(ctx.device).type == "cuda":
                    torch.cuda.synchronize(ctx.device)  # the steps' kernels, not their launch
                if round_:  # the first round warms caches and allocators
                    rates[name].append(
                        self.timed_steps * self.batch_size / (time.perf_counter() - start)
                    )
        return rates

    def quality(self, name: str, classes: int, schedule: Schedule, batch, ctx) -> float:
        model = self.model(name, classes, ctx.seed).to(ctx.device)
        log = fit(
            model,
            batch,
            torch.nn.functional.cross_entropy,
            schedule,
            device=ctx.device,
            progress=ctx.extract.progress,
        )
        return sum(e["loss"] for e in log[-10:]) / len(log[-10:])
