"""Classification on frozen features, as the probes share it (linear probe, few-shot, kNN,
calibration, distillation's teacher): the settings and splits of a classification task (its
training split and an evaluation split, or one of ImageNet's shifted test sets scored in its own
label space), the probe's standardised rows (resident on the device or streamed a cache shard at
a time), the seeded stratified hold-out, the choice of L2 on it, prediction with a trained model,
and top-k hits and percentages (docs/protocols.md, "Linear probe", "Few-shot", "kNN")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from evalkit.backbones.base import POOLS, build_transform
from evalkit.cache.feature_set import FeatureSet
from evalkit.cache.settings import FeatureRequest
from evalkit.core.task import LAYERS, Stage, Task, extraction_stage, one_of, resolve_pool, setting
from evalkit.data.feeding import loader_options, loader_workers
from evalkit.data.resolve import open_dataset
from evalkit.data.shifted import open_scored
from evalkit.device import gpu_free_bytes
from evalkit.errors import EvalkitError
from evalkit.heads import linear
from evalkit.heads.linear import Standardizer, hits
from evalkit.heads.logistic import FeatureRows
from evalkit.progress import ProgressBar
from evalkit.protocols.error_tables import classification_tables
from evalkit.protocols.paired_tests import classification_test
from evalkit.seeds import generator

from .predictions import scored_hits

# Test sets scored in their own label space (evalkit.data.shifted), by the split each has.
SCORED_SETS = {
    "imagenet-v2": "test",
    "imagenet-r": "test",
    "imagenet-a": "test",
    "imagenet-real": "val",
    "objectnet": "test",
}
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

    paired_test = staticmethod(classification_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(classification_tables)  # declared in error_tables.DECLARED too

    def split_features(self, backbone, ctx):
        """Cached features of the train and eval splits, with the backbone's eval transform,
        and the eval set's label space over the training classes (None for a split of the
        training dataset, whose labels are the training classes' indices, matched by name)."""
        request = FeatureRequest(layers=self.layers, pool=resolve_pool(self.pool, backbone))
        view = self.transform(backbone, ctx)
        train = self.training_set(view, ctx)
        test, space = self.eval_set(train.classes, view, ctx)
        features = [
            ctx.features(backbone, dataset, split=split, request=request)
            for split, dataset in ((self.train_split, train), (self.eval_split, test))
        ]
        return Splits(*features, space, test)

    def training_set(self, transform, ctx):
        train = open_dataset(self.dataset, self.train_split, ctx.data, transform=transform)
        self.check_training_set(train)  # before any feature is extracted
        return train

    def check_data(self, opened: dict) -> None:
        """The training split's classes and counts, checked before any backbone is built."""
        train = opened.get((self.dataset, self.train_split))
        if train is not None and getattr(train, "classes", None) is not None:
            self.check_training_set(train)

    def check_training_set(self, train):
        if len(train.classes) < 2:
            raise EvalkitError(
                f"the training split of {self.dataset} has {len(train.classes)} class "
                f"({', '.join(train.classes)}): a classifier needs at least two"
            )
        labels = getattr(train, "labels", None)
        if labels is not None:
            counts = Counter(int(label) for label in labels)
            self.check_training(
                train.classes, [counts.get(i, 0) for i in range(len(train.classes))]
            )

    def check_training(self, classes: list[str], counts: list[int]):
        """Refuse settings the training split cannot serve (``counts``: images per class)."""

    def eval_set(self, classes, transform, ctx):
        """The eval split with its labels matched to ``classes`` by name, and its label space
        over them (None for a split of the training dataset)."""
        if self.eval_split in SCORED_SETS:
            test = open_scored(self.eval_split, SCORED_SETS[self.eval_split], ctx.data, transform)
            return test, test.label_space.over(classes)
        test = open_dataset(
            self.dataset, self.eval_split, ctx.data, transform=transform, classes=classes
        )
        return test, None

    def splits(self) -> tuple[str, ...]:
        return (self.train_split, self.eval_split)

    def datasets(self) -> tuple[str, ...]:
        return (self.dataset, *([self.eval_split] if self.eval_split in SCORED_SETS else []))

    def reads(self) -> dict[str, dict[str, str]]:
        if self.eval_split not in SCORED_SETS:
            return super().reads()
        return {
            self.dataset: {self.train_split: self.train_split},
            self.eval_split: {self.eval_split: SCORED_SETS[self.eval_split]},
        }

    def extraction_stage(self, inputs) -> Stage:
        rows = inputs.sizes[self.train_split] + inputs.sizes[self.eval_split]
        return extraction_stage(inputs, rows, layers=len(self.layers))

    def transform(self, backbone, ctx):
        """The evaluation view of the backbone's images (``open_dataset`` sets its decoder)."""
        if self.resize == "square":
            return build_transform(backbone.info.preprocess, square=True)
        return backbone.transform()


