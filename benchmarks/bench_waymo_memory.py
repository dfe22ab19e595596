"""``evalkit prepare waymo``'s peak memory and time per frame on real-size sensors (TOP LiDAR
64 × 2650, FRONT LiDAR 200 × 600, both returns stored; a 1920 × 1280 FRONT camera): one segment
of 1 frame against one of 8. Memory must not grow with a segment's length (target: 8 frames
within 10% of 1 frame's peak; a real segment has ~199). Each run is its own process.

Run: ``python -m benchmarks.bench_waymo_memory``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import report
from benchmarks.waymo_release import write_release

TARGET = 1.10


def prepare_once(source: Path, dest: Path) -> tuple[float, float]:
    """(peak RSS in MB, wall seconds) of one ``evalkit prepare waymo`` process."""
    rss_dir = dest / "rss"
    rss_dir.mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        "benchmarks.rss",
        "prepare",
        "waymo",
        str(source),
        str(dest),
        "--splits",
        "training",
        "--quiet",
    ]
    start = time.perf_counter()
    subprocess.run(argv, check=True, env={**os.environ, "EVALKIT_RSS_DIR": str(rss_dir)})
    seconds = time.perf_counter() - start
    return json.loads((rss_dir / "rss-0.json").read_text())["max_rss_mb"], seconds


def main():
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for frames in (1, 8):
            source = write_release(Path(tmp) / f"v2-{frames}", frames=frames)
            results[frames] = prepare_once(source, Path(tmp) / f"out-{frames}")
    (one_mb, one_s), (eight_mb, eight_s) = results[1], results[8]
    ratio = eight_mb / one_mb
    report(
        "waymo_memory",
        {
            "peak_mb_1_frame": round(one_mb, 1),
            "peak_mb_8_frames": round(eight_mb, 1),
            "ratio_8_vs_1": round(ratio, 3),
            "target": f"<= {TARGET}",
            "seconds_per_frame": round((eight_s - one_s) / 7, 3),
            "process_seconds_1_frame": round(one_s, 2),
            "met": ratio <= TARGET,
        },
    )


if __name__ == "__main__":
    main()
