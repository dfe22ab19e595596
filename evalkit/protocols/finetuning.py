"""Fine-tuning mode of the classification and ADE20k tasks (``--set finetune=true``; paper:
effect-table rows 7–8, whose ADE20k fraction numbers were measured with the backbone
fine-tuned, and row 11, whose calibration was measured on a fine-tuned classifier;
docs/protocols.md, "Fine-tuning").

A copy of the backbone and the task's head are trained end to end by the backbone trainer
(``evalkit.training``): AdamW with β2 0.999, warm-up then cosine decay, layer-wise learning-rate
decay (``layer_decay``), no weight decay on norms, biases and position embeddings. The
classifier trains on inception crops with flips at ``finetune_resolution`` (position embeddings
resampled where the backbone differs) and is scored at the same resolution with a centre crop.
Training state is checkpointed under the feature cache (``finetune/<key>/``), so an
interrupted run resumes; rows say ``finetuned: true``, and tables label them "(fine-tuned)"
and set the paper's fine-tuned numbers beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.core.task import NON_NEGATIVE, POSITIVE, SHARE, Stage, run_key, setting
from evalkit.errors import EvalkitError
from evalkit.schedule import Schedule, declared_schedule
from evalkit.training.finetune import (
    EndToEnd,
    backbone_module,
    decayed_groups,
    trainable_copy,
)
from evalkit.training.loop import fit


@dataclass(frozen=True)
class FinetuneSettings:
    """Settings of fine-tuning mode (off by default: the tasks evaluate frozen backbones)."""

    finetune: bool = False
    finetune_steps: int = setting(300, POSITIVE)
    finetune_batch_size: int = setting(32, POSITIVE)  # images per micro-batch
    finetune_accumulate: int = setting(1, POSITIVE)  # micro-batches per step
    finetune_lr: float = setting(3e-4, POSITIVE)  # the head's; blocks below decay from it
    finetune_weight_decay: float = setting(0.05, NON_NEGATIVE)
    layer_decay: float = setting(0.75, SHARE)

    def finetune_stages(self, inputs, image: int, eval_passes: int) -> list[Stage]:
        """Training end to end (a backward pass per image, the gradient and two AdamW moments per
        weight, each block's activations kept for the backward) and scoring at ``image`` px.
        Over ``inputs.dp`` data-parallel ranks each rank holds its share of a micro-batch and,
        as FSDP2 shards them, its share of the weights' training state."""
        shape = inputs.shape
        tokens = (image / shape.image) ** 2 if shape.image else 1.0
        share = -(-self.finetune_batch_size // inputs.dp)
        kept = int(share * shape.activation_bytes_per_image * shape.depth * tokens)
        state = 3 * shape.weight_bytes_per_rank // inputs.dp
        train = Stage(
            "fine-tune backbone and head",
            "end to end",
            forward_passes=self.finetune_steps
            * self.finetune_batch_size
            * self.finetune_accumulate,
            backward=True,
            image=image,
            device_bytes=state + kept,
        )
        score = Stage("score", "fine-tuned", forward_passes=eval_passes, image=image)
        return [train, score]

    def schedule(self, seed: int) -> Schedule:
        steps = self.finetune_steps
        return declared_schedule(
            self,
            seed,
            prefix="finetune_",
            warmup=max(1, steps // 10),
            b2=0.999,
            clip=1.0,
            checkpoint_every=max(1, steps // 4),
        )


@dataclass
class FinetuneRun:
    """One end-to-end model and what its training needs."""

    model: EndToEnd
    depth: int
    out: Path | None

    def train(self, task: FinetuneSettings, batches, loss_fn, ctx, schedule=None) -> list[dict]:
        """Fine-tuning's schedule and layer-wise groups, or, for a frozen backbone, the head
        alone under ``schedule``."""
        if self.model.frozen:
            return fit(
                self.model,
                batches,
                loss_fn,
                schedule,
                device=ctx.device,
                progress=ctx.extract.progress,
            )
        groups = decayed_groups(
            self.model.tower, self.model.head, depth=self.depth, decay=task.layer_decay
        )
        return fit(
            self.model,
            batches,
            loss_fn,
            task.schedule(ctx.seed),
            out=self.out,
            device=ctx.device,
            progress=ctx.extract.progress,
            groups=groups,
        )


def end_to_end(
    task, backbone, ctx, head_factory, *, layers, pool: str, dense: bool, frozen: bool = False
):
    """A trainable copy of ``backbone`` with the head ``head_factory(feature dims)`` on it,
    its head seeded by the run's seed; checkpointed under the cache when there is one. With
    ``frozen`` the backbone itself is used, frozen, and only the head trains (no checkpoints:
    they would hold the whole backbone)."""
    from evalkit.seeds import seeded_build

    for name in task.datasets():  # the rows' data provenance; no features are extracted
        ctx.stats["data"][name] = ctx.data_identity(name)
    tower = backbone if frozen else trainable_copy(backbone)
    dims = probe_dims(tower, task, layers=layers, pool=pool, dense=dense)
    head = seeded_build(lambda: head_factory(dims), ctx.seed, "head-weights")
    model = EndToEnd(tower, head, layers=layers, pool=pool, dense=dense, frozen=frozen)
    model = model.to(ctx.device)
    out = None if frozen else checkpoint_dir(task, backbone, ctx)
    return FinetuneRun(model, backbone.info.depth, out)


def dense_end_to_end(task, backbone, ctx, *, frozen: bool) -> FinetuneRun:
    """A dense task's head (``task.build_head``) on the mean-pooled grids of the backbone's
    four tapped layers, trained with the backbone in the loop (``frozen``: its weights kept)."""
    from evalkit.protocols.grids import tap_layers

    layers = tap_layers(backbone.info.depth)
    return end_to_end(
        task, backbone, ctx, task.build_head, dense=True, pool="mean", layers=layers, frozen=frozen
    )


def probe_dims(backbone, task, *, layers, pool: str, dense: bool) -> list[int]:
    """Feature widths of one forward pass at the task's resolution: the pooled width, or one
    per grid. A backbone whose position embeddings cannot take that resolution is refused."""
    size = resolution(task, backbone)
    device = next(backbone_parameters(backbone)).device
    images = torch.zeros(1, 3, size, size, device=device)
    try:
        with torch.no_grad():
            features = backbone.extract(images, layers=tuple(layers), pool=pool, dense=dense)
    except (AssertionError, RuntimeError) as exc:
        raise EvalkitError(
            f"{backbone.info.name} cannot run at {size} px ({exc.__class__.__name__}: {exc}); "
            f"use its own size ({backbone.info.preprocess.size}) or, for timm models, "
            "--model-arg dynamic_img_size=true"
        ) from exc
    if dense:
        return [g.shape[1] for g in features.grids]
    return [features.pooled.shape[1]]


def backbone_parameters(backbone):
    return backbone_module(backbone).parameters()


def resolution(task, backbone) -> int:
    """The task's image size when it has one (dense tasks, ``finetune_resolution``), else
    the backbone's own."""
    size = getattr(task, "finetune_resolution", 0) or getattr(task, "image_size", 0)
    return size or backbone.info.preprocess.size


def checkpoint_dir(task, backbone, ctx) -> Path | None:
    """``<cache>/finetune/<run key>``: keyed by the runner's own job spec (task version and
    settings, backbone with its options, weights, dtypes and library versions, data, seed),
    so a checkpoint is resumed only by the job that wrote it."""
    if ctx.extract.writable_cache is None:
        return None
    key = run_key(task, backbone.info, ctx)
    return Path(ctx.extract.writable_cache) / "finetune" / key


def finetune_extra(task: FinetuneSettings, log: list[dict], size: int) -> dict:
    if not log:
        raise EvalkitError("fine-tuning ran no steps")
    last = log[-10:]
    return {
        "finetuned": True,
        "resolution": size,
        "finetune_steps": len(log),
        "first_loss": log[0]["loss"],
        "final_loss": sum(e["loss"] for e in last) / len(last),
        "layer_decay": task.layer_decay,
    }