def choose_l2(path, held_hits: dict[float, int]):
    """The strongest L2 whose hold-out hits are within one image of the best: a tie, or a
    single borderline image, never decides between strengths (``path`` is strongest first)."""
    best = max(held_hits.values())
    return next((l2, model) for l2, model in path if held_hits[l2] >= best - 1)


@torch.no_grad()
def predict(model, dataset, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of every image of ``dataset``, in batches, fed and cast as feature
    extraction is (the same workers, pinned memory and autocast)."""
    device, size = ctx.device, ctx.extract.batch_size
    workers = loader_workers(ctx.extract.workers, device, -(-len(dataset) // size))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=size, **loader_options(device, workers)
    )
    autocast = torch.autocast(
        torch.device(device).type, dtype=torch.bfloat16, enabled=ctx.extract.dtype == "bf16"
    )
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


def test_hits(model, rows: FeatureRows, space, k: int) -> torch.Tensor:
    """Top-k hits of the eval rows, chunk by chunk (``scored_hits``)."""
    if space is None:
        return hits(model, rows, k)
    return torch.cat(
        [scored_hits(model.logits(x).cpu(), y.cpu(), space, k) for x, y in rows.chunks()]
    )


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
        budget = task.resident_budget(gpu_free_bytes(device))
        resident = linear.resident_bytes(len(train), dim, classes) <= budget
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

    def rows_of(self, feats: FeatureSet) -> FeatureRows:
        """Any split's rows, standardised with the training statistics, a shard at a time."""
        labels = feats.labels.to(self.device)

        def chunks():
            for rows, part in feats.by_shard(torch.arange(len(feats))):
                yield self.scale(rows.float()).to(self.device), labels[part.to(labels.device)]

        return FeatureRows(chunks, len(feats), len(self.scale.mean))

    def train_rows(self, indices: torch.Tensor | None = None) -> FeatureRows:
        return self._rows("train", self.train, indices)

    def test_rows(self) -> FeatureRows:
        return self._rows("test", self.test, None)

    def _rows(self, which: str, feats: FeatureSet, indices) -> FeatureRows:
        labels = feats.labels.to(self.device)
        if self.mode == "resident":
            x = self.resident[which]
            return (
                FeatureRows.of(x, labels)
                if indices is None
                else FeatureRows.of(x[indices], labels[indices])
            )
        idx = torch.arange(len(feats)) if indices is None else indices.sort().values

        def chunks():  # one cache shard at a time, each read once per pass
            for rows, part in feats.by_shard(idx):
                yield self.scale(rows.float()).to(self.device), labels[part.to(labels.device)]

        return FeatureRows(chunks, len(idx), len(self.scale.mean))


def holdout_count(n: int, fraction: float) -> int:
    """Images of a class of ``n`` held out: ``fraction`` of them, at least one when it has two
    or more."""
    return max(1, round(fraction * n)) if n > 1 else 0


def stratified_holdout(labels: torch.Tensor, fraction: float, *, seed: int):
    """Seeded split of indices: ``fraction`` of each class (at least one, if the class has
    two or more examples) held out."""
    gen = generator(seed, "holdout")
    fit, held = [], []
    for cls in labels.unique():
        idx = torch.nonzero(labels == cls).squeeze(1)
        idx = idx[torch.randperm(len(idx), generator=gen)]
        cut = holdout_count(len(idx), fraction)
        held.append(idx[:cut])
        fit.append(idx[cut:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values
