"""``evalkit cache``: list or clear the feature cache."""

from __future__ import annotations

from pathlib import Path


def add_cache(sub) -> None:
    """inspect or clear the feature cache"""
    cache = sub.add_parser("cache", help="inspect or clear the feature cache")
    cache.add_argument("action", choices=("ls", "clear"))
    cache.add_argument("--backbone", help="clear only this backbone's entries")
    cache.add_argument("--cache-dir", type=Path)


def cmd_cache(args, console) -> int:
    from rich.table import Table

    from evalkit.cache.features import clear_cache, list_cache
    from evalkit.cache.identity import cache_root

    root = args.cache_dir or cache_root()
    if args.action == "clear":
        console.print(
            f"removed {clear_cache(root, backbone=args.backbone)} cache entries from {root}"
        )
        return 0
    table = Table("key", "backbone", "split", "pool", "layers", "n", "shards", "complete", "MB")
    for e in list_cache(root):
        table.add_row(
            e["key"],
            e["backbone"],
            e["split"],
            e["request"]["pool"],
            str(e["request"]["layers"]),
            str(e["n"]),
            str(e["shards"]),
            "yes" if e["complete"] else "partial",
            f"{e['bytes'] / 2**20:.1f}",
        )
    console.print(table)
    console.print(f"cache: {root}")
    return 0
