"""The linear classifier the classification tasks are built on (``imagenet-linear``,
``imagenet-ece``, distillation's teacher): its settings, the L2 chosen on a seeded stratified
hold-out of the training split along the regularisation path, its cost plan (rows resident on
the device or streamed from the cache), and its fine-tuning mode, where the backbone and a linear
layer are trained end to end (docs/protocols.md, "Linear probe", "Fine-tuning")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from evalkit.backbones.base import build_transform
from evalkit.core.task import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVES,
    Stage,
    resolve_pool,
    setting,
)
from evalkit.errors import EvalkitError
from evalkit.heads import linear
from evalkit.heads.linear import hits, logistic_path
from evalkit.training.loop import sampled_batches

from .classification import DEFAULT_L2, FrozenClassification, choose_l2, holdout_count, percent
from .finetuning import FinetuneSettings, end_to_end, finetune_extra, resolution


@dataclass(frozen=True)
class FrozenLinearClassifier(FrozenClassification):
    """A linear classifier on a backbone's frozen features: the settings and machinery of the
    linear probe (L2 path on a hold-out, refit, resident or streamed rows). A task that never
    fine-tunes (fairness) is built on this and has no fine-tuning setting to refuse."""

    l2_grid: tuple[float, ...] = setting(DEFAULT_L2, POSITIVES)
    holdout: float = setting(0.2, FRACTION)
    max_iter: int = setting(1000, POSITIVE)  # per L2 value on the path, each run to convergence
    refit_max_iter: int = setting(1000, POSITIVE)  # the chosen L2 refitted on all of train
    resident_gb: float = setting(4.0, NON_NEGATIVE)  # larger: streamed (or on half a GPU)

    def check_training(self, classes: list[str], counts: list[int]):
        """Every class keeps at least one image to fit on after the hold-out is taken."""
        for name, count in zip(classes, counts, strict=True):
            if count > 1 and holdout_count(count, self.holdout) >= count:
                raise EvalkitError(
                    f"holdout={self.holdout} would hold out all {count} training images of "
                    f"class {name!r}, leaving none to fit: lower holdout"
                )

    def plan(self, inputs) -> list[Stage]:
        """Resident (within ``resident_budget``): the raw, standardised and sliced training
        features plus the eval split in float32, a bf16 copy and the kept logits. Streamed: one
        shard of features and its logits, twice (train and eval)."""
        dim = len(self.layers) * inputs.shape.embed_dim
        n_train, n_eval = inputs.sizes[self.train_split], inputs.sizes[self.eval_split]
        train_bytes, eval_bytes = n_train * dim * 4, n_eval * dim * 4
        logits = linear.block_bytes(n_train, dim, inputs.classes)
        flops = linear.path_flops(n_train, dim, inputs.classes)
        resident = linear.resident_bytes(n_train, dim, inputs.classes)
        if resident <= self.resident_budget(inputs.device_bytes):
            # fp32 rows, their bf16 copy and the kept logits on the device; the raw,
            # standardised and sliced rows pass through the host
            probe = Stage(
                "linear probe",
                "resident",
                host_bytes=3 * train_bytes + eval_bytes + logits,
                device_bytes=resident + eval_bytes,
                flops=flops,
            )
        else:
            shard = inputs.shard_size * dim * 4 + logits
            probe = Stage(
                "linear probe",
                "streamed",
                host_bytes=2 * shard + n_train * 8,
                device_bytes=2 * shard,
                flops=flops,
            )
        return [self.extraction_stage(inputs), probe]

    def resident_budget(self, device_bytes: int) -> int:
        """Bytes the training features may take resident: ``resident_gb``, or half of a GPU's
        (free) memory where that is more; ``resident_gb=0`` always streams."""
        if not self.resident_gb:
            return 0
        return max(int(self.resident_gb * 2**30), device_bytes // 2)

    def select_l2(self, data, fit_idx, held_idx, num_classes):
        """The L2 chosen on the hold-out, its model, hold-out top-1 and each fit's record."""
        path = logistic_path(
            data.train_rows(fit_idx),
            None,
            num_classes=num_classes,
            l2_values=self.l2_grid,
            max_iter=self.max_iter,
            keep_logits=data.mode == "resident",
        )
        held = data.train_rows(held_idx)
        held_hits = {l2: hits(m, held, 1) for l2, m in path}
        best_l2, best_model = choose_l2(path, {l2: int(h.sum()) for l2, h in held_hits.items()})
        fits = {f"{l2:g}": m.fit.as_dict() for l2, m in path}
        return best_l2, best_model, {f"{k:g}": percent(v) for k, v in held_hits.items()}, fits


@dataclass(frozen=True)
class LinearClassifier(FinetuneSettings, FrozenLinearClassifier):
    """The frozen linear classifier and its fine-tuning mode, where the backbone and a linear
    layer are trained end to end: what the probe, calibration and distillation's teacher are
    built on."""

    finetune_resolution: int = setting(0, NON_NEGATIVE)  # 0: the backbone's own size

    def plan(self, inputs) -> list[Stage]:
        """Fine-tuned: the backbone trained end to end at ``finetune_resolution``; frozen: the
        probe's plan."""
        if self.finetune:
            image = self.finetune_resolution or inputs.shape.image
            return self.finetune_stages(inputs, image, inputs.sizes[self.eval_split])
        return super().plan(inputs)


@dataclass
class FinetunedClassifier:
    """A fine-tuned backbone with its linear classifier, and how to score images with it."""

    model: torch.nn.Module
    classes: list[str]
    eval_transform: object
    extra: dict

    @classmethod
    def train(cls, task: LinearClassifier, backbone, ctx, indices=None) -> FinetunedClassifier:
        """Trained on the training split (only its ``indices`` when given)."""
        size = resolution(task, backbone)
        pre = dataclasses.replace(backbone.info.preprocess, size=size)
        train = task.training_set(build_transform(pre, train=True), ctx)
        sampled = train if indices is None else torch.utils.data.Subset(train, indices.tolist())
        pool, classes = resolve_pool(task.pool, backbone), len(train.classes)
        run = end_to_end(
            task,
            backbone,
            ctx,
            lambda dims: torch.nn.Linear(dims[0], classes),
            layers=task.layers,
            pool=pool,
            dense=False,
        )
        batches = sampled_batches(sampled, task.finetune_batch_size, ctx.seed)
        log = run.train(task, batches, torch.nn.functional.cross_entropy, ctx)
        extra = {
            **finetune_extra(task, log, size),
            "pool": pool,
            "n_train": len(sampled),
            "num_classes": classes,
        }
        # the fine-tuned model's own forward reads them: normalised here, not by ``extract``
        eval_transform = build_transform(pre, square=task.resize == "square", normalised=True)
        return cls(run.model, list(train.classes), eval_transform, extra)
