"""The entries the cache holds, as ``evalkit cache list|verify|clear`` sees them: one folder per
entry, in an area per kind (decoded views, features), each with its ``meta.json`` and shards;
and the bytes a backbone setup has on disk already, which ``evalkit plan`` and the runner's fit
check do not count again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from evalkit.progress import ProgressBar
from evalkit.storage import shards as files
from evalkit.storage.identity import read_json

META = "meta.json"

# What the cache keeps: decoded views (pixels.py), and features, some computed from those views
# (so views are verified first, and features derived from a damaged view follow it).
AREAS = ("pixels", "features")


def cached_bytes(root: Path, key: str) -> int:
    """Bytes of the complete feature entries of the backbone setup of ``key`` under ``root``:
    what a job of that setup will read rather than write."""
    return sum(
        entry["bytes"]
        for entry in list_cache(root)
        if entry["area"] == "features" and entry.get("backbone_key") == key and entry["complete"]
    )


def list_cache(root: Path) -> list[dict]:
    """One dict per cache entry (features, then decoded views): key, area, backbone (the
    views': their size and decoder), split, n, shards on disk, complete, bytes."""
    entries = []
    folders = [f for area in AREAS for f in sorted((Path(root) / area).glob("*"))]
    for folder in folders:
        meta = read_json(folder / META)  # {}: none yet, or another user's private entry
        if not meta:
            continue
        on_disk = list(folder.glob("shard-*.safetensors"))
        entries.append(
            {
                "key": folder.name,
                "area": folder.parent.name,
                **meta,
                "shards": len(on_disk),
                "complete": (folder / files.MANIFEST).exists(),
                "bytes": sum(f.stat().st_size for f in on_disk),
            }
        )
    return entries


def verify_cache(
    root: Path, *, backbone: str | None = None, progress: bool = True, read_only: bool = False
) -> list[dict]:
    """Re-read every shard of every entry (or of ``backbone``'s) against its checksum, place
    and the manifest, whatever its stamp; a bad shard is deleted (unless ``read_only``), so
    the next run recomputes it, and so is every feature shard computed from a view found bad
    (views are verified first). One dict per entry: key, backbone, split, shards checked, bad."""
    entries = [e for e in list_cache(root) if backbone in (None, e["backbone"])]
    total = sum(e["shards"] for e in entries)
    report = []
    with ProgressBar(progress, total, "verify cache", unit="shard") as advance:
        for entry in entries:
            folder = Path(root) / entry["area"] / entry["key"]
            if "shard_size" not in entry:  # written before shards knew their place
                report.append({**entry, "checked": 0, "bad": entry["shards"], "old": True})
                advance(entry["shards"])
                continue
            wanted = files.places(entry["key"], entry["n"], entry["shard_size"])
            bad = files.verify_shards(
                folder, wanted, recheck=True, advance=advance, read_only=read_only
            )
            derived = files.derived_from_damaged(Path(root), folder, wanted)
            if derived and not read_only:
                files.drop_derived(folder, derived)
            bad = set(bad) | set(derived)
            report.append({**entry, "checked": entry["shards"], "bad": len(bad), "old": False})
    return report


def clear_cache(root: Path, *, backbone: str | None = None) -> int:
    removed = 0
    for entry in list_cache(root):
        if backbone is None or entry["backbone"] == backbone:
            shutil.rmtree(Path(root) / entry["area"] / entry["key"])
            removed += 1
    return removed
