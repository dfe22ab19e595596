"""Dense-head training memory against the number of training images: peak RSS of
``evalkit run --task ade20k-1/1 --backbone vit22b/s`` on 128 and on 1024 embedded scenes, in
both modes: the backbone in the training loop (``cache_budget_gb=0``) and cached grids read a
batch at a time from shards of at most 64 MB (label maps read per batch in both). Target:
each peak grows by less than 10% from 128 to 1024 images. (The grids of 1024 images are
~0.6 GB: held in memory, as the heads used to, the peak would grow by that much.)"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_trainer import RSS_SCRIPT, peak_rss
from benchmarks.common import report

SETTINGS = ["--set", "steps=30", "--set", "image_size=112", "--set", "batch_size=8"]


def run_peak(train_images: int, budget: str, tmp: Path) -> float:
    folder = tmp / f"{train_images}-{budget}"
    folder.mkdir()
    os.environ["EVALKIT_EMBEDDED_SCENES"] = f"{train_images},16"
    command = [
        sys.executable,
        str(RSS_SCRIPT),
        "run",
        "--task",
        "ade20k-1/1",
        "--backbone",
        "vit22b/s",
        "--data",
        "embedded",
        "--quiet",
        "--cache-dir",
        str(folder / "cache"),
        "--out",
        str(folder / "rows"),
        *SETTINGS,
        "--set",
        f"cache_budget_gb={budget}",
    ]
    return peak_rss(command, folder)


def main():
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for mode, budget in (("in_loop", "0"), ("cached_grids", "8")):
            small, large = run_peak(128, budget, tmp), run_peak(1024, budget, tmp)
            record[mode] = {
                "rss_128_mb": round(small),
                "rss_1024_mb": round(large),
                "growth": round(large / small - 1, 3),
            }
    record["target"] = "growth < 0.10 in each mode"
    report("dense_memory", record)


if __name__ == "__main__":
    main()
