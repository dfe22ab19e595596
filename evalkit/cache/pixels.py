"""The pixel cache: a split's evaluation views (uint8, after resize and centre crop), decoded
once and read by every later backbone that shares the geometry.

Most ViTs of timm and open_clip see 224 px by the same resize, crop and interpolation and
differ only in their mean and std, which ``extract`` applies on the device. So the decoded
views of a split serve them all: the first backbone's extraction writes them beside its
features, the next reads them instead of decoding (a copy of bytes, not a JPEG decode and a
resize). An entry is keyed by the data's identity, the split and subset, and the view's
geometry and decoder (``EvalView``), and is stored as the feature cache stores features:
checksummed shards with the same boundaries, each written whole or not at all.

Every read of a view shard is checked against its checksum, whatever its stamp: a view
changed in place (bit rot, a faulty copy) would otherwise become a new backbone's features
without a word. Summing costs about 10 µs a 224² view, a seventh of the input stage
(``benchmarks/bench_view_check.py``); a damaged shard is reported, removed and its images
decoded again. An entry another user keeps private in a shared cache is read where it can be
and never written or removed (``shards.may_write``).

``--pixels auto`` (the default) keeps views where they take at most a quarter of the cache
disk's free space (ImageNet's 50,000 validation images at 224² are 7.5 GB); ``cache`` keeps them
whatever the size; ``decode`` never reads or writes them.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.data.resolve import pixels_setting
from evalkit.data.views import EvalView
from evalkit.errors import EvalkitError, warn, warn_once
from evalkit.storage import shards as files
from evalkit.storage.identity import spec_key, write_json

FORMAT_VERSION = 1
FREE_SHARE = 0.25  # auto keeps views when they fit in this share of the free disk
META = "meta.json"


def pixel_view(dataset) -> EvalView | None:
    """The dataset's evaluation view when its items are uint8 views of single images."""
    view = getattr(dataset, "transform", None)
    return view if isinstance(view, EvalView) else None


def subset_key(subset) -> str:
    """A subset of a split's indices, as cache keys name it ("all" for the whole split)."""
    return "all" if subset is None else spec_key(list(subset), length=64)


def pixel_bytes(view: EvalView, images: int) -> int:
    return images * 3 * view.size * view.size


@dataclass
class PixelStore:
    """The cached views of one (data, split, subset, view): shard i holds the views of the
    same indices as the features' shard i."""

    folder: Path
    wanted: list[files.Place]
    writable: bool

    def ready(self) -> set[int]:
        """The shards on disk; each is checked in full as it is read (``read``)."""
        if not self.folder.exists():
            return set()
        return {p.index for p in self.wanted if files.shard_path(self.folder, p.index).exists()}

    def read(self, index: int) -> dict | None:
        """Shard ``index``'s images and labels, checked against its checksum on every read (a
        stamp kept over bytes changed in place vouches for nothing); None when the check fails
        (it is reported and removed) or this user may not read it: its images are then decoded
        again."""
        place = self.wanted[index]
        return files.load_checked(self.folder, place, read_only=not self.writable, what="views")

    def save(self, index: int, images: torch.Tensor, labels: torch.Tensor):
        """Keep a shard's views; a write that fails (a full disk) stops keeping them, with a
        warning, and the extraction goes on: the views only save the next backbone time."""
        if not self.writable:
            return
        try:
            files.save_shard(self.folder, self.wanted[index], {"images": images, "labels": labels})
            if all(files.shard_path(self.folder, p.index).exists() for p in self.wanted):
                files.write_manifest(self.folder, self.wanted, self.wanted[-1].stop)
        except EvalkitError as exc:
            self.writable = False
            warn(f"decoded images are no longer kept for the next backbone: {exc}")


def pixel_store(dataset, settings, *, dataset_id: str, split: str, subset_key: str, n: int):
    """The pixel cache entry of this extraction, or None where none is used: ``--pixels
    decode``, no cache, items that are not image views, or (``auto``) views that do not fit."""
    view, asked = pixel_view(dataset), pixels_setting(dataset)
    if asked == "decode" or settings.cache_dir is None or view is None:
        return None
    spec = {
        "format": FORMAT_VERSION,
        "data": dataset_id,
        "view": view.geometry(),
        "split": split,
        "subset": subset_key,
        "shard_size": settings.shard_size,
    }
    key = spec_key(spec)
    folder = Path(settings.cache_dir) / "pixels" / key
    wanted = files.places(key, n, settings.shard_size)
    if settings.read_only or not _writable_area(folder.parent) or not files.may_write(folder):
        return (
            PixelStore(folder, wanted, writable=False)
            if files.searchable(folder, "views")
            else None
        )
    if asked == "auto" and not folder.exists() and not fits(folder, view, n):
        return None
    try:
        _write_meta(folder, view, split, n, settings.shard_size)
    except EvalkitError as exc:  # a full disk: the views only save the next backbone time
        warn(f"decoded images are not kept for the next backbone: {exc}")
        return None
    return PixelStore(folder, wanted, writable=True)


def _writable_area(area: Path) -> bool:
    """Whether views can be kept under ``area`` (``<cache>/pixels``). One that exists and
    cannot be written (a team's read-only copy) is read and never written, with one warning;
    features are still written to the feature cache beside it."""
    from evalkit.storage.writes import writable

    if not area.exists() or writable(area):
        return True
    warn_once(
        area,
        f"{area} cannot be written (permissions or a read-only mount): its decoded views "
        "are read where they serve, and no new ones are kept",
    )
    return False


def fits(folder: Path, view: EvalView, images: int) -> bool:
    """Whether ``images`` views take at most ``FREE_SHARE`` of the free space where they go."""
    existing = next(p for p in [folder, *folder.parents] if p.exists())
    return pixel_bytes(view, images) <= FREE_SHARE * shutil.disk_usage(existing).free


def _write_meta(folder: Path, view: EvalView, split: str, n: int, shard_size: int):
    if (folder / META).exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "backbone": f"(pixels {view.size}px {view.interpolation}, {view.decoder})",
        "split": split,
        "view": view.geometry(),
        "n": n,
        "shard_size": shard_size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_json(folder / META, meta)
