"""Computes, on the kernel path of its environment (benchmarks/kernels.py), what evalkit promises
to be the same on every machine, and prints it as JSON: kNN neighbours on near-duplicate and
duplicate training rows in every search mode (bitwise: the ranking's arithmetic is evalkit's
own), the linear probe's decisions on real-looking features (chosen L2, hold-out and test
hits), the classes predicted after a batch back-off, and what model-vs-human and the fairness
evaluation compute from scores (category decisions; parity rates, accuracy, per-image
probabilities).

Inputs come from files the caller made once, since even torch's random numbers follow the
kernel path (``randn`` without AVX2 differs).

Usage: python kernel_check.py FEATURES.pt KNN.pt"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from probe_threads_script import main as probe

from benchmarks.kernels import emulate_other_kernels
from evalkit.heads.fairness import fit_parity
from evalkit.heads.knn import nearest
from evalkit.protocols.human_alignment import decide


def digest(*tensors: torch.Tensor) -> str:
    return hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in tensors)).hexdigest()[
        :16
    ]


def knn(path: str) -> dict[str, str]:
    train, labels, queries = torch.load(path, weights_only=True)
    out = {}
    for mode in ("fp32", "bf16"):
        for chunk in (360, 7):
            parts = [(train[i : i + chunk], labels[i : i + chunk]) for i in range(0, 360, chunk)]
            out[f"{mode}/{chunk}"] = digest(*nearest(parts, queries, k=12, search=mode))
    return out


def backed_off_predictions(path: str) -> str:
    """A linear head on the features, all 384 rows at once and 8 at a time (a back-off)."""
    images = torch.load(path, weights_only=True)[2]
    generator = torch.Generator().manual_seed(2)  # uniform draws are the same on every path
    layer = torch.nn.Linear(images.shape[1], 24)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.uniform_(-0.05, 0.05, generator=generator)
        whole = layer(images)
        pieces = torch.cat([layer(part) for part in images.split(8)])
    assert torch.allclose(whole, pieces, rtol=1e-5, atol=1e-5)
    assert torch.equal(whole.argmax(1), pieces.argmax(1))
    return digest(whole.argmax(1))


def decisions_and_parity(path: str) -> dict:
    """Feature columns as logits of 24 classes in 8 categories of 3 (model-vs-human's mean
    probability per category), and a softmax of two columns as a binary score post-processed
    to parity level .05 over subgroups of the labels (the fairness evaluation)."""
    _, _, images, labels = torch.load(path, weights_only=True)
    logits = images[:, :24].double()
    decisions = decide(logits, [[i, i + 1, i + 2] for i in range(0, 24, 3)])
    scores = torch.softmax(logits[:, :2], dim=1)[:, 1].numpy()
    targets, groups = (labels % 2).numpy(), (labels // 2 % 2).numpy()
    rule = fit_parity(scores, targets, groups, 0.05)
    positive = torch.from_numpy(rule.positive_probability(scores, groups))
    return {
        "decisions": digest(torch.from_numpy(decisions)),
        "rates": rule.rates,
        "objective": rule.objective,
        "positive": digest(positive),
    }


if __name__ == "__main__":
    emulate_other_kernels()  # a path that names another vector library's arithmetic
    threads = int(os.environ["OMP_NUM_THREADS"])  # torch caps the variable at the core count
    torch.set_num_threads(threads)
    print(
        json.dumps(
            {
                "aten": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads(),
                "knn": knn(sys.argv[2]),
                "probe": probe(sys.argv[1], threads, 0.0),
                "backed_off": backed_off_predictions(sys.argv[1]),
                "alignment": decisions_and_parity(sys.argv[1]),
            }
        )
    )
