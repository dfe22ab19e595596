"""How far each task family's numbers move between one and two torch threads: every task runs
twice through the command line on embedded data, each run extracting its own features into its
own cache, one with ``OMP_NUM_THREADS=1`` and one with 2. The spread (largest absolute
difference per metric) is what ``results/baselines/tolerances.toml`` allows, with this run
named beside each entry.

Run: ``python -m benchmarks.repeatability [--tasks T,T] [--backbone fake]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import report
from evalkit.core.results import load_rows

FAMILIES = (
    "imagenet-linear",
    "imagenet-5shot",
    "imagenet-knn",
    "ade20k-1/16",
    "kitti-depth-linear",
    "lit-imagenet",
    "kinetics400",
    "imagenet-ece",
)


def run_once(task: str, backbone: str, threads: int, folder: Path) -> dict[str, float]:
    out, cache = folder / f"rows{threads}", folder / f"cache{threads}"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "evalkit", "run", "--task", task, "--backbone", backbone,
               "--data", "embedded", "--out", str(out), "--cache-dir", str(cache), "--quiet"]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    return {row["metric"]: row["value"] for row in load_rows([out])}


def spread(task: str, backbone: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        one = run_once(task, backbone, 1, Path(tmp))
        two = run_once(task, backbone, 2, Path(tmp))
    return {metric: abs(one[metric] - two[metric]) for metric in sorted(one)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(FAMILIES))
    parser.add_argument("--backbone", default="fake")
    args = parser.parse_args()
    record = {}
    for task in args.tasks.split(","):
        deltas = spread(task, args.backbone)
        record[task] = {"largest": max(deltas.values(), default=0.0), "by_metric": deltas}
        print(f"{task}: largest |1 thread − 2 threads| = {record[task]['largest']:.3g}")
    report(f"repeatability-{args.backbone.replace('/', '_')}", record)


if __name__ == "__main__":
    main()
