"""Which commit changed the linear probe's speed: the probe's L2 sweep (standardise, then the
warm-started path over the 8 L2 values of the linear-probe rows) of each named commit, timed
on the same features, quiet and beside ``N`` busy processes (``--load``), in interleaved rounds.

Each commit is checked out once into a git worktree under ``--trees`` and imported from there
in its own process, so every commit runs its own code on today's data: ``bench_linear_probe``'s
synthetic 20,000 × 768 features, 100 classes, drawn once. Only the probe is timed (scikit-learn,
the benchmark's baseline, does not change between commits): wall and CPU seconds, medians over
rounds, and each commit's best hold-out top-1 (the same for commits that fit alike).
Run: ``python -m benchmarks.bisect_probe --commits A,B,HEAD [--rounds 3] [--load 0,1]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import busy_cores, report

SWEEP = """
import time, torch, evalkit
from evalkit.heads.linear import Standardizer, logistic_path
x, y, xv, yv, l2 = torch.load({data!r})
wall, cpu = time.perf_counter(), time.process_time()
scale = Standardizer.fit(x)
path = logistic_path(scale(x), y, num_classes=int(y.max()) + 1, l2_values=l2)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
best = max((m.logits(scale(xv)).argmax(1) == yv).float().mean().item() for _, m in path)
print(evalkit.__file__, wall, cpu, round(100 * best, 2))
"""


def features(trees: Path) -> Path:
    """The benchmark's features and L2 values, drawn once by today's code."""
    import torch

    from benchmarks.bench_linear_probe import synthetic
    from evalkit.protocols.classification import DEFAULT_L2

    path = trees / "features.pt"
    if not path.exists():
        torch.save((*synthetic(20000, 768, 100), DEFAULT_L2), path)
    return path


def checkout(commit: str, trees: Path) -> Path:
    """A worktree of ``commit`` (made once, named by its hash: ``HEAD`` moves)."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--short", commit], capture_output=True, text=True, check=True
    )
    tree = trees / resolved.stdout.strip()
    if not tree.exists():
        command = ["git", "worktree", "add", "--quiet", "--detach", str(tree), commit]
        subprocess.run(command, check=True)
    return tree


def sweep(tree: Path, data: Path, load: int) -> tuple[float, float, float]:
    """(wall s, CPU s, best top-1) of the sweep of the code in ``tree``. The process starts
    in the tree: ``python -c`` puts its working directory first on the path, so started in a
    checkout it would import the checkout's evalkit whatever ``PYTHONPATH`` says."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    code = SWEEP.format(data=str(data.resolve()))
    with busy_cores(load):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
    imported, wall, cpu, top1 = done.stdout.split()
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the sweep of {tree.name} imported {imported}, not its own code")
    return float(wall), float(cpu), float(top1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", required=True, help="comma-separated, oldest first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", default="0,1", help="busy processes, comma-separated")
    parser.add_argument("--trees", type=Path, default=Path("/tmp/evalkit-bisect"))
    args = parser.parse_args()
    args.trees.mkdir(parents=True, exist_ok=True)
    data, commits = features(args.trees), args.commits.split(",")
    loads = [int(n) for n in args.load.split(",")]
    trees = {commit: checkout(commit, args.trees) for commit in commits}
    times: dict[tuple[str, int], list] = {}
    for _ in range(args.rounds):
        for commit in commits:
            for load in loads:
                times.setdefault((commit, load), []).append(sweep(trees[commit], data, load))
    record = {
        f"{commit} load {load}": {
            "wall_s": round(statistics.median(t[0] for t in runs), 2),
            "cpu_s": round(statistics.median(t[1] for t in runs), 2),
            "best_top1": runs[0][2],
        }
        for (commit, load), runs in times.items()
    }
    report("bisect_probe", {"rounds": args.rounds, **record})


if __name__ == "__main__":
    main()
