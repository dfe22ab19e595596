"""kNN: evalkit's chunked top-k against scikit-learn's brute-force KNeighborsClassifier
(cosine) on the same features — 100k × 768 training rows, 10k queries, 1000 classes, k = 20,
uniform votes so both predict the same thing. Target: ≥ 5× faster, identical top-1.
``--small`` runs a tenth of the training rows."""

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
    train = centres[labels] + 2.0 * torch.randn(train_rows, DIM, generator=generator)
    test_labels = torch.randint(0, CLASSES, (queries,), generator=generator)
    test = centres[test_labels] + 2.0 * torch.randn(queries, DIM, generator=generator)
    return train, labels, test, test_labels


def ours(train, labels, test) -> torch.Tensor:
    chunks = ((train[i : i + 16384], labels[i : i + 16384]) for i in range(0, len(train), 16384))
    sims, neighbours = nearest(chunks, test, K)
    return vote(sims, neighbours, K, CLASSES, weighting="uniform").argmax(1)


def scikit_learn(train, labels, test) -> torch.Tensor:
    from sklearn.neighbors import KNeighborsClassifier

    model = KNeighborsClassifier(n_neighbors=K, metric="cosine", algorithm="brute", n_jobs=-1)
    return torch.from_numpy(model.fit(train.numpy(), labels.numpy()).predict(test.numpy()))


def main():
    scale = 10 if "--small" in sys.argv else 1
    train, labels, test, test_labels = data(100_000 // scale, 10_000 // scale)
    timings, predictions = {}, {}
    for name, fn in (("evalkit", ours), ("scikit_learn", scikit_learn)):
        start = time.perf_counter()
        predictions[name] = fn(train, labels, test)
        timings[name] = time.perf_counter() - start
    top1 = {
        n: round(100 * (p == test_labels).double().mean().item(), 2) for n, p in predictions.items()
    }
    report("knn", {"train": len(train), "queries": len(test), "dim": DIM, "k": K,
                   "evalkit_s": round(timings["evalkit"], 2), "sklearn_s": round(timings["scikit_learn"], 2),
                   "speedup": round(timings["scikit_learn"] / timings["evalkit"], 2),
                   "top1": top1, "same_predictions": bool(torch.equal(*predictions.values())),
                   "target": ">= 5x, identical top-1"})  # fmt: skip


if __name__ == "__main__":
    main()
