"""The one small loop that trains heads on cached features: AdamW, linear warm-up then cosine
decay, gradient clipping, bf16 autocast on CUDA, seeded batch order. Used by the dense tasks
(segmentation and depth heads), LiT's text towers and anything else that trains a small module."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evalkit.progress import ProgressBar


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 500
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup: int = 50
    clip: float = 35.0
    seed: int = 0


def seeded_build(factory: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """Build a module with its initial weights drawn from ``seed`` alone (not from whatever
    the global generator went through before), leaving the global generator untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return factory()


def lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


def batch_order(n: int, cfg: TrainConfig) -> list[torch.Tensor]:
    """Index batches for every step: reshuffled each epoch from a seeded generator."""
    generator = torch.Generator().manual_seed(cfg.seed)
    batches, pool = [], torch.empty(0, dtype=torch.long)
    while len(batches) < cfg.steps:
        if len(pool) < cfg.batch_size:
            pool = torch.cat([pool, torch.randperm(n, generator=generator)])
        batches.append(pool[: cfg.batch_size])
        pool = pool[cfg.batch_size :]
    return batches


def train(
    module: torch.nn.Module,
    step_loss: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    cfg: TrainConfig,
    *,
    device: str = "cpu",
    progress: bool = False,
    after_backward: Callable[[torch.nn.Module], None] | None = None,
) -> list[float]:
    """Train ``module`` for ``cfg.steps``; ``step_loss(indices)`` returns the batch loss and
    ``after_backward(module)`` may combine gradients across ranks before they are clipped.
    Returns the loss of every step."""
    torch.manual_seed(cfg.seed)
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    use_bf16 = torch.device(device).type == "cuda"
    losses = []
    status = "loss {task.fields[loss]:.4f}"
    with ProgressBar(progress, cfg.steps, "train head", status=status) as update:
        for indices in batch_order(n, cfg):
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = step_loss(indices)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if after_backward is not None:
                after_backward(module)
            torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            update(loss=losses[-1])
    module.eval()
    return losses
