"""The one resolver every task calls: a dataset's name and the run's ``DataConfig`` → its root
(the embedded stand-in, ``--data-dir``, ``$EVALKIT_DATA``, a folder of one's own or a hub
dataset) and its splits opened there, each carrying how it was asked to be read (``Reading``:
content check, digest memos, kept views, and the root its per-image ids are relative to); the
decoder is in its transform."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evalkit.data import DATASETS, DataConfig, DataKind, DataOptions, Dataset
from evalkit.errors import EvalkitError


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


@dataclass(frozen=True)
class Reading:
    """How ``open_dataset`` asked a split to be read, carried on it as ``dataset.reading``. A
    dataset opened by its reader directly reads as ``Reading()``."""

    verify: bool = False  # its identity hashes every file again, whatever its memoised stamp
    memo_dir: Path | None = None  # where the digests are remembered (None: the default cache's)
    pixels: str = DataOptions.pixels  # whether its decoded views are kept (``PIXELS``)
    root: Path | None = None  # what its per-image ids are relative to


def reading_of(dataset) -> Reading:
    return getattr(dataset, "reading", Reading())


def open_dataset(name: str, split: str, config: DataConfig, **options) -> Dataset:
    """One split of dataset ``name`` from where ``config`` says, read with ``options`` (a
    transform, an image size, ...: whatever that kind's reader takes). This is where the run's
    reading settings reach the data, so no task can forget them: an evaluation view decodes by
    ``config.decoder``, and the dataset carries the rest as its ``Reading``, its root included
    (per-image files name images relative to it, the same on every copy of the data)."""
    from evalkit.data.views import with_decoder

    if options.get("transform") is not None:
        options["transform"] = with_decoder(options["transform"], config.decoder)
    kind = data_kind(name)
    root = dataset_root(kind, config)
    dataset = kind.open_split(root, split, source=config.source, **options)
    dataset.reading = Reading(
        verify=config.verify, memo_dir=identity_memos(config), pixels=config.pixels, root=root
    )
    return dataset


def identity_options(dataset) -> dict:
    """How this dataset's identity is computed, as ``open_dataset`` asked: whether every file
    is hashed again, even those whose stamp (size, mtime, inode) is the one their memoised
    digest was made under, and which cache remembers the digests."""
    reading = reading_of(dataset)
    return {"content": reading.verify, "memo_dir": reading.memo_dir}


def identity_memos(config: DataConfig) -> Path:
    """Where a run's data digests are remembered: its cache's, beside its features."""
    return Path(config.cache) / "identity"


def pixels_setting(dataset) -> str:
    """Whether ``open_dataset`` asked for this dataset's views to be kept (``PIXELS``)."""
    return reading_of(dataset).pixels


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
