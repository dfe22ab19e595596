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

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from evalkit.backbones.base import POOLS, build_transform
from evalkit.cache.features import FeatureRequest, FeatureSet
from evalkit.core.task import (
    FRACTION,
    LAYERS,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVES,
    Metric,
    Stage,
    Task,
    extraction_stage,
    one_of,
    resolve_pool,
    setting,
)
from evalkit.data import open_dataset
from evalkit.data.feeding import decode_workers, loader_options
from evalkit.data.shifted import open_scored
from evalkit.errors import EvalkitError
from evalkit.heads import linear as linear_fit
from evalkit.heads.linear import Rows, Standardizer, fit_logistic, hits, logistic_path
from evalkit.heads.zeroshot import label_space_hits, restricted
from evalkit.metrics import accuracy_stderr, reported_ks, topk_hits
from evalkit.progress import ProgressBar
from evalkit.training.loop import sampled_batches

from .finetuning import FinetuneSettings, end_to_end, finetune_extra, resolution

# Test sets scored in their own label space (evalkit.data.shifted), by the split each has.
SCORED_SETS = {"imagenet-v2": "test", "imagenet-r": "test", "imagenet-a": "test",
               "imagenet-real": "val", "objectnet": "test"}  # fmt: skip
DEFAULT_L2 = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5)


class Splits(NamedTuple):
    """Cached features of the train and eval splits, the eval set's label space (None for a
    split of the training dataset) and the eval dataset itself (its images' identities)."""

    train: FeatureSet
    test: FeatureSet
    space: object
    test_set: object


@dataclass(frozen=True)
class FrozenClassification(Task):
    """Settings and feature extraction shared by the classification probes."""

    name: str = "imagenet-linear"
    dataset: str = "imagenet"
    train_split: str = "train"
    eval_split: str = "val"  # a split of ``dataset``, or a test set of SCORED_SETS
    pool: str = setting("auto", one_of("auto", *POOLS))
    resize: str = setting("shorter", one_of("shorter", "square"))  # square: big_vision's
    layers: tuple[int, ...] = setting((-1,), LAYERS)

    def split_features(self, backbone, ctx):
        """Cached features of the train and eval splits, with the backbone's eval transform,
        and the eval set's label space over the training classes (None for a split of the
        training dataset, whose labels are the training classes' indices, matched by name)."""
        request = FeatureRequest(layers=self.layers, pool=resolve_pool(self.pool, backbone))
        train = self.training_set(self.transform(backbone), ctx)
        test, space = self.eval_set(train.classes, self.transform(backbone), ctx)
        features = [
            ctx.features(backbone, dataset, split=split, request=request)
            for split, dataset in ((self.train_split, train), (self.eval_split, test))
        ]
        return Splits(*features, space, test)

    def training_set(self, transform, ctx):
        train = open_dataset(self.dataset, self.train_split, ctx.data, transform=transform)
        if len(train.classes) < 2:
            raise EvalkitError(
                f"the training split of {self.dataset} has {len(train.classes)} class "
                f"({', '.join(train.classes)}): a classifier needs at least two"
            )
        labels = getattr(train, "labels", None)
        if labels is not None:  # before any feature is extracted
            counts = Counter(int(label) for label in labels)
            self.check_training(
                train.classes, [counts.get(i, 0) for i in range(len(train.classes))]
            )
        return train

    def check_training(self, classes: list[str], counts: list[int]):
        """Refuse settings the training split cannot serve (``counts``: images per class)."""

    def eval_set(self, classes, transform, ctx):
        """The eval split with its labels matched to ``classes`` by name, and its label space
        over them (None for a split of the training dataset)."""
        if self.eval_split in SCORED_SETS:
            test = open_scored(self.eval_split, SCORED_SETS[self.eval_split], ctx.data, transform)
            return test, test.label_space.over(classes)
        test = open_dataset(self.dataset, self.eval_split, ctx.data, transform=transform,
                            classes=classes)  # fmt: skip
        return test, None

    def splits(self) -> tuple[str, ...]:
        return (self.train_split, self.eval_split)

    def datasets(self) -> tuple[str, ...]:
        return (self.dataset, *([self.eval_split] if self.eval_split in SCORED_SETS else []))

    def reads(self) -> dict[str, dict[str, str]]:
        if self.eval_split not in SCORED_SETS:
            return super().reads()
        return {self.dataset: {self.train_split: self.train_split},
                self.eval_split: {self.eval_split: SCORED_SETS[self.eval_split]}}  # fmt: skip

    def extraction_stage(self, inputs) -> Stage:
        rows = inputs.sizes[self.train_split] + inputs.sizes[self.eval_split]
        return extraction_stage(inputs, rows, layers=len(self.layers))

    def transform(self, backbone):
        if self.resize == "square":
            return build_transform(backbone.info.preprocess, square=True)
        return backbone.transform()


