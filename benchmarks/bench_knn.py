"""kNN: evalkit's chunked exact search against faiss's exact inner-product search
(``IndexFlatIP``) on the same L2-normalised features — 100k × 768 training rows, 10k queries,
1000 classes, k = 20 — in three interleaved rounds (faiss, evalkit, faiss, ...) so that both
see the same machine (``--load N``: with N busy processes beside them; ``--one-thread``: both on
one thread, CPU-time ratios). Target: evalkit as the task runs it (``search=auto``: the certified
bf16 candidate search where bf16 products measure faster, else fp32) and the fp32 search each
≥ 1.0× faiss, with identical neighbours' votes (top-1 predictions with uniform votes). ``--small`` runs a tenth of the rows. faiss comes with the ``bench`` extra
(``pip install -e '.[bench]'``).

``--device cuda`` measures the search on an accelerator instead (faiss-cpu has no device
search): 1M training rows against a bare exact search on the same device — all rows resident,
one fp32 product and ``topk`` per 4096 queries, TF32 off — with identical predictions.

``--as-amd`` runs both sides as on an AMD CPU with AVX-512 BF16 and no AMX, on an Intel CPU
with AMX: oneDNN capped below AMX (its bf16 products on AVX-512 BF16), MKL on its AVX2 code
(what it runs on AMD) and faiss's OpenBLAS on its Zen kernels. An emulation of the code paths
only: the units that run them stay this machine's. Its AVX-512 BF16 multiplies no faster than
its float32 (so ``auto`` measures fp32 faster and takes it), where AMD's Zen 4 multiplies bf16
faster; and its 512-bit units are whole, where Zen 4 runs AVX-512 on 256-bit halves."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import busy_cores, report
from evalkit.heads.knn import bf16_search_faster, nearest, vote

K, CLASSES, DIM, CHUNK = 20, 1000, 768, 65536
AS_AMD = {  # read when each library loads, so set before this module's process starts
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Zen",
}


def data(train_rows: int, queries: int):
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, DIM, generator=generator)
    labels = torch.randint(0, CLASSES, (train_rows,), generator=generator)
    train = centres[labels] + 4.0 * torch.randn(train_rows, DIM, generator=generator)
    test_labels = torch.randint(0, CLASSES, (queries,), generator=generator)
    test = centres[test_labels] + 4.0 * torch.randn(queries, DIM, generator=generator)
    return train, labels, test, test_labels


def ours(train, labels, test, search="auto"):
    """As the task runs it: training chunks read once, queries a block at a time."""
    chunks = ((train[i : i + CHUNK], labels[i : i + CHUNK]) for i in range(0, len(train), CHUNK))
    sims, neighbours = nearest(chunks, test, K, search)
    return vote(sims, neighbours, K, CLASSES, weighting="uniform").argmax(1)


def faiss_exact(train, labels, test):
    import faiss

    index = faiss.IndexFlatIP(DIM)
    index.add(F.normalize(train, dim=1).numpy())
    _, found = index.search(F.normalize(test, dim=1).numpy(), K)
    neighbours = labels[torch.from_numpy(found)]
    ones = torch.ones(neighbours.shape)
    scores = torch.zeros(len(test), CLASSES).scatter_add_(1, neighbours, ones)
    return scores.argmax(1)


def bare_exact(train, labels, test):
    """The device baseline: every row resident, one fp32 product and topk per query block."""
    train = F.normalize(train, dim=1)
    found = []
    for block in F.normalize(test, dim=1).split(4096):
        found.append(torch.topk(block @ train.T, K, dim=1).indices)
    neighbours = labels[torch.cat(found)]
    ones = torch.ones(neighbours.shape, device=neighbours.device)
    scores = torch.zeros(len(test), CLASSES, device=test.device).scatter_add_(1, neighbours, ones)
    return scores.argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true", help="a tenth of the rows")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--one-thread", action="store_true", help="both on one thread (CPU-time ratios)"
    )
    parser.add_argument(
        "--load", type=int, default=0, help="this many busy processes beside the contenders"
    )
    parser.add_argument(
        "--as-amd", action="store_true", help="the code paths of an AMD CPU without AMX"
    )
    args = parser.parse_args()
    if args.as_amd and any(os.environ.get(k) != v for k, v in AS_AMD.items()):
        env = {**os.environ, **AS_AMD}
        os.execve(
            sys.executable, [sys.executable, "-m", "benchmarks.bench_knn", *sys.argv[1:]], env
        )
    if args.one_thread:
        torch.set_num_threads(1)
        import faiss

        faiss.omp_set_num_threads(1)
    device = torch.device(args.device)
    scale = 10 if args.small else 1
    rows = 100_000 if device.type == "cpu" else 1_000_000
    train, labels, test, test_labels = (t.to(device) for t in data(rows // scale, 10_000 // scale))
    torch.backends.cuda.matmul.allow_tf32 = False
    baseline = faiss_exact if device.type == "cpu" else bare_exact
    runs = {
        "faiss" if device.type == "cpu" else "bare": baseline,
        "evalkit": ours,
        "evalkit_fp32": lambda *a: ours(*a, search="fp32"),
    }
    timings, cpu, predictions = {name: [] for name in runs}, {name: [] for name in runs}, {}
    with busy_cores(args.load):
        for _ in range(3):
            for name, fn in runs.items():
                start, used = time.perf_counter(), time.process_time()
                predictions[name] = fn(train, labels, test)
                if device.type == "cuda":  # the device's work, not only its queueing
                    torch.cuda.synchronize(device)
                timings[name].append(round(time.perf_counter() - start, 2))
                cpu[name].append(round(time.process_time() - used, 2))
    best = {name: min(t) for name, t in timings.items()}
    best_cpu = {name: min(t) for name, t in cpu.items()}
    base = next(iter(runs))
    reference = predictions[base]
    suffix = ("_1thread" if args.one_thread else "") + (f"_load{args.load}" if args.load else "")
    suffix += "_as_amd" if args.as_amd else ""
    report(
        ("knn" if device.type == "cpu" else f"knn_{device.type}") + suffix,
        {
            "train": len(train),
            "queries": len(test),
            "dim": DIM,
            "k": K,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "busy_processes": args.load,
            "load_1min": round(os.getloadavg()[0], 1),
            "code_paths": AS_AMD if args.as_amd else "this CPU's own",
            "seconds": timings,
            "cpu_seconds": cpu,
            "auto_searches_bf16": bf16_search_faster(device),  # measured on this thread count
            "baseline": base,
            f"speedup_vs_{base}": round(best[base] / best["evalkit"], 2),
            f"speedup_fp32_vs_{base}": round(best[base] / best["evalkit_fp32"], 2),
            f"cpu_speedup_vs_{base}": round(best_cpu[base] / best_cpu["evalkit"], 2),
            f"cpu_speedup_fp32_vs_{base}": round(best_cpu[base] / best_cpu["evalkit_fp32"], 2),
            "top1": {
                n: round(100 * (p == test_labels).double().mean().item(), 2)
                for n, p in predictions.items()
            },
            "same_predictions": {
                n: bool(torch.equal(p, reference)) for n, p in predictions.items()
            },
            "target": f">= 1.0x {base}, identical predictions",
        },
    )


if __name__ == "__main__":
    main()
