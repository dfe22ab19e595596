"""The backbone training loop (effect-table rows 1–4; docs/protocols.md, "Stability"): AdamW
with β2 = 0.95 as the small-scale proxies use (or torch's Adafactor), linear warm-up then cosine
decay, global-norm clipping, optional z-loss and independent weight decay, gradient
accumulation, bf16 autocast on CUDA, and a data order that is a pure function of (seed, step),
so a resumed run sees the batches an uninterrupted one would.

Under torchrun each data-parallel rank draws the whole step's sample indices and computes
its share of the batch (the ``batch`` callable slices by rank); gradients are averaged over
ranks (by FSDP2 itself when the model is sharded with it), the logged loss is the mean over
ranks, and the global gradient norm is taken over every shard, so the steps equal one
process's on the joined batch. Checkpoints hold whole tensors, gathered to rank 0.

Checkpoints (``out/checkpoint-<step>/``: weights as safetensors, optimizer and RNG state, the
log so far) are written to a temporary folder and renamed, then named in ``out/latest.json``;
a run restarted with the same ``out`` resumes from the latest one, and a killed run loses at
most ``checkpoint_every`` steps. A loss that is not finite stops the run with ``Diverged``;
the last good checkpoint stays.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from evalkit import distributed
from evalkit.data.feeding import prefetched
from evalkit.errors import EvalkitError
from evalkit.progress import ProgressBar
from evalkit.schedule import Schedule
from evalkit.seeds import generator, seed_global
from evalkit.storage.checkpoints import load_strict, read_state_dict, save_checkpoint
from evalkit.storage.identity import read_json, write_json
from evalkit.tracking import curve

OPTIMIZERS = ("adamw", "adafactor")
LATEST = "latest.json"
SHARDED = "sharded"  # a checkpoint's per-rank shards, written under torchrun


class Diverged(EvalkitError):
    """The loss stopped being finite; ``log`` holds the steps before it."""

    log: list[dict] = []


Batch = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, micro) → (x, y)


def fit(
    model,
    batch: Batch,
    loss_fn,
    schedule: Schedule,
    *,
    out: Path | None = None,
    device: str = "cpu",
    progress: bool = False,
    observe=None,
    groups: list[dict] | None = None,
) -> list[dict]:
    """Train ``model`` (inputs → logits) for ``schedule.steps``, resuming from ``out``. Each
    step's log holds loss, lr, grad_norm and whatever ``observe()`` returns after the step's
    first forward pass (attention statistics). ``groups`` (optional) are parameter groups
    with an ``lr_scale`` and whether weight decay applies (``decayed``). Returns the log of
    every step."""
    model.to(device)  # the model trains where its batches go (before the optimiser holds it)
    optimizer = make_optimizer(model, schedule, groups)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)
    log = resume(model, optimizer, lr_schedule, out) if out is not None else []
    keys = [(s, m) for s in range(len(log), schedule.steps) for m in range(schedule.accumulate)]
    batch = prefetched(batch, keys, device)  # decoded ahead by workers when feeding a GPU
    model.train()
    status = "loss {task.fields[loss]:.4f}  {task.fields[speed]:.0f} img/s"
    with ProgressBar(progress, schedule.steps, "train", status=status) as advance:
        advance(len(log), loss=float("nan"), speed=0.0)
        for step in range(len(log), schedule.steps):
            start = time.perf_counter()
            try:
                entry = train_step(
                    model, optimizer, batch, loss_fn, schedule, step, device, observe
                )
            except Diverged as exc:
                exc.log = log
                raise
            lr_schedule.step()
            log.append(entry)
            curve({k: v for k, v in entry.items() if k != "step"}, step)
            images = schedule.batch_size * schedule.accumulate
            advance(1, loss=entry["loss"], speed=images / (time.perf_counter() - start))
            if out is not None and (step + 1) % schedule.checkpoint_every == 0:
                save(model, optimizer, lr_schedule, log, out)
    if out is not None and log and len(log) % schedule.checkpoint_every:
        save(model, optimizer, lr_schedule, log, out)  # the end, so a rerun has nothing to redo
    model.eval()
    return log


def sampled_batches(
    dataset, batch_size: int, seed: int, collate: Callable | None = None, lead: int = 0
):
    """A ``Batch`` over ``dataset``: each step's sample indices drawn from the (seed, step,
    micro) generator and each item's random augmentation seeded by its position in the batch,
    so a resumed run, and a run over several data-parallel ranks (each loads its own share),
    see exactly the images one uninterrupted process would. A ``collate`` that draws (a batch's
    scale, crop and flip) draws from its own stream per (step, micro, rank): resumed runs see
    the same, but a run over several ranks draws other crops than one process. With ``lead`` each rank also
    loads the ``lead`` items before its share (cyclically), first: what mixing a batch with
    itself rolled needs."""

    def batch(step: int, micro: int):
        layout = distributed.current()
        if batch_size % layout.dp_size:
            raise EvalkitError(
                f"batch size {batch_size} must be a multiple of the {layout.dp_size} "
                "data-parallel ranks"
            )
        pick = torch.randint(
            0, len(dataset), (batch_size,), generator=generator(seed, "batch", step, micro)
        )
        share = batch_size // layout.dp_size
        items = []
        start = layout.dp_rank * share
        for position in (p % batch_size for p in range(start - lead, start + share)):
            seed_global(seed, "augment", step, micro, position)
            items.append(dataset[int(pick[position])])
        if collate is not None:  # one that draws (scale, crop, flip) draws a stream of its own
            # seeded as the items are, not under fork_rng: batches are also made in forked
            # loader workers, where fork_rng's device count could hang on CUDA builds
            seed_global(seed, "collate", step, micro, layout.dp_rank)
            return collate(items)
        images = torch.stack([item[0] for item in items])
        return images, torch.stack([torch.as_tensor(item[1]) for item in items])

    batch.decodes = True  # a pure function of its key on the CPU: workers may compute it
    return batch


def make_optimizer(model, schedule: Schedule, groups: list[dict] | None = None):
    if schedule.optimizer not in OPTIMIZERS:
        raise EvalkitError(
            f"unknown optimizer {schedule.optimizer!r}: choose from {', '.join(OPTIMIZERS)}"
        )
    decay = (
        schedule.weight_decay / schedule.lr if schedule.independent_wd else schedule.weight_decay
    )
    params = (
        [
            {
                "params": g["params"],
                "lr": schedule.lr * g["lr_scale"],
                "weight_decay": decay if g["decayed"] else 0.0,
            }
            for g in groups
        ]
        if groups
        else model.parameters()
    )
    if schedule.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=schedule.lr, weight_decay=decay)
    return torch.optim.AdamW(params, lr=schedule.lr, betas=(0.9, schedule.b2), weight_decay=decay)


def train_step(
    model, optimizer, batch: Batch, loss_fn, schedule: Schedule, step: int, device: str, observe
):
    optimizer.zero_grad(set_to_none=True)
    total, seen = 0.0, {}
    use_bf16 = torch.device(device).type == "cuda"
    for micro in range(schedule.accumulate):
        x, y = batch(step, micro)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x.to(device, non_blocking=True)).float()
        loss = loss_fn(logits, y.to(device, non_blocking=True))
        if schedule.z_loss:
            loss = loss + schedule.z_loss * torch.logsumexp(logits, -1).pow(2).mean()
        if micro == 0 and observe is not None:
            seen = observe()
        (loss / schedule.accumulate).backward()
        total += loss.item() / schedule.accumulate
    distributed.average_gradients(model)  # those FSDP2 has not averaged already
    total = distributed.mean_over_ranks(total)
    if not math.isfinite(total):
        lr = optimizer.param_groups[0]["lr"]
        raise Diverged(
            f"the loss became {total} at step {step} (lr {lr:.3g}): lower the learning rate"
        )
    norm = clip_global_norm(model, schedule.clip)
    optimizer.step()
    return {
        "step": step,
        "loss": total,
        "lr": optimizer.param_groups[0]["lr"],
        "grad_norm": norm,
        **seen,
    }


def clip_global_norm(model, limit: float) -> float:
    """Clip the gradients to a global L2 norm of ``limit``; returns the norm before. Sharded
    gradients (FSDP2, tensor parallel) count once each, whatever rank holds them."""
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    if not any(isinstance(p.grad, DTensor) for p in params):
        return torch.nn.utils.clip_grad_norm_(params, limit).item()
    squares = torch.zeros((), dtype=torch.float64)
    for p in params:
        norm = torch.linalg.vector_norm(p.grad.float())
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squares += norm.double().cpu() ** 2
    total = squares.sqrt().item()
    scale = min(1.0, limit / (total + 1e-6))
    for p in params:
        p.grad.mul_(scale)
    return total


def full_state(module) -> dict[str, torch.Tensor]:
    """Whole CPU tensors of ``module``'s state, gathered one tensor at a time when sharded
    (every rank takes part; rank 0 keeps them, the others get an empty dict)."""
    from torch.distributed.tensor import DTensor

    keep, state = distributed.current().main, {}
    for key, value in module.state_dict().items():
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            state[key] = whole.detach().cpu().contiguous()
    return state


def save(model, optimizer, lr_schedule, log: list[dict], out: Path):
    """``out/checkpoint-<step>``, written whole before ``latest.json`` names it. Under torchrun
    every rank writes its own shards of the weights and optimizer state (``sharded/``, torch's
    distributed checkpoint format); rank 0 writes the rest."""
    out, layout = Path(out), distributed.current()
    name = f"checkpoint-{len(log):07d}"
    tmp = out / f".{name}.tmp"
    if layout.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    if layout.mesh is None:
        save_checkpoint(full_state(model), tmp, {"step": len(log)})
        trainer = {"optimizer": optimizer.state_dict()}
    else:
        _save_sharded(model, optimizer, tmp / SHARDED)
        trainer = {}
    if layout.main:
        trainer |= {
            "lr_schedule": lr_schedule.state_dict(),
            "rng": torch.get_rng_state(),
            "log": log,
        }
        torch.save(trainer, tmp / "trainer.pt")
        _publish(out, name, len(log))
    distributed.barrier()


def _save_sharded(model, optimizer, folder: Path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))


def _publish(out: Path, name: str, step: int):
    """Rename the finished folder into place, point ``latest.json`` at it, drop the previous."""
    shutil.rmtree(out / name, ignore_errors=True)
    os.replace(out / f".{name}.tmp", out / name)
    previous = latest_checkpoint(out)
    write_json(out / LATEST, {"checkpoint": name, "step": step})
    if previous is not None and previous.name != name:
        shutil.rmtree(previous, ignore_errors=True)


def resume(model, optimizer, lr_schedule, out: Path) -> list[dict]:
    """The log so far, with model and optimizer restored from the latest checkpoint (none:
    an empty log). A checkpoint that cannot be read is an error naming it."""
    folder = latest_checkpoint(Path(out))
    if folder is None:
        return []
    _check_layout(folder)
    try:
        if distributed.current().mesh is None:
            load_strict(model, read_state_dict(folder / "model.safetensors"), source=str(folder))
        trainer = torch.load(folder / "trainer.pt", weights_only=True)
        if distributed.current().mesh is None:
            optimizer.load_state_dict(trainer["optimizer"])
        else:
            _load_sharded(model, optimizer, folder / SHARDED)
        lr_schedule.load_state_dict(trainer["lr_schedule"])
    except EvalkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - every way a checkpoint can be damaged
        raise EvalkitError(
            f"cannot resume from {folder} ({exc.__class__.__name__}): delete it to start over"
        ) from exc
    torch.set_rng_state(trainer["rng"])
    return list(trainer["log"])


def latest_checkpoint(out: Path) -> Path | None:
    """The folder ``out/latest.json`` names (None without one). It may name only a
    ``checkpoint-<step>`` folder directly inside ``out``: anything else is refused, so that
    nothing outside the run's own folder is ever read as its state or deleted."""
    pointer = Path(out) / LATEST
    if not pointer.exists():
        return None
    name = read_json(pointer).get("checkpoint")
    if not isinstance(name, str) or not re.fullmatch(r"checkpoint-\d{7}", name):
        raise EvalkitError(
            f"{pointer} names {name!r}, not a checkpoint-<step> folder of its own: delete it to "
            "start over, or restore the one the run wrote"
        )
    return Path(out) / name


def _check_layout(folder: Path):
    sharded, under_torchrun = (folder / SHARDED).exists(), distributed.current().mesh is not None
    if sharded != under_torchrun:
        how = "under torchrun" if sharded else "in one process"
        raise EvalkitError(f"{folder} was written {how}: resume it the same way")


def _load_sharded(model, optimizer, folder: Path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
