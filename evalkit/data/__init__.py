"""Where datasets come from: real layouts under ``--data-dir``/``EVALKIT_DATA``, Hugging Face
``datasets`` files, or the embedded procedural stand-ins (written to disk in the same layout).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError

SOURCES = ("auto", "folder", "hf", "embedded")


@dataclass(frozen=True)
class DataConfig:
    source: str = "auto"  # auto: class folders, or parquet files when a split holds them
    root: Path | None = None
    cache: Path = Path(".cache/evalkit")  # embedded stand-ins are written here

    def __post_init__(self):
        if self.source not in SOURCES:
            raise EvalkitError(
                f"unknown data source {self.source!r}: choose from {', '.join(SOURCES)}"
            )


@dataclass(frozen=True)
class ClassificationData:
    """A class-folder dataset: where it lives and the layout users must provide."""

    dirname: str
    splits: tuple[str, ...] = ("train", "val")

    @property
    def layout(self) -> str:
        return f"{self.dirname}/{{{','.join(self.splits)}}}/<class>/<image>"


CLASSIFICATION = {"imagenet": ClassificationData("imagenet")}


def default_data_root() -> Path | None:
    value = os.environ.get("EVALKIT_DATA")
    return Path(value) if value else None


def open_classification(name: str, split: str, *, transform, config: DataConfig):
    """One split of a classification dataset, read with its transform."""
    from evalkit.data.folder import ImageFolder, open_hf_split

    spec = CLASSIFICATION[name]
    if config.source == "embedded":
        from evalkit.data.embedded import ShapesSpec, write_shapes

        root = write_shapes(ShapesSpec(), config.cache / "embedded")
        return ImageFolder(root / split, transform, layout_hint=spec.layout)
    base = config.root or default_data_root()
    if base is None:
        raise EvalkitError(
            f"no data directory for {name!r}: pass --data-dir DIR (or set EVALKIT_DATA) with "
            f"DIR/{spec.layout}, or use --data embedded"
        )
    root = Path(base) / spec.dirname
    if config.source == "hf" or (config.source == "auto" and _has_parquet(root, split)):
        return open_hf_split(root, split, transform)
    return ImageFolder(root / split, transform, layout_hint=f"{base}/{spec.layout}")


def _has_parquet(root: Path, split: str) -> bool:
    return any((root / split).glob("*.parquet")) or any(root.glob(f"data/{split}-*.parquet"))
