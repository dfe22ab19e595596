"""The data contract and the one resolver every task calls.

A *dataset kind* (``DataKind``) says where a dataset lives under the data root, which layout a
user must provide, how to write its embedded stand-in, and which reader opens a split. Kinds are
registry entries (``DATASETS``; plugins add kinds under the entry-point group
``evalkit.datasets``), so classification folders, dense layouts and the kinds to come
(image–text pairs, video clips) are resolved the same way: embedded stand-in, ``--data-dir``,
``$EVALKIT_DATA``, or Hugging Face ``datasets`` files. Readers never know which backbone reads
them: a task hands them a transform or a size and normalisation.

Modules: ``folder`` (class folders), ``shifted`` (ImageNet's shifted and relabelled test sets),
``captions`` (image–text pairs), ``clips`` (video), ``dense_layouts`` (segmentation and depth),
``corrupted`` and ``corruptions`` (ImageNet-C), ``model_vs_human`` and ``stimuli`` (the
benchmark and its stand-in), ``celeba`` (fairness), ``multilabel`` (pretraining images),
``embedded`` and ``scenes`` (the stand-ins), ``views`` (the evaluation view of an image),
``feeding`` (decoding workers and batches to the device), ``check`` (``evalkit check-data``),
``hub`` (the Hugging Face cache) and ``prepare`` (official files → the layouts).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evalkit.errors import EvalkitError
from evalkit.registry import Registry

SOURCES = ("auto", "folder", "hf", "embedded")
DECODERS = ("auto", "pil", "tensor")  # how image files become evaluation views
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
class DataConfig:
    source: str = "auto"  # auto: class folders, or parquet files when a split holds them
    root: Path | None = None
    cache: Path = Path(".cache/evalkit")  # embedded stand-ins are written here
    verify: bool = False  # identities re-hash every file, not trusting memos of unchanged ones
    decoder: str = "auto"  # how image files become evaluation views: auto | pil | tensor
    pixels: str = "auto"  # decoded views kept for the next backbone: auto | cache | decode

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


def default_data_root() -> Path | None:
    value = os.environ.get("EVALKIT_DATA")
    return Path(value) if value else None


OWN = "folder:"  # ``folder:PATH``: a classification set of one's own, not a registered kind


HUB = "hf:"  # ``hf:ORG/NAME[@REVISION]``: a dataset repository of the Hugging Face hub


def data_kind(name: str) -> DataKind:
    """The registered kind ``name``; for ``folder:PATH`` a class-folder set at PATH; for
    ``hf:ORG/NAME[@REVISION]`` the files of that hub dataset revision (from the hub cache)."""
    if name.startswith(HUB):
        from evalkit.data.folder import hub_dataset_kind

        return hub_dataset_kind(name.removeprefix(HUB))
    if not name.startswith(OWN):
        return DATASETS.get(name).load()
    from evalkit.data.folder import own_folder_kind

    return own_folder_kind(Path(name.removeprefix(OWN)).expanduser())


def is_stand_in(name: str, config: DataConfig) -> bool:
    """Whether dataset ``name`` is read from evalkit's embedded stand-in: ``--data embedded``
    serves registered kinds only; a folder of one's own or a hub dataset is read as it is."""
    return config.source == "embedded" and not name.startswith((OWN, HUB))


def hub_source(name: str | None) -> str | None:
    """For a hub dataset, ``hf:ORG/NAME@<commit>`` its revision resolved to; else None."""
    return data_kind(name).name if isinstance(name, str) and name.startswith(HUB) else None


def open_dataset(name: str, split: str, config: DataConfig, **options) -> Dataset:
    """One split of dataset ``name`` from where ``config`` says, read with ``options`` (a
    transform, an image size, ...: whatever that kind's reader takes). This is where the run's
    reading settings reach the data, so no task can forget them: an evaluation view decodes by
    ``config.decoder``, and the dataset carries ``config.verify``, ``config.pixels`` and its
    root (per-image files name images relative to it, the same on every copy of the data)."""
    from evalkit.data.views import with_decoder

    if options.get("transform") is not None:
        options["transform"] = with_decoder(options["transform"], config.decoder)
    kind = data_kind(name)
    root = dataset_root(kind, config)
    dataset = kind.open_split(root, split, source=config.source, **options)
    dataset.verify_content = config.verify
    dataset.pixels = config.pixels
    dataset.data_root = root
    dataset.memo_dir = identity_memos(config)
    return dataset


def verifies_content(dataset) -> bool:
    """Whether ``open_dataset`` asked this dataset's identity to hash every file again, even
    those whose stamp (size, mtime, inode) is the one their memoised digest was made under."""
    return getattr(dataset, "verify_content", False)


def identity_options(dataset) -> dict:
    """How this dataset's identity is computed, as ``open_dataset`` asked: whether every file
    is hashed again (``verify_content``), and which cache remembers the digests."""
    return {"content": verifies_content(dataset), "memo_dir": getattr(dataset, "memo_dir", None)}


def identity_memos(config: DataConfig) -> Path:
    """Where a run's data digests are remembered: its cache's, beside its features."""
    return Path(config.cache) / "identity"


def pixels_setting(dataset) -> str:
    """Whether ``open_dataset`` asked for this dataset's views to be kept (``PIXELS``)."""
    return getattr(dataset, "pixels", "auto")


def data_identity(name: str, config: DataConfig) -> str:
    """Identity of every file under dataset ``name``'s root (one walk): what a run read."""
    from evalkit.storage.identity import tree_identity

    kind = data_kind(name)
    root = dataset_root(kind, config)
    return tree_identity(root, content=config.verify, memo_dir=identity_memos(config))


def dataset_root(kind: DataKind, config: DataConfig) -> Path:
    if Path(kind.dirname).is_absolute():  # a set of one's own is where it was named
        return Path(kind.dirname)
    if config.source == "embedded":
        return kind.write_embedded(config.cache / "embedded")
    base = config.root or default_data_root()
    if base is None:
        raise EvalkitError(
            f"no data directory for {kind.name!r}: pass --data-dir DIR (or set EVALKIT_DATA) "
            f"with DIR/{kind.layout}, or use --data embedded"
        )
    return Path(base) / kind.dirname
