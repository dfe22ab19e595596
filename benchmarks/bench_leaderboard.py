"""The leaderboard at zoo scale: ``evalkit.publish.leaderboard`` against a plain pandas + numpy +
scipy script on the same per-image files, in interleaved rounds, as CPU-seconds and their
ratio; then evalkit alone on a larger zoo (wall seconds) and the peak memory of each, measured
in a fresh process.

The zoo has six tasks, each tested as the suite tests it: two top-1 tasks (``imagenet-linear``,
``imagenet-knn``: exact McNemar on one-seed cells), two means of a per-image value
(``imagenet-5shot``'s share of seeds right, ``waymo-depth-linear``'s squared error: a paired
bootstrap of 2,000 resamples), and two metrics of sums over images (``imagenet-ece``: each
confidence bin's gap; ``ade20k-1/16``: each class's intersection and union, on 2,000 images
with 150 classes as the real validation set has), each with Holm's correction over its pairs.

The plain script is what a careful analyst would write: each file read with pandas, McNemar by
``scipy.stats.binomtest`` on the discordant images, and one set of bootstrap resamples per task
shared by all its pairs, drawn as index matrices (a mean by a gather; ECE and mIoU from each
resample's counts per image, one matrix product per cell and chunk), each pair's differences two
cells' arrays subtracted. Targets: evalkit's CPU and peak memory above imports within 1.5× of
it at 20 backbones × 5,000 images and within 1.0× at 20 × 50,000; 50 backbones × 50,000 within
a minute.

    python -m benchmarks.bench_leaderboard [--backbones 20] [--images 50000] [--rounds 1]
                                           [--zoo 50]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import report

RESAMPLES = 2000
CHUNK = 64
ADE_IMAGES, ADE_CLASSES, ECE_BINS = 2000, 150, 15
TASKS = {  # task: (metric, kind of per-image output)
    "imagenet-linear": ("top1", "correct"),
    "imagenet-knn": ("top1/k=20", "correct"),
    "imagenet-5shot": ("top1", "correct_share"),
    "waymo-depth-linear": ("mse", "mse"),
    "imagenet-ece": ("ece", "confidence"),
    "ade20k-1/16": ("miou", "intersection"),
}


def cell_outputs(kind: str, images: int, b: int, rng) -> tuple[dict, float]:
    """One backbone's per-image outputs of a task, and the row's value computed from them."""
    if kind == "correct":
        correct = rng.uniform(size=images) < 0.6 + 0.002 * b
        return {"correct": correct}, 100 * float(correct.mean())
    if kind == "correct_share":
        share = rng.binomial(3, 0.5 + 0.002 * b, images) / 3
        return {"correct_share": share}, 100 * float(share.mean())
    if kind == "mse":
        mse = rng.gamma(2.0, 1.0, images) + 0.001 * b
        return {"mse": mse}, float(mse.mean())
    if kind == "confidence":
        confidence = rng.uniform(0.2, 1.0, images)
        correct = rng.uniform(size=images) < confidence - 0.05 + 0.001 * b
        columns = {"confidence": confidence, "correct": correct, "bins": np.full(images, ECE_BINS)}
        return columns, ece(ece_rows(confidence, correct.astype(float), ECE_BINS).sum(0), images)
    truth = rng.integers(0, 400, (images, ADE_CLASSES)) * (rng.uniform(size=(images, 1)) < 0.9)
    hit = rng.binomial(truth, 0.5 + 0.002 * b)
    columns = {"intersection": list(hit), "union": list(2 * truth - hit)}
    return columns, miou(np.hstack([hit, 2 * truth - hit]).sum(0))


def write_zoo(folder: Path, backbones: int, images: int):
    """Per-image outputs and rows of a zoo, as runs write them."""
    rng = np.random.default_rng(0)
    (folder / "predictions").mkdir(parents=True)
    for task, (metric, kind) in TASKS.items():
        count = min(images, ADE_IMAGES) if task.startswith("ade20k") else images
        ids, slug, lines = [f"{i}.png" for i in range(count)], task.replace("/", "_"), []
        for b in range(backbones):
            columns, value = cell_outputs(kind, count, b, rng)
            key, name = f"{b:016d}", f"b{b:02d}"
            frame = pd.DataFrame({"image": ids})
            for column, values in columns.items():
                frame[column] = values
            frame.to_parquet(folder / "predictions" / f"{slug}--{name}--s0--{key}.parquet")
            row = {"task": task, "backbone": name, "metric": metric, "value": value, "seed": 0}
            row |= {"run_key": key, "higher_is_better": metric not in ("mse", "ece"), "n": count}
            lines.append(json.dumps(row) + "\n")
        (folder / f"{slug}.jsonl").write_text("".join(lines))


def ece_rows(confidence, correct, bins: int) -> np.ndarray:
    index = np.clip(np.searchsorted(np.arange(1, bins + 1) / bins, confidence), 0, bins - 1)
    rows = np.zeros((len(confidence), bins))
    rows[np.arange(len(confidence)), index] = correct - confidence
    return rows


def ece(totals: np.ndarray, images: int) -> np.ndarray:
    return np.abs(totals).sum(axis=-1) / images


def miou(totals: np.ndarray) -> np.ndarray:
    hit, union = np.split(totals, 2, axis=-1)
    present = union > 0
    ratio = np.divide(hit, union, out=np.zeros(hit.shape), where=present)
    return 100 * ratio.sum(axis=-1) / np.maximum(present.sum(axis=-1), 1)


def plain(folder: Path) -> dict:
    """What an analyst's script computes: per task, every pair's p-value, Holm-adjusted."""
    return {file.stem: plain_task(folder, file) for file in sorted(folder.glob("*.jsonl"))}


def plain_task(folder: Path, file: Path) -> dict:
    from scipy import stats

    rows = [json.loads(x) for x in file.read_text().splitlines()]
    frames = {
        r["backbone"]: pd.read_parquet(
            folder / "predictions" / f"{file.stem}--{r['backbone']}--s0--{r['run_key']}.parquet"
        )
        for r in rows
    }
    kind, count = TASKS[rows[0]["task"]][1], rows[0]["n"]
    pairs, p = list(itertools.combinations(sorted(frames), 2)), []
    if kind != "correct":  # one set of resamples for every cell, as a careful analyst shares it
        observed, resampled = shared_bootstrap({s: prepared(f, kind) for s, f in frames.items()})
    for a, b in pairs:
        if kind == "correct":
            x, y = frames[a]["correct"].to_numpy(), frames[b]["correct"].to_numpy()
            only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
            p.append(stats.binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0)
        else:
            p.append(bootstrap_p(observed[a] - observed[b], resampled[a] - resampled[b], count))
    return {frozenset(pair): adjusted for pair, adjusted in zip(pairs, holm(p), strict=True)}


def prepared(frame: pd.DataFrame, kind: str):
    """(per-image values or rows, statistic of resample counts) of one cell."""
    if kind in ("correct_share", "mse"):
        return frame[kind].to_numpy(float), None
    if kind == "confidence":
        rows = ece_rows(frame["confidence"].to_numpy(), frame["correct"].to_numpy(float), ECE_BINS)
        return rows, lambda totals: ece(totals, len(rows))
    rows = np.hstack([np.stack(frame["intersection"]), np.stack(frame["union"])]).astype(float)
    return rows, miou


def shared_bootstrap(cells: dict) -> tuple[dict, dict]:
    """Each cell's observed statistic and its value on each of one shared set of resamples of
    the images (index matrices, chunk by chunk; a mean by a gather, a statistic of sums from
    each resample's counts per image by one matrix product): every pair's difference is then
    two cells' arrays subtracted."""
    images, rng = len(next(iter(cells.values()))[0]), np.random.default_rng(0)
    observed = {
        s: (v.mean() if metric is None else metric(v.sum(0))) for s, (v, metric) in cells.items()
    }
    resampled = {s: [] for s in cells}
    for start in range(0, RESAMPLES, CHUNK):
        draws = rng.integers(0, images, size=(min(CHUNK, RESAMPLES - start), images))
        counts = None
        for s, (values, metric) in cells.items():
            if metric is None:
                resampled[s].append(values[draws].mean(axis=1))
                continue
            if counts is None:
                offsets = draws + images * np.arange(len(draws))[:, None]
                counts = np.bincount(offsets.ravel(), minlength=draws.size)
                counts = counts.reshape(len(draws), images).astype(float)
            resampled[s].append(metric(counts @ values))
    return observed, {s: np.concatenate(v) for s, v in resampled.items()}


def bootstrap_p(observed: float, differences: np.ndarray, images: int) -> float:
    """A pair's two-sided bootstrap p-value: from the far side's count where at least 10
    resamples lie there, else from the resamples' spread (a count cannot go below 2/2,001,
    which Holm over 190 pairs would lift past any level), read on Student's t."""
    from scipy import stats

    far = (differences <= 0).sum() if observed > 0 else (differences >= 0).sum()
    if far >= 10:
        z = -stats.norm.ppf(min(1.0, 2 * (far + 1) / (RESAMPLES + 1)) / 2)
    else:
        z = abs(observed) / differences.std(ddof=1)
    return float(min(1.0, 2 * stats.t.sf(z * np.sqrt((images - 1) / images), images - 1)))


def holm(p: list[float]) -> np.ndarray:
    adjusted, running = np.ones(len(p)), 0.0
    for rank, i in enumerate(np.argsort(p)):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def ours(folder: Path) -> dict:
    from evalkit.publish.leaderboard import leaderboard

    board = leaderboard([folder])
    return {
        t["task"].replace("/", "_"): {
            frozenset((p["a"], p["b"])): p.get("p_holm") for p in t["pairs"]
        }
        for t in board["tasks"]
    }


PEAK = """
import json, re, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from benchmarks.bench_leaderboard import {which} as go, warm_imports
def mb(field):
    return int(re.search(field + r":\\s+(\\d+)", Path("/proc/self/status").read_text())[1]) / 1024
warm_imports({which!r})
imported = mb("VmRSS")
wall, cpu = time.perf_counter(), time.process_time()
p = go(Path({folder!r}))
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
p = {{task: {{"|".join(sorted(pair)): value for pair, value in pairs.items()}} for task, pairs in p.items()}}
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "peak_mb": mb("VmHWM"), "imports_mb": imported, "p": p}}))
"""


def warm_imports(which: str):
    """What each side imports before it reads a file (its fixed memory, not the zoo's)."""
    import scipy.stats  # noqa: F401

    if which == "ours":  # a built-in task's paired test is read without importing the task
        from evalkit.publish import leaderboard  # noqa: F401


def fresh_process(which: str, folder: Path) -> dict:
    """``which`` (``ours`` or ``plain``) on ``folder`` in a new interpreter, after its imports:
    wall and CPU seconds, peak and post-import resident memory, and every pair's p-value."""
    root = str(Path(__file__).resolve().parents[1])
    code = PEAK.format(root=root, which=which, folder=str(folder))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict_flips(theirs: dict, mine: dict, level: float = 0.05) -> dict:
    """Pairs whose verdict at ``level`` differs between the two, by kind of test: McNemar is
    exact on both sides, and both bootstraps read a thin far side by the resamples' spread."""
    flips = {"McNemar": 0, "bootstrap": 0}
    for task, pairs in theirs.items():
        kind = "McNemar" if TASKS[task.replace("_", "/")][1] == "correct" else "bootstrap"
        flips[kind] += sum(
            bool(p <= level) != bool(mine[task][pair] <= level) for pair, p in pairs.items()
        )
    return flips


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backbones", type=int, default=20)
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--zoo", type=int, default=50, help="backbones of evalkit's timed zoo")
    args, _ = parser.parse_known_args()  # nox passes every benchmark the same arguments
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder, big = Path(tmp) / "zoo", Path(tmp) / "big"
        write_zoo(folder, args.backbones, args.images)
        files = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
        theirs, mine = [], []
        for _ in range(args.rounds):  # interleaved: both see the same machine
            theirs.append(fresh_process("plain", folder))
            mine.append(fresh_process("ours", folder))
        write_zoo(big, args.zoo, args.images)
        zoo = fresh_process("ours", big)
    plain_run, our_run = (min(runs, key=lambda r: r["cpu_s"]) for runs in (theirs, mine))
    above = {
        name: r["peak_mb"] - r["imports_mb"]
        for name, r in (("plain", plain_run), ("ours", our_run))
    }
    report(
        "bench_leaderboard",
        {
            "backbones": args.backbones,
            "load (1 min) at start / end": f"{load:.1f} / {os.getloadavg()[0]:.1f}",
            "tasks": len(TASKS),
            "images": args.images,
            "per-image files MB": round(files / 2**20, 1),
            "plain CPU-s (best)": round(plain_run["cpu_s"], 2),
            "evalkit CPU-s (best)": round(our_run["cpu_s"], 2),
            "evalkit / plain CPU": round(our_run["cpu_s"] / plain_run["cpu_s"], 3),
            "target CPU": "≤ 1.5 at 5,000 images, ≤ 1.0 at 50,000",
            "verdicts differing at 0.05": verdict_flips(plain_run["p"], our_run["p"]),
            "plain peak MB (after imports)": f"{plain_run['peak_mb']:.0f} ({plain_run['imports_mb']:.0f})",
            "evalkit peak MB (after imports)": f"{our_run['peak_mb']:.0f} ({our_run['imports_mb']:.0f})",
            "evalkit / plain peak above imports": round(above["ours"] / above["plain"], 2),
            "target memory": "≤ 1.5 at 5,000 images, ≤ 1.0 at 50,000",
            f"evalkit wall s at {args.zoo} backbones": round(zoo["wall_s"], 1),
            f"evalkit peak MB at {args.zoo} backbones": round(zoo["peak_mb"]),
            "target wall at 50 backbones": "≤ 60 s",
        },
    )


if __name__ == "__main__":
    main()
