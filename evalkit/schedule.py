"""The one training schedule, for heads on frozen features and for backbones alike: AdamW (or
torch's Adafactor) settings, linear warm-up then cosine decay to zero, global-norm clipping,
optional z-loss and independent weight decay, gradient accumulation, checkpoint spacing and
the job's seed (effect-table rows 1–4 and the heads of rows 5–10).

Defaults are the small-scale proxies' (β2 = 0.95, clip 1); a head names what it changes
(β2 = 0.999 and clip 35 for the dense heads, as their reference recipes do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Schedule:
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 1e-4
    independent_wd: bool = False  # decay weights by weight_decay × schedule, not × lr
    b2: float = 0.95
    optimizer: str = "adamw"
    clip: float = 1.0
    z_loss: float = 0.0  # weight of log²Z of the logits
    accumulate: int = 1  # micro-batches per step
    checkpoint_every: int = 100
    seed: int = 0

    def factor(self, step: int) -> float:
        """The learning rate at ``step`` as a share of ``lr``: linear warm-up over ``warmup``
        steps, then a half cosine to zero at ``steps``."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return 0.5 * (1 + math.cos(math.pi * progress))


def declared_schedule(task, seed: int, *, prefix: str = "", **recipe) -> Schedule:
    """The one place a task's schedule is built: every ``Schedule`` field the task declares
    (named with ``prefix``: ``finetune_`` for end-to-end fine-tuning), then what its recipe sets
    itself (β2, clipping, a warm-up derived from the steps), and the job's seed. A field
    neither declares keeps the schedule's default; nothing is copied by hand."""
    declared = {
        f.name: getattr(task, prefix + f.name)
        for f in fields(Schedule)
        if f.name != "seed" and hasattr(task, prefix + f.name)
    }
    return Schedule(**(declared | recipe), seed=seed)


def head_warmup(steps: int) -> int:
    """The dense heads' warm-up: a tenth of the steps, at most 50; none under 10 steps (the
    frozen-feature head always trained so; the backbone-in-the-loop mode took one step)."""
    return min(50, steps // 10)
