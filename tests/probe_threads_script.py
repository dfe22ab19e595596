"""Runs the linear probe's selection and refit on saved features with a given torch thread
count, optionally on features nudged by a relative 1e-6 (what another summation order in the
extraction does), and prints the chosen L2, hold-out hits and top-1/top-5 as JSON.

Usage: python probe_threads_script.py FEATURES.pt THREADS NUDGE"""

import json
import sys

import torch

from evalkit.heads.linear import Standardizer, fit_logistic, hits, logistic_path
from evalkit.heads.logistic import FeatureRows
from evalkit.protocols.classification import DEFAULT_L2, choose_l2, stratified_holdout


def main(path: str, threads: int, nudge: float) -> dict:
    torch.set_num_threads(threads)
    x, y, xv, yv = torch.load(path, weights_only=True)
    if nudge:
        gen = torch.Generator().manual_seed(1)
        x = x * (1 + nudge * torch.randn(x.shape, generator=gen))
    scale = Standardizer.fit(x)
    x, xv = scale(x), scale(xv)
    classes = int(y.max()) + 1
    fit_idx, held_idx = stratified_holdout(y, 0.2, seed=0)
    path_fits = logistic_path(x[fit_idx], y[fit_idx], num_classes=classes, l2_values=DEFAULT_L2)
    held = FeatureRows.of(x[held_idx], y[held_idx])
    held_hits = {l2: int(hits(m, held, 1).sum()) for l2, m in path_fits}
    l2, init = choose_l2(path_fits, held_hits)
    model = fit_logistic(x, y, num_classes=classes, l2=l2, init=init)
    test = FeatureRows.of(xv, yv)
    return {
        "l2": l2,
        "held_hits": {f"{k:g}": v for k, v in held_hits.items()},
        "top1": int(hits(model, test, 1).sum()),
        "top5": int(hits(model, test, 5).sum()),
        "converged": [m.fit.converged for _, m in path_fits] + [model.fit.converged],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))))
