"""Linear probe on frozen features (paper: ImageNet-1k linear probe, effect-table row 5;
docs/protocols.md, "Linear probe").

Protocol: features of the train and eval splits are extracted once (cached) with the
backbone's own eval preprocessing and standardised with train statistics. A multinomial
logistic regression is fitted by full-batch L-BFGS for every L2 strength in ``l2_grid``
(strongest first, warm-started); the strength is chosen by top-1 on a seeded, stratified
``holdout`` fraction of train — the strongest L2 within one hold-out image of the best — then
refitted on all of train and scored on the eval split (top-1, top-5). Every fit, the path's
too, runs in float64 until its gradient meets the tolerance, so the same features give the same
choice and numbers on any thread count, rank count or device (evalkit.heads.linear). Every fit's iterations and
whether it converged are in the row (``path_fit_by_l2``, ``refit``). Pooling (``cls``, ``mean``, ``map`` where the backbone has it; ``auto`` = the
backbone's own) and layers (e.g. ``layers=-1,-2,-3,-4`` concatenates the last four) are settings,
and so is the resize: the backbone's (``shorter`` side, then a centre crop) or big_vision's
(``square``, then a centre crop).

``--set eval_split=imagenet-v2|imagenet-r|imagenet-a|imagenet-real|objectnet`` scores the
probe on one of ImageNet's shifted test sets in its label space (evalkit.data.shifted): logits
restricted to the set's classes, a prediction right when it is one of the image's classes.

Paper: ViT-e 89.26 → ViT-22B 89.51 top-1 on ImageNet-1k (frozen features, linear head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.core.task import Metric, resolve_pool
from evalkit.heads.linear import fit_logistic
from evalkit.metrics import accuracy_stderr, reported_ks
from evalkit.protocols.classification import (
    ProbeData,
    percent,
    predict,
    stratified_holdout,
    test_hits,
)
from evalkit.protocols.linear_classifier import FinetunedClassifier, LinearClassifier
from evalkit.protocols.predictions import save_classifications, scored_hits


@dataclass(frozen=True)
class LinearProbe(LinearClassifier):
    version = 3  # 3: float64 fits to a pinned optimum, path too; ties within one hold-out image

    @property
    def reference(self) -> dict:
        # The paper's ImageNet numbers are frozen-feature probes: none beside a fine-tuned run.
        return {} if self.finetune else {"top1": {"ViT-22B": 89.51, "ViT-e": 89.26}}

    def metrics(self) -> list[str]:
        return ["top1", "top5"]

    def run(self, backbone, ctx):
        if self.finetune:
            yield from finetuned_classification(self, backbone, ctx)
            return
        train, test, space, test_set = self.split_features(backbone, ctx)
        labels = train.labels if space else torch.cat([train.labels, test.labels])
        num_classes = int(labels.max()) + 1
        data = ProbeData.build(train, test, self, ctx.device, num_classes)
        fit_idx, held_idx = stratified_holdout(train.labels, self.holdout, seed=ctx.seed)
        best_l2, best_init, sweep, fits = self.select_l2(data, fit_idx, held_idx, num_classes)
        model = fit_logistic(
            data.train_rows(),
            None,
            num_classes=num_classes,
            l2=best_l2,
            init=best_init,
            max_iter=self.refit_max_iter,
            keep_logits=data.mode == "resident",
        )
        if ctx.predictions is not None:
            logits = torch.cat([model.logits(x).cpu() for x, _ in data.test_rows().chunks()])
            save_classifications(ctx, logits, test.labels, test_set, space)
        extra = {
            "l2": best_l2,
            "holdout_top1_by_l2": sweep,
            "path_fit_by_l2": fits,  # iterations and convergence of each L2 on the path
            "refit": model.fit.as_dict(),
            "probe_mode": data.mode,
            "pool": resolve_pool(self.pool, backbone),
            "n_train": len(train.labels),
            "num_classes": num_classes,
        }
        for k in reported_ks(num_classes):
            row_hits = test_hits(model, data.test_rows(), space, k)
            yield Metric(
                f"top{k}",
                percent(row_hits),
                stderr=accuracy_stderr(row_hits),
                n=len(test.labels),
                extra=extra,
            )


def finetuned_classification(task: LinearProbe, backbone, ctx):
    """Fine-tuning mode: backbone and a linear classifier trained end to end on augmented
    crops at ``finetune_resolution``, scored at that resolution (evalkit.protocols.finetuning)."""
    tuned = FinetunedClassifier.train(task, backbone, ctx)
    test, space = task.eval_set(tuned.classes, tuned.eval_transform, ctx)
    logits, labels = predict(tuned.model, test, ctx)
    save_classifications(ctx, logits, labels, test, space)
    for k in reported_ks(logits.shape[1]):
        row_hits = scored_hits(logits, labels, space, k)
        yield Metric(
            f"top{k}",
            percent(row_hits),
            stderr=accuracy_stderr(row_hits),
            n=len(labels),
            extra=tuned.extra,
        )
