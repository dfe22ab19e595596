"""kNN: evalkit's chunked exact search against faiss's exact inner-product search
(``IndexFlatIP``) on the same L2-normalised features — 100k × 768 training rows, 10k queries,
1000 classes, k = 20 — in three interleaved rounds (faiss, evalkit, faiss, ...) so that both
see the same machine. Target: evalkit as the task runs it (``search=auto``: the certified
bf16 candidate search where bf16 products are fast, else fp32) ≥ 1.0× faiss, with identical
neighbours' votes (top-1 predictions with uniform votes); the plain fp32 search is timed
beside it. ``--small`` runs a tenth of the rows. faiss comes with the ``bench`` extra
(``pip install -e '.[bench]'``)."""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import report
from evalkit.heads.knn import fast_bf16, nearest, vote

K, CLASSES, DIM, CHUNK = 20, 1000, 768, 65536


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


def main():
    scale = 10 if "--small" in sys.argv else 1
    train, labels, test, test_labels = data(100_000 // scale, 10_000 // scale)
    runs = {"faiss": faiss_exact, "evalkit": ours,
            "evalkit_fp32": lambda *a: ours(*a, search="fp32")}  # fmt: skip
    timings, predictions = {name: [] for name in runs}, {}
    for _ in range(3):
        for name, fn in runs.items():
            start = time.perf_counter()
            predictions[name] = fn(train, labels, test)
            timings[name].append(round(time.perf_counter() - start, 2))
    best = {name: min(t) for name, t in timings.items()}
    reference = predictions["faiss"]
    report("knn", {
        "train": len(train), "queries": len(test), "dim": DIM, "k": K,
        "threads": torch.get_num_threads(), "seconds": timings,
        "bf16_search": fast_bf16(torch.device("cpu")),
        "speedup_vs_faiss": round(best["faiss"] / best["evalkit"], 2),
        "speedup_fp32_vs_faiss": round(best["faiss"] / best["evalkit_fp32"], 2),
        "top1": {n: round(100 * (p == test_labels).double().mean().item(), 2)
                 for n, p in predictions.items()},
        "same_predictions": {n: bool(torch.equal(p, reference)) for n, p in predictions.items()},
        "target": ">= 1.0x faiss, identical predictions",
    })  # fmt: skip


if __name__ == "__main__":
    main()
