"""The linear probe's memory at scale: peak RSS of the probe over cached features of n rows
(d = 1536, 100 classes), each n in a fresh process, through the task's own code (the feature
view over cache shards, ``ProbeData``, the L2 path and the refit). Baseline: the bytes of one
copy of the training features.

Targets: in the streamed mode, peak RSS grows by less than one copy of the features from the
smallest n to the largest; at the middle n the streamed probe takes at least 0.8× the speed of
the resident (whole-split) one; and a cache stored in fp16 gives a top-1 within 0.1 points of
an fp32 one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import peak_rss_mb, report

CLASSES, SHARD = 100, 4096


def write_cache(folder: Path, n: int, dim: int, seed: int, storage=torch.float32):
    """Synthetic class-structured features, written as the feature cache writes them."""
    from evalkit.storage.shards import Place, save_shard

    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(CLASSES, dim, generator=gen) * 0.08
    for split, rows in (("train", n), ("test", SHARD)):
        (folder / split).mkdir(parents=True)
        for index, start in enumerate(range(0, rows, SHARD)):
            y = torch.randint(0, CLASSES, (min(SHARD, rows - start),), generator=gen)
            x = means[y] + torch.randn(len(y), dim, generator=gen)
            shard = {"pooled": x.to(storage), "labels": y}
            save_shard(folder / split, Place(split, index, start, start + len(y)), shard)


def probe(folder: Path, mode: str, max_iter: int = 5) -> dict:
    """Run the probe on the cached train split, score the held-out test split, and report
    peak RSS."""
    from evalkit.cache.feature_set import FeatureSet
    from evalkit.heads.linear import fit_logistic, hits
    from evalkit.protocols.classification import ProbeData, percent, stratified_holdout
    from evalkit.tasks.linear_probe import LinearProbe

    def view(split):
        parts = sorted((folder / split).glob("shard-*.safetensors"))
        return FeatureSet(parts, from_cache=True)

    train, test = view("train"), view("test")
    task = LinearProbe(
        l2_grid=(1e-3, 1e-4),
        max_iter=max_iter,
        refit_max_iter=max_iter,
        resident_gb=0.0 if mode == "streamed" else 1e9,
    )
    start = time.perf_counter()
    data = ProbeData.build(train, test, task, "cpu", CLASSES)
    fit_idx, held_idx = stratified_holdout(train.labels, task.holdout, seed=0)
    l2, init, _, _ = task._select_l2(data, fit_idx, held_idx, CLASSES)
    model = fit_logistic(
        data.train_rows(), None, num_classes=CLASSES, l2=l2, init=init, max_iter=task.refit_max_iter
    )
    top1 = percent(hits(model, data.test_rows(), 1))
    peak_mb = peak_rss_mb()
    return {"seconds": time.perf_counter() - start, "peak_mb": peak_mb, "top1": top1}


def measure(n: int, dim: int, mode: str, storage=torch.float32, max_iter: int = 5) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "features"
        write_cache(folder, n, dim, seed=n, storage=storage)
        code = (
            f"from benchmarks.bench_probe_memory import probe; import json, pathlib; "
            f"print(json.dumps(probe(pathlib.Path({str(folder)!r}), {mode!r}, {max_iter})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,40000,160000")
    parser.add_argument("--dim", type=int, default=1536)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    copy_mb = {n: n * args.dim * 4 / 2**20 for n in sizes}
    streamed = {n: measure(n, args.dim, "streamed") for n in sizes}
    middle = sizes[len(sizes) // 2]
    resident = measure(middle, args.dim, "resident")
    # Storage precision, with fits run to convergence (unconverged ones amplify any change).
    small = sizes[0]
    half = measure(small, args.dim, "streamed", storage=torch.float16, max_iter=100)
    full = measure(small, args.dim, "streamed", max_iter=100)
    growth = streamed[sizes[-1]]["peak_mb"] - streamed[sizes[0]]["peak_mb"]
    report(
        "probe_memory",
        {
            "dim": args.dim,
            "baseline": "one copy of the training features (MB)",
            "features_mb": {n: round(mb) for n, mb in copy_mb.items()},
            "streamed_peak_mb": {n: round(r["peak_mb"]) for n, r in streamed.items()},
            "growth_mb": round(growth),
            "growth_vs_one_copy": round(growth / copy_mb[sizes[-1]], 3),
            "target_growth_vs_one_copy_below": 1.0,
            f"resident_peak_mb_at_{middle}": round(resident["peak_mb"]),
            "streamed_vs_resident_speed": round(
                resident["seconds"] / streamed[middle]["seconds"], 3
            ),
            "target_speed_ratio": 0.8,
            "top1_streamed_vs_resident": [
                round(streamed[middle]["top1"], 2),
                round(resident["top1"], 2),
            ],
            f"top1_fp16_cache_vs_fp32_at_{small}": [round(half["top1"], 2), round(full["top1"], 2)],
            "target_fp16_gap_pt_at_most": 0.1,
        },
    )


if __name__ == "__main__":
    main()
