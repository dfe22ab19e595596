"""kNN: evalkit's chunked top-k against scikit-learn's brute-force KNeighborsClassifier
(cosine) on the same features — 100k × 768 training rows, 10k queries, 1000 classes, k = 20,
uniform votes so both predict the same thing — with the exact float32 search and with the
bf16 candidate search re-ranked in float32 (``--set search=bf16``). Target: ≥ 5× faster,
identical top-1. ``--small`` runs a tenth of the rows. Both are bound by the same matrix
product on a CPU; bf16 wins where the CPU has bf16 instructions (or on a GPU)."""

from __future__ import annotations

import sys
import time

import torch

from benchmarks.common import report
from evalkit.heads.knn import nearest, vote

K, CLASSES, DIM = 20, 1000, 768


def data(train_rows: int, queries: int):
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, DIM, generator=generator)
    labels = torch.randint(0, CLASSES, (train_rows,), generator=generator)
    train = centres[labels] + 4.0 * torch.randn(train_rows, DIM, generator=generator)
    test_labels = torch.randint(0, CLASSES, (queries,), generator=generator)
    test = centres[test_labels] + 4.0 * torch.randn(queries, DIM, generator=generator)
    return train, labels, test, test_labels


def ours(train, labels, test, search="fp32", chunk: int = 16384, block: int = 1024):
    """As the task runs it: query blocks against training chunks."""
    predictions = []
    for start in range(0, len(test), block):
        chunks = (
            (train[i : i + chunk], labels[i : i + chunk]) for i in range(0, len(train), chunk)
        )
        sims, neighbours = nearest(chunks, test[start : start + block], K, search)
        predictions.append(vote(sims, neighbours, K, CLASSES, weighting="uniform").argmax(1))
    return torch.cat(predictions)


def scikit_learn(train, labels, test) -> torch.Tensor:
    from sklearn.neighbors import KNeighborsClassifier

    model = KNeighborsClassifier(n_neighbors=K, metric="cosine", algorithm="brute", n_jobs=-1)
    return torch.from_numpy(model.fit(train.numpy(), labels.numpy()).predict(test.numpy()))


def main():
    scale = 10 if "--small" in sys.argv else 1
    train, labels, test, test_labels = data(100_000 // scale, 10_000 // scale)
    timings, predictions = {}, {}
    runs = (("scikit_learn", scikit_learn), ("evalkit_fp32", ours),
            ("evalkit_bf16", lambda *a: ours(*a, search="bf16")))  # fmt: skip
    for name, fn in runs:
        start = time.perf_counter()
        predictions[name] = fn(train, labels, test)
        timings[name] = time.perf_counter() - start
    reference = predictions["scikit_learn"]
    report("knn", {
        "train": len(train), "queries": len(test), "dim": DIM, "k": K,
        "seconds": {n: round(t, 2) for n, t in timings.items()},
        "speedup_fp32": round(timings["scikit_learn"] / timings["evalkit_fp32"], 2),
        "speedup_bf16": round(timings["scikit_learn"] / timings["evalkit_bf16"], 2),
        "top1": {n: round(100 * (p == test_labels).double().mean().item(), 2)
                 for n, p in predictions.items()},
        "same_predictions": {n: bool(torch.equal(p, reference)) for n, p in predictions.items()},
        "target": ">= 5x, identical top-1",
    })  # fmt: skip


if __name__ == "__main__":
    main()