@dataclass(frozen=True)
class LinearProbe(FinetuneSettings, FrozenClassification):
    finetune_resolution: int = setting(0, NON_NEGATIVE)  # 0: the backbone's own size
    l2_grid: tuple[float, ...] = setting(DEFAULT_L2, POSITIVES)
    holdout: float = setting(0.2, FRACTION)
    max_iter: int = setting(1000, POSITIVE)  # per L2 value on the path, each run to convergence
    refit_max_iter: int = setting(1000, POSITIVE)  # the chosen L2 refitted on all of train
    resident_gb: float = setting(4.0, NON_NEGATIVE)  # larger: streamed (or on half a GPU)

    version = 3  # 3: float64 fits to a pinned optimum, path too; ties within one hold-out image

    def check_training(self, classes: list[str], counts: list[int]):
        """Every class keeps at least one image to fit on after the hold-out is taken."""
        for name, count in zip(classes, counts, strict=True):
            if count > 1 and holdout_count(count, self.holdout) >= count:
                raise EvalkitError(
                    f"holdout={self.holdout} would hold out all {count} training images of "
                    f"class {name!r}, leaving none to fit: lower holdout"
                )

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
        data = ProbeData.build(train, test, self, ctx.extract.device, num_classes)
        fit_idx, held_idx = stratified_holdout(train.labels, self.holdout, seed=ctx.seed)
        best_l2, best_init, sweep, fits = self._select_l2(data, fit_idx, held_idx, num_classes)
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
            yield Metric(f"top{k}", percent(row_hits), stderr=accuracy_stderr(row_hits),
                         n=len(test.labels), seeds=[ctx.seed], extra=extra)  # fmt: skip

    def plan(self, inputs) -> list[Stage]:
        """Resident (within ``resident_budget``): the raw, standardised and sliced training
        features plus the eval split in float32, a bf16 copy and the kept logits. Streamed: one shard of features and its logits, twice (train and eval).
        Fine-tuned: the backbone trained end to end at ``finetune_resolution``."""
        if self.finetune:
            image = self.finetune_resolution or inputs.shape.image
            return self.finetune_stages(inputs, image, inputs.sizes[self.eval_split])
        dim = len(self.layers) * inputs.shape.embed_dim
        n_train, n_eval = inputs.sizes[self.train_split], inputs.sizes[self.eval_split]
        train_bytes, eval_bytes = n_train * dim * 4, n_eval * dim * 4
        logits = linear_fit.block_bytes(n_train, dim, inputs.classes)
        flops = linear_fit.path_flops(n_train, dim, inputs.classes)
        resident = linear_fit.resident_bytes(n_train, dim, inputs.classes)
        if resident <= self.resident_budget(inputs.device_bytes):
            # fp32 rows, their bf16 copy and the kept logits on the device; the raw,
            # standardised and sliced rows pass through the host
            probe = Stage("linear probe", "resident", host_bytes=3 * train_bytes + eval_bytes
                          + logits, device_bytes=resident + eval_bytes, flops=flops)  # fmt: skip
        else:
            shard = inputs.shard_size * dim * 4 + logits
            probe = Stage("linear probe", "streamed", host_bytes=2 * shard + n_train * 8,
                          device_bytes=2 * shard, flops=flops)  # fmt: skip
        return [self.extraction_stage(inputs), probe]

    def resident_budget(self, device_bytes: int) -> int:
        """Bytes the training features may take resident: ``resident_gb``, or half of a GPU's
        (free) memory where that is more; ``resident_gb=0`` always streams."""
        if not self.resident_gb:
            return 0
        return max(int(self.resident_gb * 2**30), device_bytes // 2)

    def _select_l2(self, data, fit_idx, held_idx, num_classes):
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


def choose_l2(path, held_hits: dict[float, int]):
    """The strongest L2 whose hold-out hits are within one image of the best: a tie, or a
    single borderline image, never decides between strengths (``path`` is strongest first)."""
    best = max(held_hits.values())
    return next((l2, model) for l2, model in path if held_hits[l2] >= best - 1)


def finetuned_classification(task: LinearProbe, backbone, ctx):
    """Fine-tuning mode: backbone and a linear classifier trained end to end on augmented
    crops at ``finetune_resolution``, scored at that resolution (tasks/finetuning.py)."""
    tuned = FinetunedClassifier.train(task, backbone, ctx)
    test, space = task.eval_set(tuned.classes, tuned.eval_transform, ctx)
    logits, labels = predict(tuned.model, test, ctx)
    save_classifications(ctx, logits, labels, test, space)
    for k in reported_ks(logits.shape[1]):
        row_hits = scored_hits(logits, labels, space, k)
        yield Metric(f"top{k}", percent(row_hits), stderr=accuracy_stderr(row_hits), n=len(labels),
                     seeds=[ctx.seed], extra=tuned.extra)  # fmt: skip


@dataclass
class FinetunedClassifier:
    """A fine-tuned backbone with its linear classifier, and how to score images with it."""

    model: torch.nn.Module
    classes: list[str]
    eval_transform: object
    extra: dict

    @classmethod
    def train(cls, task: LinearProbe, backbone, ctx, indices=None) -> FinetunedClassifier:
        """Trained on the training split (only its ``indices`` when given)."""
        size = resolution(task, backbone)
        pre = dataclasses.replace(backbone.info.preprocess, size=size)
        train = task.training_set(build_transform(pre, train=True), ctx)
        sampled = train if indices is None else torch.utils.data.Subset(train, indices.tolist())
        pool, classes = resolve_pool(task.pool, backbone), len(train.classes)
        run = end_to_end(task, backbone, ctx, lambda dims: torch.nn.Linear(dims[0], classes),
                         layers=task.layers, pool=pool, dense=False)  # fmt: skip
        batches = sampled_batches(sampled, task.finetune_batch_size, ctx.seed)
        log = run.train(task, batches, torch.nn.functional.cross_entropy, ctx)
        extra = {**finetune_extra(task, log, size), "pool": pool, "n_train": len(sampled),
                 "num_classes": classes}  # fmt: skip
        eval_transform = build_transform(pre, square=task.resize == "square")
        return cls(run.model, list(train.classes), eval_transform, extra)


@torch.no_grad()
def predict(model, dataset, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of every image of ``dataset``, in batches, fed and cast as feature
    extraction is (the same workers, pinned memory and autocast)."""
    device, size = ctx.extract.device, ctx.extract.batch_size
    workers = ctx.extract.workers
    if workers is None:
        workers = decode_workers(device) if len(dataset) > 2 * size else 0
    loader = torch.utils.data.DataLoader(dataset, batch_size=size,
                                         **loader_options(device, workers))  # fmt: skip
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                              enabled=ctx.extract.dtype == "bf16")  # fmt: skip
    logits, labels = [], []
    model.eval()

    def piece(images):
        def forward(start: int, stop: int) -> torch.Tensor:
            with autocast:
                return model(images[start:stop].to(device, non_blocking=True)).float().cpu()

        return forward

    with ProgressBar(ctx.extract.progress, len(dataset), "score", status="rate") as advance:
        for images, y in loader:  # a batch that runs out of memory is scored in pieces
            logits += ctx.extract.limit.pieces(piece(images), len(images), "prediction")
            labels.append(torch.as_tensor(y))
            advance(len(images))
    return torch.cat(logits), torch.cat(labels)


def test_hits(model, rows: Rows, space, k: int) -> torch.Tensor:
    """Top-k hits of the eval rows, chunk by chunk (``scored_hits``)."""
    if space is None:
        return hits(model, rows, k)
    return torch.cat([scored_hits(model.logits(x).cpu(), y.cpu(), space, k)
                      for x, y in rows.chunks()])  # fmt: skip


SCORE_KINDS = {  # what a task's scores are, and how they become probabilities
    "logits": "softmax of the classifier's logits",
    "votes": "share of the neighbours' weighted votes",
    "probabilities": "the model's averaged class probabilities",
    "similarities": "softmax of 100 × cosine similarity (CLIP's convention)",
}


def as_probabilities(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """Scores of ``kind`` (``SCORE_KINDS``) as probabilities over the scored classes."""
    scores = scores.double()
    if kind == "logits":
        return scores.softmax(dim=1)
    if kind == "similarities":
        return (100.0 * scores).softmax(dim=1)
    scores = scores.clamp_min(0)  # classes outside a restricted space are at -inf
    return scores / scores.sum(dim=1, keepdim=True).clamp_min(1e-300)


def save_classifications(ctx, scores: torch.Tensor, labels: torch.Tensor, dataset, space, *,
                         kind: str = "logits"):  # fmt: skip
    """One row per eval image (``--save-predictions``), in the space that was scored: the
    prediction and top-5 among the candidate classes only, with their names, scores and
    probabilities (``kind`` says what the scores are); the image's label as an index of the
    same classes (``label_classes``: every class counted correct, for ObjectNet's many-to-one
    mapping) and its name; and whether top-1 was right."""
    if ctx.predictions is None:
        return
    own = list(getattr(dataset, "classes", []))
    if space is None:  # the classifier's classes are the set's own
        names, correct = own, [(label,) for label in range(max(len(own), scores.shape[1]))]
    else:
        names, correct = list(space.names), space.correct
        if space.candidates is not None:
            scores = restricted(scores, space.candidates)
    scorable = (
        scores.shape[1] if space is None or space.candidates is None else len(space.candidates)
    )
    top = scores.float().topk(min(5, scorable), dim=1)
    probabilities = as_probabilities(scores, kind).gather(1, top.indices)
    label_classes = [list(correct[label]) for label in labels.tolist()]
    ids = image_ids(dataset)
    ctx.save_predictions({
        "image": ids if len(ids) == len(labels) else [str(i) for i in range(len(labels))],
        "label": [classes[0] if classes else -1 for classes in label_classes],
        "label_classes": label_classes,
        "label_name": [label_name(own, names, label, classes)
                       for label, classes in zip(labels.tolist(), label_classes, strict=True)],
        "prediction": top.indices[:, 0].tolist(),
        "prediction_name": [class_name(names, i) for i in top.indices[:, 0].tolist()],
        "top5": top.indices.tolist(),
        "top5_names": [[class_name(names, i) for i in row] for row in top.indices.tolist()],
        "top5_scores": top.values.tolist(),
        "top5_probabilities": probabilities.tolist(),
        "score_kind": [SCORE_KINDS[kind]] * len(labels),
        "correct": scored_hits(scores, labels, space, 1).tolist(),
    })  # fmt: skip


def class_name(names: list[str], index: int) -> str:
    return names[index] if 0 <= index < len(names) else str(index)


def label_name(own: list[str], names: list[str], label: int, classes: list[int]) -> str:
    """The scored class's name when the image has one correct class, else its own class's
    (an ObjectNet class that several ImageNet classes map to)."""
    return class_name(names, classes[0]) if len(classes) == 1 else class_name(own, label)


def image_ids(dataset) -> list[str]:
    """Each item's file path where the dataset has one, else its index."""
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return [str(sample[0]) for sample in samples]
    images = getattr(dataset, "images", None)
    return [str(p) for p in images] if images is not None else [str(i) for i in range(len(dataset))]


def scored_hits(scores: torch.Tensor, labels: torch.Tensor, space, k: int) -> torch.Tensor:
    """Top-k hits against the labels, or, for a test set with its own label space, within its
    candidate classes against each image's correct set."""
    if space is None:
        return topk_hits(scores, labels, k)
    return label_space_hits(scores, labels, space, k)


def percent(row_hits: torch.Tensor) -> float:
    return 100.0 * row_hits.double().mean().item()


@dataclass
class ProbeData:
    """The probe's standardised rows: ``resident`` — whole splits as tensors on the device, when
    the training features, their bf16 copy and their kept logits fit the task's
    ``resident_budget`` (``resident_gb``, or half a GPU's free memory) — or ``streamed``: one
    cache shard at a time,
    standardised on the way, so memory stays one shard × (features + classes) whatever the
    split's size. Standardisation statistics come from the training
    split in one pass either way."""

    train: FeatureSet
    test: FeatureSet | None
    mode: str
    device: str
    scale: Standardizer | None = None
    resident: dict = field(default_factory=dict)

    @classmethod
    def build(cls, train, test, task, device: str, classes: int) -> ProbeData:
        """``test`` may be None when only training rows (and ``rows_of``) are wanted."""
        dim = train.take([0]).shape[-1] if len(train) else 0
        budget = task.resident_budget(linear_fit.free_device_bytes(device))
        resident = linear_fit.resident_bytes(len(train), dim, classes) <= budget
        data = cls(train, test, "resident" if resident else "streamed", device)
        if resident:
            x_train = train.pooled.float()
            data.scale = Standardizer.fit(x_train)
            data.resident = {"train": data.scale(x_train).to(device)}
            if test is not None:
                data.resident["test"] = data.scale(test.pooled.float()).to(device)
        else:
            data.scale = Standardizer.fit_chunks(train.chunks())
        return data

    def rows_of(self, feats: FeatureSet) -> Rows:
        """Any split's rows, standardised with the training statistics, a shard at a time."""
        labels = feats.labels.to(self.device)

        def chunks():
            for rows, part in feats.by_shard(torch.arange(len(feats))):
                yield self.scale(rows.float()).to(self.device), labels[part.to(labels.device)]

        return Rows(chunks, len(feats), len(self.scale.mean))

    def train_rows(self, indices: torch.Tensor | None = None) -> Rows:
        return self._rows("train", self.train, indices)

    def test_rows(self) -> Rows:
        return self._rows("test", self.test, None)

    def _rows(self, which: str, feats: FeatureSet, indices) -> Rows:
        labels = feats.labels.to(self.device)
        if self.mode == "resident":
            x = self.resident[which]
            return Rows.of(x, labels) if indices is None else Rows.of(x[indices], labels[indices])
        idx = torch.arange(len(feats)) if indices is None else indices.sort().values

        def chunks():  # one cache shard at a time, each read once per pass
            for rows, part in feats.by_shard(idx):
                yield self.scale(rows.float()).to(self.device), labels[part.to(labels.device)]

        return Rows(chunks, len(idx), len(self.scale.mean))


def holdout_count(n: int, fraction: float) -> int:
    """Images of a class of ``n`` held out: ``fraction`` of them, at least one when it has two
    or more."""
    return max(1, round(fraction * n)) if n > 1 else 0


def stratified_holdout(labels: torch.Tensor, fraction: float, *, seed: int):
    """Seeded split of indices: ``fraction`` of each class (at least one, if the class has
    two or more examples) held out."""
    gen = torch.Generator().manual_seed(seed)
    fit, held = [], []
    for cls in labels.unique():
        idx = torch.nonzero(labels == cls).squeeze(1)
        idx = idx[torch.randperm(len(idx), generator=gen)]
        cut = holdout_count(len(idx), fraction)
        held.append(idx[:cut])
        fit.append(idx[cut:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values
