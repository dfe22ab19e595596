"""The one small loop that trains heads on cached features, on the one ``Schedule`` (AdamW,
linear warm-up then cosine decay, gradient clipping), bf16 autocast on CUDA, seeded batch order.
Used by the dense tasks (segmentation and depth heads), LiT's text towers and anything else that trains a small module.

``ShardedOrder`` and ``ShardReader`` train on a split larger than memory (LiT's caption pairs,
a video training split): batches are shuffled across the feature cache's shards a window of
shards at a time, each batch a pure function of (seed, step), and rows are read from at most two
windows of shards at once. A split that fits is read whole, in the same order, so both give the
same numbers."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from evalkit.batching import limit_for
from evalkit.errors import EvalkitError
from evalkit.progress import ProgressBar
from evalkit.schedule import Schedule
from evalkit.seeds import generator, seeded
from evalkit.tracking import curve


def batch_order(n: int, cfg: Schedule) -> list[torch.Tensor]:
    """Index batches for every step: reshuffled each epoch from the job's seed."""
    draws = generator(cfg.seed, "head-batches")
    batches, pool = [], torch.empty(0, dtype=torch.long)
    while len(batches) < cfg.steps:
        if len(pool) < cfg.batch_size:
            pool = torch.cat([pool, torch.randperm(n, generator=draws)])
        batches.append(pool[: cfg.batch_size])
        pool = pool[cfg.batch_size :]
    return batches


# What this trainer does not do, at the value that asks for nothing: AdamW on whole batches, decay
# scaled by the LR. It keeps no checkpoints (a head's training is rerun whole), so
# ``checkpoint_every`` does not apply; every other field of the schedule is used.
NOT_DONE_HERE = {"optimizer": "adamw", "independent_wd": False, "z_loss": 0.0, "accumulate": 1}


def refuse_unhonoured(cfg: Schedule) -> None:
    """A schedule asking the head trainer for what it does not do is refused by name, rather
    than trained without it."""
    asked = [f"{k}={getattr(cfg, k)!r}" for k, v in NOT_DONE_HERE.items() if getattr(cfg, k) != v]
    if asked:
        raise EvalkitError(
            f"the head trainer does not do {', '.join(asked)}: it trains heads with AdamW on "
            "whole batches, decay scaled by the LR; leave these at their defaults"
        )


def train(
    module: torch.nn.Module,
    step_loss: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    cfg: Schedule,
    *,
    device: str = "cpu",
    progress: bool = False,
    after_backward: Callable[[torch.nn.Module], None] | None = None,
    order: Callable[[int], torch.Tensor] | None = None,
) -> list[float]:
    """Train ``module`` for ``cfg.steps``; ``step_loss(indices)`` returns the batch loss and
    ``after_backward(module)`` may combine gradients across ranks before they are clipped.
    ``order(step)`` gives each step's indices (default: ``batch_order`` over ``n`` rows).
    Returns the loss of every step; what the steps draw (dropout) comes from the seed alone."""
    refuse_unhonoured(cfg)
    with seeded(cfg.seed, "head-dropout"):
        module.train()
        optimizer = torch.optim.AdamW(
            module.parameters(), lr=cfg.lr, betas=(0.9, cfg.b2), weight_decay=cfg.weight_decay
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cfg.factor)
        use_bf16 = torch.device(device).type == "cuda"
        losses = []
        status = "loss {task.fields[loss]:.4f}"
        with ProgressBar(progress, cfg.steps, "train head", status=status) as update:
            batches = batch_order(n, cfg) if order is None else map(order, range(cfg.steps))
            limit = limit_for("training")
            for indices in batches:

                def accumulated(size: int, indices=indices) -> float:
                    optimizer.zero_grad(set_to_none=True)
                    total = 0.0
                    for start in range(0, len(indices), size):
                        part = indices[start : start + size]
                        with torch.autocast(
                            torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16
                        ):
                            loss = step_loss(part)
                        share = len(part) / len(indices)  # 1.0 when the batch fits: the same step
                        (loss * share).backward()
                        total += loss.item() * share
                    return total

                losses.append(limit.whole(accumulated, len(indices), "training"))
                if after_backward is not None:
                    after_backward(module)
                torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip)
                optimizer.step()
                schedule.step()
                update(loss=losses[-1])
                curve({"loss": losses[-1], "lr": schedule.get_last_lr()[0]}, len(losses) - 1)
        module.eval()
        return losses


@dataclass
class ShardedOrder:
    """Batches of row indices shuffled across shards: each epoch shuffles the shards, takes them
    ``window`` at a time and shuffles the rows of each window; batches run through the epochs in
    that order. ``batch(step)`` depends on (seed, step) alone, so a resumed run sees the same
    batches; a batch needs the rows of at most two windows."""

    shards: list[torch.Tensor]  # per shard, the indices of its rows that are used
    batch_size: int
    seed: int
    window: int
    _epochs: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, starts: torch.Tensor, keep: torch.Tensor, batch_size: int, seed: int):
        """Shards starting at ``starts``; rows where ``keep`` is true. A window holds at least
        two shards and two batches."""
        bounds = [*starts.tolist(), len(keep)]
        shards = [torch.arange(a, b)[keep[a:b]] for a, b in zip(bounds, bounds[1:], strict=False)]
        rows = max(1, sum(map(len, shards)) // max(1, len(shards)))
        window = max(2, math.ceil(2 * batch_size / rows))
        return cls(shards, min(batch_size, sum(map(len, shards))), seed, window)

    @property
    def rows(self) -> int:
        return sum(map(len, self.shards))

    def epoch(self, index: int) -> torch.Tensor:
        if index not in self._epochs:
            draws = generator(self.seed, "epoch", index)
            order = torch.randperm(len(self.shards), generator=draws).tolist()
            windows = [
                torch.cat([self.shards[s] for s in order[i : i + self.window]])
                for i in range(0, len(order), self.window)
            ]
            rows = [w[torch.randperm(len(w), generator=draws)] for w in windows]
            self._epochs = {index: torch.cat(rows)} | {
                k: v for k, v in self._epochs.items() if k == index - 1
            }
        return self._epochs[index]

    def batch(self, step: int) -> torch.Tensor:
        start, parts, left = step * self.batch_size, [], self.batch_size
        while left:
            epoch, offset = divmod(start, self.rows)
            part = self.epoch(epoch)[offset : offset + left]
            parts.append(part)
            start, left = start + len(part), left - len(part)
        return torch.cat(parts)


class ShardReader:
    """Rows of a ``FeatureSet`` by index, keeping at most ``capacity`` shards decoded (the
    least recently used go first), as float32; or the whole split, when ``resident``."""

    def __init__(self, feats, capacity: int, *, resident: bool, key: str = "pooled"):
        self.feats, self.capacity, self.key = feats, capacity, key
        self.whole = feats.take(torch.arange(len(feats)), key).float() if resident else None
        self._shards: OrderedDict[int, torch.Tensor] = OrderedDict()

    def take(self, indices: torch.Tensor) -> torch.Tensor:
        if self.whole is not None:
            return self.whole[indices]
        return self.feats.take(indices, self.key, read=self._shard)

    def _shard(self, index: int) -> torch.Tensor:
        if index in self._shards:
            self._shards.move_to_end(index)
        else:
            self._shards[index] = self.feats.shard(index)[self.key].float()
            while len(self._shards) > self.capacity:
                self._shards.popitem(last=False)
        return self._shards[index]
