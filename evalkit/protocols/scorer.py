"""A classifier on a backbone that other tasks score with (calibration, distillation's
teacher): the linear probe on frozen features, or the backbone fine-tuned with a linear
classifier (``--set finetune=true``). Its L2 or its training uses the images of the training
split outside a seeded, stratified hold-out (``holdout``); the held-out images' logits are kept
(calibration fits its temperature on them). ``refit_all`` trains on every training image
instead, as ``imagenet-linear`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.cache.settings import FeatureRequest
from evalkit.core.task import resolve_pool
from evalkit.data.resolve import open_dataset
from evalkit.heads.linear import fit_logistic

from .classification import ProbeData, predict, stratified_holdout
from .linear_classifier import FinetunedClassifier


@dataclass
class Scorer:
    """The classifier under test: logits of any split, and of the held-out training images
    the temperature is fitted on."""

    task: object  # a LinearClassifier
    backbone: object
    ctx: object
    classes: list[str]
    held_out: tuple[torch.Tensor, torch.Tensor]
    extra: dict
    probe: tuple | None = None  # frozen: (ProbeData, model, feature request)
    tuned: FinetunedClassifier | None = None

    @classmethod
    def fit(cls, task, backbone, ctx, *, refit_all: bool = False) -> Scorer:
        """``task`` is a ``LinearClassifier`` (its probe and fine-tuning settings)."""
        fit = cls._finetuned if task.finetune else cls._frozen
        return fit(task, backbone, ctx, refit_all)

    @classmethod
    def _frozen(cls, task, backbone, ctx, refit_all: bool) -> Scorer:
        request = FeatureRequest(layers=task.layers, pool=resolve_pool(task.pool, backbone))
        train = task.training_set(task.transform(backbone, ctx), ctx)
        feats = ctx.features(backbone, train, split=task.train_split, request=request)
        classes = len(train.classes)
        fit_idx, held_idx = stratified_holdout(feats.labels, task.holdout, seed=ctx.seed)
        data = ProbeData.build(feats, None, task, ctx.device, classes)
        l2, init, _, _ = task.select_l2(data, fit_idx, held_idx, classes)
        train_idx = None if refit_all else fit_idx
        model = fit_logistic(
            data.train_rows(train_idx),
            None,
            num_classes=classes,
            l2=l2,
            init=init,
            max_iter=task.refit_max_iter,
        )
        held = _logits(model, data.train_rows(held_idx))
        extra = {
            "classifier": "linear probe on frozen features",
            "l2": l2,
            "fit_images": len(feats) if refit_all else len(fit_idx),
            "held_out_images": len(held_idx),
        }
        return cls(
            task, backbone, ctx, list(train.classes), held, extra, probe=(data, model, request)
        )

    @classmethod
    def _finetuned(cls, task, backbone, ctx, refit_all: bool) -> Scorer:
        train = task.training_set(None, ctx)  # scanned once: labels now, held-out images later
        labels = torch.as_tensor(train.labels)
        fit_idx, held_idx = stratified_holdout(labels, task.holdout, seed=ctx.seed)
        tuned = FinetunedClassifier.train(
            task, backbone, ctx, indices=None if refit_all else fit_idx
        )
        train.transform = tuned.eval_transform
        held = predict(tuned.model, torch.utils.data.Subset(train, held_idx.tolist()), ctx)
        extra = {
            **tuned.extra,
            "classifier": "fine-tuned backbone + linear classifier",
            "fit_images": len(labels) if refit_all else len(fit_idx),
            "held_out_images": len(held_idx),
        }
        return cls(task, backbone, ctx, tuned.classes, held, extra, tuned=tuned)

    def score(self, dataset: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        name = split if dataset == self.task.dataset else f"{dataset}/{split}"
        return self.score_opened(self.opened(dataset, split), name)

    def opened(self, dataset: str, split: str):
        """A split opened as the classifier reads it: its eval transform, its classes."""
        return open_dataset(
            dataset, split, self.ctx.data, transform=self.transform, classes=self.classes
        )

    def score_opened(self, data, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and labels of a split already opened with ``transform`` (``name``: what the
        feature cache calls it)."""
        if self.tuned is not None:
            return predict(self.tuned.model, data, self.ctx)
        probe, model, request = self.probe
        feats = self.ctx.features(self.backbone, data, split=name, request=request)
        return _logits(model, probe.rows_of(feats))

    @property
    def transform(self):
        """The eval transform of the images the classifier reads."""
        return (
            self.tuned.eval_transform
            if self.tuned
            else self.task.transform(self.backbone, self.ctx)
        )

    @torch.no_grad()
    def logits_of(self, images: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images prepared as ``transform`` prepares them."""
        images = images.to(self.ctx.device)
        if self.tuned is not None:
            return self.tuned.model(images).float()
        probe, model, request = self.probe
        features = self.backbone.extract(images, layers=request.layers, pool=request.pool)
        return model.logits(probe.scale(features.pooled.float()).to(probe.device)).float()


def _logits(model, rows) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [(model.logits(x).float().cpu(), y.cpu()) for x, y in rows.chunks()]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
