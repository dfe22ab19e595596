"""How far each task family's numbers move across kernel paths (``benchmarks/kernels.py``:
thread counts, MKL's code branches, oneDNN and ATen instruction caps), i.e. between machines
of the project's kind: every task runs once per path through the command line on embedded
data, each run extracting its own features into its own cache. The spread (largest minus
smallest value per metric) is what ``results/baselines/tolerances.toml`` may allow; ``--gate``
runs the regression gate's rows (``tests/regression/gate.py``) instead of single tasks.

Run: ``python -m benchmarks.repeatability [--tasks T,T] [--backbone fake] [--gate]`` (a few
minutes per path; the gate about five).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.common import report
from benchmarks.kernels import kernel_paths, run_under
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
GATE = Path(__file__).parents[1] / "tests" / "regression" / "gate.py"


def rows_under(path: dict[str, str], argv: list[str], folder: Path) -> dict[str, float]:
    """Run ``python argv... OUT`` under a kernel path with its own feature cache."""
    out = folder / "rows"
    run_under({**path, "EVALKIT_CACHE": str(folder / "cache")}, *argv, str(out), timeout=3600)
    return {f"{r['task']} {r['backbone']} {r['metric']}": r["value"] for r in load_rows([out])}


def spread(argv: list[str]) -> dict[str, dict]:
    """Per metric: each path's value and the spread over paths."""
    values: dict[str, dict[str, float]] = {}
    for name, path in kernel_paths().items():
        with tempfile.TemporaryDirectory() as tmp:
            for metric, value in rows_under(path, argv, Path(tmp)).items():
                values.setdefault(metric, {})[name] = value
    return {
        metric: {"spread": max(by.values()) - min(by.values()), "by_path": by}
        for metric, by in sorted(values.items())
    }


def task_command(task: str, backbone: str) -> list[str]:
    return [
        "-m",
        "evalkit",
        "run",
        "--task",
        task,
        "--backbone",
        backbone,
        "--data",
        "embedded",
        "--quiet",
        "--out",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(FAMILIES))
    parser.add_argument("--backbone", default="fake")
    parser.add_argument("--gate", action="store_true", help="the regression gate's rows")
    args = parser.parse_args()
    commands = (
        {"gate": [str(GATE)]}
        if args.gate
        else {task: task_command(task, args.backbone) for task in args.tasks.split(",")}
    )
    record = {"paths": kernel_paths()}
    for name, argv in commands.items():
        record[name] = spread(argv)
        moved = {m: r["spread"] for m, r in record[name].items() if r["spread"]}
        print(f"{name}: {len(record[name])} metrics, moved across paths: {moved or 'none'}")
    report(
        "repeatability-gate" if args.gate else f"repeatability-{args.backbone.replace('/', '_')}",
        record,
    )


if __name__ == "__main__":
    sys.exit(main())
