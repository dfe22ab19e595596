"""The leaderboard at zoo scale: ``evalkit.publish.leaderboard`` against a plain pandas + scipy
script on the same per-image files — B backbones, one top-1 task (exact McNemar + Holm) and
one mean-error task (paired bootstrap, 2,000 resamples + Holm) on N images — in interleaved
rounds, reported as CPU-seconds and their ratio. The plain script tests what a careful analyst
would write: each file read with pandas, McNemar by ``scipy.stats.binomtest`` on the
discordant pairs, the bootstrap as one index matrix per pair. Target: evalkit within 2× of it.

    python -m benchmarks.bench_leaderboard [--backbones 20] [--images 50000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import report

RESAMPLES = 2000


def write_zoo(folder: Path, backbones: int, images: int):
    """Per-image outputs and rows of a zoo, as runs write them."""
    rng = np.random.default_rng(0)
    ids = [f"{i}.png" for i in range(images)]
    truth = rng.uniform(0.3, 0.9, images)
    base = rng.gamma(2.0, 1.0, images)
    (folder / "predictions").mkdir(parents=True)
    for task, metric in (("imagenet-linear", "top1"), ("waymo-depth-linear", "mse")):
        lines = []
        for b in range(backbones):
            if metric == "top1":
                column = {"correct": rng.uniform(size=images) < truth + 0.002 * b}
                value = 100 * float(np.mean(column["correct"]))
            else:
                column = {"mse": base + rng.normal(0, 0.5, images) + 0.001 * b}
                value = float(np.mean(column["mse"]))
            key = f"{task}{b:04d}"[-16:]
            name = f"b{b:02d}"
            pd.DataFrame({"image": ids, **column}).to_parquet(
                folder / "predictions" / f"{task}--{name}--s0--{key}.parquet"
            )
            row = {"task": task, "backbone": name, "metric": metric, "value": value, "seed": 0}
            row |= {"run_key": key, "higher_is_better": metric == "top1", "n": images}
            lines.append(json.dumps(row) + "\n")
        (folder / f"{task}.jsonl").write_text("".join(lines))


def plain(folder: Path) -> dict:
    """What an analyst's script computes: McNemar + Holm, bootstrap + Holm, per task."""
    from scipy import stats

    verdicts = {}
    for file in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(x) for x in file.read_text().splitlines()]
        frames = {
            r["backbone"]: pd.read_parquet(
                folder / "predictions" / f"{r['task']}--{r['backbone']}--s0--{r['run_key']}.parquet"
            )
            for r in rows
        }
        p = []
        for a, b in itertools.combinations(sorted(frames), 2):
            if "correct" in frames[a]:
                x, y = frames[a]["correct"].to_numpy(), frames[b]["correct"].to_numpy()
                only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
                p.append(
                    stats.binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
                )
            else:
                d = frames[a]["mse"].to_numpy() - frames[b]["mse"].to_numpy()
                rng = np.random.default_rng(0)
                means = np.array(
                    [d[rng.integers(0, len(d), len(d))].mean() for _ in range(RESAMPLES)]
                )
                far = (means <= 0).sum() if d.mean() > 0 else (means >= 0).sum()
                p.append(min(1.0, 2 * (far + 1) / (RESAMPLES + 1)))
        order = np.argsort(p)
        adjusted, running = np.ones(len(p)), 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (len(p) - rank) * p[i]))
            adjusted[i] = running
        verdicts[file.stem] = adjusted
    return verdicts


def ours(folder: Path) -> dict:
    from evalkit.publish.leaderboard import leaderboard

    board = leaderboard([folder])
    return {t["task"]: [p.get("p_holm") for p in t["pairs"]] for t in board["tasks"]}


def cpu_seconds(fn, *args) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backbones", type=int, default=20)
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args, _ = parser.parse_known_args()  # nox passes every benchmark the same arguments
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_zoo(folder, args.backbones, args.images)
        files = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
        theirs, mine = [], []
        for _ in range(args.rounds):  # interleaved: both see the same machine
            theirs.append(cpu_seconds(plain, folder))
            mine.append(cpu_seconds(ours, folder))
        report(
            "bench_leaderboard",
            {
                "backbones": args.backbones,
                "images": args.images,
                "per-image files MB": round(files / 2**20, 1),
                "plain pandas + scipy CPU-s (best)": round(min(theirs), 2),
                "evalkit leaderboard CPU-s (best)": round(min(mine), 2),
                "evalkit / plain": round(min(mine) / min(theirs), 2),
                "target": "≤ 2.0",
            },
        )


if __name__ == "__main__":
    main()
