"""The one resolver every task calls: a dataset's name and the run's ``DataConfig`` → its root
(the embedded stand-in, ``--data-dir``, ``$EVALKIT_DATA``, a folder of one's own or a hub
dataset) and its splits opened there, carrying the run's reading settings (decoder, content
check, kept views) and the root its per-image ids are relative to."""

from __future__ import annotations

import os
from pathlib import Path

from evalkit.data import DATASETS, DataConfig, DataKind, Dataset
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
