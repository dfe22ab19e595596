"""Linear probe on frozen features (paper: ImageNet-1k linear probe, effect-table row 5;
docs/protocols.md, "Linear probe").

Protocol: features of the train and eval splits are extracted once (cached) with the
backbone's own eval preprocessing and standardised with train statistics. A multinomial
logistic regression is fitted by full-batch L-BFGS for every L2 strength in ``l2_grid``
(strongest first, warm-started); the strength is chosen by top-1 on a seeded, stratified
``holdout`` fraction of train (path fits of at most ``max_iter`` iterations: they only rank the
strengths), then refitted on all of train until the gradient meets the tolerance (at most
``refit_max_iter``) and scored on the eval split (top-1, top-5). Every fit's iterations and
whether it converged are in the row (``path_fit_by_l2``, ``refit``). Pooling (``cls``, ``mean``, ``map`` where the backbone has it; ``auto`` = the
backbone's own) and layers (e.g. ``layers=-1,-2,-3,-4`` concatenates the last four) are settings,
and so is the resize: the backbone's (``shorter`` side, then a centre crop) or big_vision's
(``square``, then a centre crop).

Paper: ViT-e 89.26 → ViT-22B 89.51 top-1 on ImageNet-1k (frozen features, linear head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.backbones.base import POOLS, build_transform
from evalkit.data import open_dataset
from evalkit.errors import EvalkitError
from evalkit.features import FeatureRequest
from evalkit.heads.linear import Standardizer, fit_logistic, logistic_path
from evalkit.metrics import topk_accuracy
from evalkit.task import (
    FRACTION,
    LAYERS,
    POSITIVE,
    POSITIVES,
    Metric,
    Task,
    one_of,
    resolve_pool,
    setting,
)

DEFAULT_L2 = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5)


@dataclass(frozen=True)
class FrozenClassification(Task):
    """Settings and feature extraction shared by the classification probes."""

    name: str = "imagenet-linear"
    dataset: str = "imagenet"
    train_split: str = "train"
    eval_split: str = "val"
    pool: str = setting("auto", one_of("auto", *POOLS))
    resize: str = setting("shorter", one_of("shorter", "square"))  # square: big_vision's
    layers: tuple[int, ...] = setting((-1,), LAYERS)

    def split_features(self, backbone, ctx):
        """Cached features of the train and eval splits, with the backbone's eval transform.
        The eval split's labels are the training classes' indices, matched by class name."""
        request = FeatureRequest(layers=self.layers, pool=resolve_pool(self.pool, backbone))
        train = self.open_split(self.train_split, backbone, ctx)
        if len(train.classes) < 2:
            raise EvalkitError(
                f"the training split of {self.dataset} has {len(train.classes)} class "
                f"({', '.join(train.classes)}): a classifier needs at least two"
            )
        test = self.open_split(self.eval_split, backbone, ctx, classes=train.classes)
        return [
            ctx.features(backbone, dataset, split=split, request=request)
            for split, dataset in ((self.train_split, train), (self.eval_split, test))
        ]

    def splits(self) -> tuple[str, ...]:
        return (self.train_split, self.eval_split)

    def open_split(self, split: str, backbone, ctx, classes=None):
        transform = backbone.transform()
        if self.resize == "square":
            transform = build_transform(backbone.info.preprocess, square=True)
        return open_dataset(self.dataset, split, ctx.data, transform=transform, classes=classes)


@dataclass(frozen=True)
class LinearProbe(FrozenClassification):
    l2_grid: tuple[float, ...] = setting(DEFAULT_L2, POSITIVES)
    holdout: float = setting(0.2, FRACTION)
    max_iter: int = setting(100, POSITIVE)  # per L2 value on the path (it only ranks them)
    refit_max_iter: int = setting(1000, POSITIVE)  # the chosen L2 is refitted to convergence

    version = 2  # 2: the refit runs to convergence; fits on record
    reference = {"top1": {"ViT-22B": 89.51, "ViT-e": 89.26}}

    def metrics(self) -> list[str]:
        return ["top1", "top5"]

    def run(self, backbone, ctx):
        train, test = self.split_features(backbone, ctx)
        num_classes = int(max(train.labels.max(), test.labels.max())) + 1
        scale = Standardizer.fit(train.pooled)
        x_train, x_test = scale(train.pooled), scale(test.pooled)
        fit_idx, held_idx = stratified_holdout(train.labels, self.holdout, seed=ctx.seed)
        best_l2, best_init, sweep, fits = self._select_l2(
            x_train, train.labels, fit_idx, held_idx, num_classes
        )
        model = fit_logistic(
            x_train,
            train.labels,
            num_classes=num_classes,
            l2=best_l2,
            init=best_init,
            max_iter=self.refit_max_iter,
        )
        logits = model.logits(x_test)
        extra = {
            "l2": best_l2,
            "holdout_top1_by_l2": sweep,
            "path_fit_by_l2": fits,  # iterations and convergence of each L2 on the path
            "refit": model.fit.as_dict(),
            "pool": resolve_pool(self.pool, backbone),
            "n_train": len(train.labels),
            "num_classes": num_classes,
        }
        for k in (1, 5):
            yield Metric(
                f"top{k}",
                topk_accuracy(logits, test.labels, k),
                n=len(test.labels),
                seeds=[ctx.seed],
                extra=extra,
            )

    def _select_l2(self, x, y, fit_idx, held_idx, num_classes):
        path = logistic_path(
            x[fit_idx],
            y[fit_idx],
            num_classes=num_classes,
            l2_values=self.l2_grid,
            max_iter=self.max_iter,
        )
        scores = {l2: topk_accuracy(m.logits(x[held_idx]), y[held_idx]) for l2, m in path}
        # Ties go to the stronger regulariser: the path is fitted strongest first.
        best_l2, best_model = max(path, key=lambda item: scores[item[0]])
        fits = {f"{l2:g}": m.fit.as_dict() for l2, m in path}
        return best_l2, best_model, {f"{k:g}": v for k, v in scores.items()}, fits


def stratified_holdout(labels: torch.Tensor, fraction: float, *, seed: int):
    """Seeded split of indices: ``fraction`` of each class (at least one, if the class has
    two or more examples) held out."""
    gen = torch.Generator().manual_seed(seed)
    fit, held = [], []
    for cls in labels.unique():
        idx = torch.nonzero(labels == cls).squeeze(1)
        idx = idx[torch.randperm(len(idx), generator=gen)]
        cut = max(1, round(fraction * len(idx))) if len(idx) > 1 else 0
        held.append(idx[:cut])
        fit.append(idx[cut:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values
