"""``evalkit cache``: list, verify or clear the feature cache."""

from __future__ import annotations

from pathlib import Path


def add_cache(sub) -> None:
    """inspect, verify or clear the feature cache"""
    cache = sub.add_parser("cache", help="inspect, verify or clear the feature cache")
    cache.add_argument("action", choices=("ls", "verify", "clear"))
    cache.add_argument("--backbone", help="only this backbone's entries (verify, clear)")
    cache.add_argument(
        "--all",
        action="store_true",
        help="verify: also re-hash every file whose content id is memoised (weights, towers)",
    )
    cache.add_argument("--cache-dir", type=Path)
    cache.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_cache(args, console) -> int:
    from evalkit.cache.entries import clear_cache
    from evalkit.storage.identity import cache_root

    root = args.cache_dir or cache_root()
    if args.action == "clear":
        console.print(
            f"removed {clear_cache(root, backbone=args.backbone)} cache entries from {root}"
        )
        return 0
    if args.action == "verify":
        return _verify(root, args, console)
    _list(root, console)
    return 0


def _list(root: Path, console):
    from rich.table import Table

    from evalkit.cache.entries import list_cache

    table = Table("key", "backbone", "split", "pool", "layers", "n", "shards", "complete", "MB")
    for e in list_cache(root):
        table.add_row(
            e["key"],
            e["backbone"],
            e["split"],
            e.get("request", {}).get("pool", "—"),  # decoded views have no pool or layers
            str(e.get("request", {}).get("layers", "—")),
            str(e["n"]),
            str(e["shards"]),
            "yes" if e["complete"] else "partial",
            f"{e['bytes'] / 2**20:.1f}",
        )
    console.print(table)
    console.print(f"cache: {root}")


def _verify(root: Path, args, console) -> int:
    """Re-read every shard whatever its stamp; exit 1 when anything was damaged (and deleted:
    the next run recomputes it)."""
    from rich.table import Table

    from evalkit.cache.entries import verify_cache
    from evalkit.storage.identity import recheck_content_ids
    from evalkit.storage.writes import writable

    read_only = Path(root).is_dir() and not writable(root)
    report = verify_cache(
        root, backbone=args.backbone, progress=not args.quiet, read_only=read_only
    )
    table = Table("key", "backbone", "split", "shards", "damaged")
    for e in report:
        damaged = "old format: `evalkit cache clear`" if e["old"] else str(e["bad"])
        table.add_row(e["key"], e["backbone"], e["split"], str(e["shards"]), damaged)
    console.print(table)
    bad = sum(e["bad"] for e in report)
    console.print(f"{sum(e['checked'] for e in report)} shards checked, {bad} damaged")
    if args.all:
        hashed, changed = recheck_content_ids(Path(root) / "identity")
        bad += changed
        console.print(
            f"{hashed} memoised files re-hashed, {changed} changed under a kept stamp "
            "(their ids are dropped: the next run hashes them again)"
        )
    if bad and read_only:
        console.print(
            "the cache is read-only: nothing was deleted (runs compute damaged "
            "shards in memory); ask whoever writes it to rerun `evalkit cache verify`"
        )
    elif bad:
        console.print("damaged shards were deleted: the next run recomputes them")
    return 1 if bad else 0
