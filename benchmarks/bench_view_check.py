"""What checking decoded views on every read costs: one pixel-cache shard of realistic views
(1,024 of 224², uint8, 154 MB, cut from photo-like noise so nothing compresses) read from the
page cache as the pixel cache reads it (``load_checked``: every tensor summed with XXH3-128
and its place and manifest compared), against reading it unchecked (``read_shard``, the
stamp-trusting read it replaces). ``read_shard`` maps the file and reads nothing until the
views are used, so each read is followed by what every use does at least: one copy of the
views into a batch buffer (the loader's pinned copy). Interleaved rounds, median per view.

Target: the check costs at most a fifth of the pixel cache's input stage per view (77 µs in
docs/data.md's ``bench_loader`` table), so a second backbone still needs one core for it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import report
from evalkit.storage import shards as files


def write_shard(folder: Path, views: int, size: int) -> files.Place:
    """A view shard as the pixel cache writes it, with its manifest."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (views, 3, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.arange(views) % 1000
    place = files.places("bench", views, views)[0]
    files.save_shard(folder, place, {"images": images, "labels": labels})
    files.write_manifest(folder, [place], views)
    return place


def timed(read, buffer: torch.Tensor) -> float:
    """Seconds to read a shard and copy its views into ``buffer`` (the bytes are touched)."""
    start = time.perf_counter()
    buffer.copy_(read()["images"])
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=1024)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the pixel cache reads a shard on one thread
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        place = write_shard(folder, args.views, args.size)
        path = files.shard_path(folder, place.index)
        buffer = torch.empty(args.views, 3, args.size, args.size, dtype=torch.uint8)
        plain, checked = [], []
        for _ in range(args.rounds + 1):  # the first round warms the page cache
            plain.append(timed(lambda: files.read_shard(path), buffer))
            checked.append(timed(lambda: files.load_checked(folder, place, what="views"), buffer))
        plain, checked = statistics.median(plain[1:]), statistics.median(checked[1:])
        per_view = 1e6 / args.views
        report(
            "view_check",
            {
                "views": args.views,
                "view_kb": round(3 * args.size**2 / 1024, 1),
                "shard_mb": round(path.stat().st_size / 1e6, 1),
                "unchecked_us_per_view": round(plain * per_view, 1),
                "checked_us_per_view": round(checked * per_view, 1),
                "check_us_per_view": round((checked - plain) * per_view, 1),
                "check_share_of_unchecked_read": round((checked - plain) / plain, 2),
                "check_share_of_input_stage": round((checked - plain) * per_view / 77.5, 2),
                "target_share_of_input_stage_at_most": 0.2,
            },
        )


if __name__ == "__main__":
    main()
