"""The data contract: what a dataset is (``Dataset``), how a run reads data (``DataOptions``
as asked for, ``DataConfig`` with its cache folder), and the registered kinds (``DATASETS``);
``resolve`` finds and opens them.

A *dataset kind* (``DataKind``) says where a dataset lives under the data root, which layout a
user must provide, how to write its embedded stand-in, and which reader opens a split. Kinds are
registry entries (``DATASETS``; plugins add kinds under the entry-point group
``evalkit.datasets``), so classification folders, dense layouts and the kinds to come
(image–text pairs, video clips) are resolved the same way: embedded stand-in, ``--data-dir``,
``$EVALKIT_DATA``, or Hugging Face ``datasets`` files. Readers never know which backbone reads
them: a task hands them a transform or a size and normalisation.

Modules: ``resolve`` (the one resolver every task calls: a name and a config → a
split opened where the config says), ``folder`` (class folders), ``shifted`` (ImageNet's shifted and relabelled test sets),
``captions`` (image–text pairs), ``clips`` (video), ``dense_layouts`` (segmentation and depth),
``corrupted`` and ``corruptions`` (ImageNet-C), ``model_vs_human`` and ``stimuli`` (the
benchmark and its stand-in), ``celeba`` (fairness), ``multilabel`` (pretraining images),
``embedded`` and ``scenes`` (the stand-ins), ``views`` (the evaluation view of an image),
``jpeg_ops`` (the tensor decoder's steps without torchvision's package),
``feeding`` (decoding workers and batches to the device), ``check`` (``evalkit check-data``),
``hub`` (the Hugging Face cache) and ``prepare`` (official files → the layouts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evalkit.errors import EvalkitError
from evalkit.registry import Registry

SOURCES = ("auto", "folder", "hf", "embedded")
DECODERS = ("auto", "pil", "tensor")  # how image files become evaluation views
DEFAULT_DECODER = "auto"  # tensor where its bound of PIL holds, else pil (evalkit.data.views)
PIXELS = ("auto", "cache", "decode")  # keep views where they fit | always | never


@runtime_checkable
class Dataset(Protocol):
    """What a reader returns. Items are ``(input, label)`` for classification and
    ``(input, index)`` for tasks whose targets are read with ``target(index)``; an input is an
    image tensor (C, H, W) or, for video, a clip (T, C, H, W). ``identity()`` changes whenever
    the files (or their order, labels or preprocessing size) change: it is part of the feature
    cache key. Classification readers also expose ``classes`` (names) and ``labels``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Any, Any]: ...

    def identity(self) -> str: ...


@dataclass(frozen=True)
class DataOptions:
    """How a command asks its data to be read, before it knows its cache folder."""

    source: str = "auto"  # auto: class folders, or parquet files when a split holds them
    root: Path | None = None
    verify: bool = False  # identities re-hash every file, not trusting memos of unchanged ones
    decoder: str = DEFAULT_DECODER  # how image files become evaluation views: auto | pil | tensor
    pixels: str = "auto"  # decoded views kept for the next backbone: auto | cache | decode


@dataclass(frozen=True)
class DataConfig(DataOptions):
    """How a run reads data: its ``DataOptions`` and the folder embedded stand-ins go to."""

    cache: Path = Path(".cache/evalkit")

    def __post_init__(self):
        for name, value, allowed in (
            ("data source", self.source, SOURCES),
            ("decoder", self.decoder, DECODERS),
            ("pixels", self.pixels, PIXELS),
        ):
            if value not in allowed:
                raise EvalkitError(f"unknown {name} {value!r}: choose from {', '.join(allowed)}")


@dataclass(frozen=True)
class DataKind:
    """One kind of dataset the resolver knows."""

    name: str
    dirname: str  # folder under the data root
    layout: str  # what the user provides under the data root, shown in errors
    write_embedded: Callable[[Path], Path]  # writes the stand-in under a folder; returns its root
    open_split: Callable[..., Dataset]  # (root, split, *, source, **options) -> Dataset
    targets: str = (
        "labels"  # labels, captions: options transform=, classes=; dense: size=, preprocess=
    )


DATASETS = Registry("dataset", "evalkit.datasets")
DATASETS.add("imagenet", "evalkit.data.folder:IMAGENET", "ImageNet-style class folders or parquet")
DATASETS.add(
    "captions",
    "evalkit.data.captions:CAPTIONS",
    "image–caption pairs: CSV/JSONL, WebDataset, parquet",
)
DATASETS.add(
    "jft", "evalkit.data.multilabel:JFT", "multi-label images for pretraining (jft/<split>.jsonl)"
)
DATASETS.add("ade20k", "evalkit.data.dense_layouts:ADE20K", "ADEChallengeData2016 (SceneParsing)")
for _name, _what in (
    ("imagenet-v2", "ImageNet-v2 matched frequency (class-index folders)"),
    ("imagenet-r", "ImageNet-R renditions (200 WordNet-id folders)"),
    ("imagenet-a", "ImageNet-A natural adversarial (200 WordNet-id folders)"),
    ("imagenet-real", "ImageNet val with ReaL's label sets (real.json)"),
    ("objectnet", "ObjectNet 1.0 with its mappings/ folder"),
):
    DATASETS.add(_name, f"evalkit.data.shifted:{_name.upper().replace('-', '_')}", _what)
for _name in ("kinetics400", "kinetics600", "kinetics700"):
    DATASETS.add(
        _name, f"evalkit.data.clips:{_name.upper()}", f"{_name} clips (class folders or CSV)"
    )
DATASETS.add(
    "imagenet-c",
    "evalkit.data.corrupted:IMAGENET_C",
    "ImageNet-C (<corruption>/<severity>/<class>/<image>)",
)
DATASETS.add("moments", "evalkit.data.clips:MOMENTS", "Moments in Time clips (class folders)")
DATASETS.add(
    "model-vs-human",
    "evalkit.data.model_vs_human:MODEL_VS_HUMAN",
    "model-vs-human: its 17 stimulus sets (datasets/) and human trials (raw-data/)",
)
DATASETS.add(
    "celeba", "evalkit.data.celeba:CELEBA", "CelebA: attribute and partition lists, aligned images"
)
for _name in ("waymo", "kitti", "nyu"):
    DATASETS.add(
        _name, f"evalkit.data.dense_layouts:{_name.upper()}", f"{_name} depth, flattened layout"
    )
