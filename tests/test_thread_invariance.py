"""The linear probe gives the same bits on any thread count: its fits (the L2 path, the refit,
the streamed fit) and the closed-form few-shot probe, and each kind of product they run.

A fit runs on the cores free when it starts, so without this a rerun's numbers would follow
the machine's load. MKL splits the sums of some products by the thread count unless it runs
in its strict mode (``import evalkit`` asks for it), and oneDNN's bf16 products split long
sums: the fits sum bf16 terms in pieces of ``PIECE``. ATen's fp32 column sums round
differently where threads split the columns (from 5 threads at 37 classes), so thread counts
up to 16 are tried: a library splits its sums by the thread count asked for, not the cores."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys

import pytest
import torch

import evalkit.device
from evalkit.heads.kept_logits_fit import _row_sums, pieced_product
from evalkit.heads.linear import fit_logistic, logistic_path, ridge_fewshot_fit
from evalkit.heads.logistic import PIECE
from evalkit.protocols.classification import DEFAULT_L2, choose_l2, stratified_holdout

THREADS = (1, 2, 5, 9, 16)


@pytest.fixture
def every_thread_count(monkeypatch):
    """Run a function on each of ``THREADS`` (the fits take every thread asked for, whatever the
    load) and return its results."""
    monkeypatch.setattr(evalkit.device, "free_cpus", torch.get_num_threads)
    before = torch.get_num_threads()

    def run(compute):
        results = []
        for count in THREADS:
            torch.set_num_threads(count)
            results.append(compute())
        torch.set_num_threads(before)
        return results

    return run


def digest(*tensors: torch.Tensor) -> str:
    raw = b"".join(
        t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes() for t in tensors
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def features(rows: int, dim: int, classes: int, seed: int = 0):
    """Standardised real-looking features: class means on a low-rank subspace, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % classes
    means = torch.randn(classes, 8, generator=gen) @ torch.randn(8, dim, generator=gen)
    x = means[labels] + 2.0 * torch.randn(rows, dim, generator=gen)
    return (x - x.mean(0)) / x.std(0), labels


def probe(x, y, keep_logits: bool) -> str:
    """The probe's selection and refit (the imagenet-linear task's steps), digested."""
    classes = int(y.max()) + 1
    fit_idx, held_idx = stratified_holdout(y, 0.2, seed=0)
    path = logistic_path(
        x[fit_idx],
        y[fit_idx],
        num_classes=classes,
        l2_values=DEFAULT_L2,
        max_iter=100,
        keep_logits=keep_logits,
    )
    held = {l2: int((m.logits(x[held_idx]).argmax(1) == y[held_idx]).sum()) for l2, m in path}
    l2, init = choose_l2(path, held)
    final = fit_logistic(
        x, y, num_classes=classes, l2=l2, init=init, max_iter=100, keep_logits=keep_logits
    )
    weights = [t for _, m in path for t in (m.weight, m.bias)]
    return digest(*weights, final.weight, final.bias)


@pytest.mark.parametrize(
    ("rows", "dim", "classes", "keep_logits"),
    [
        (960, 64, 24, True),  # the gate's vit22b/test probe: bf16 passes where bf16 is fast
        (960, 64, 37, True),  # the bias gradient's column sums split from 5 threads
        (960, 64, 24, False),  # the streamed fit
        (600, 256, 600, False),  # a streamed penalty |W|² of 153,600 terms
        (256, 1536, 100, True),  # bf16 X·dW that oneDNN splits whole (with AMX)
        (1024, 512, 500, True),  # and another, from 9 threads
    ],
)
def test_the_probe_is_bitwise_the_same_on_any_thread_count(
    every_thread_count, rows, dim, classes, keep_logits
):
    x, y = features(rows, dim, classes)
    digests = every_thread_count(lambda: probe(x, y, keep_logits))
    assert len(set(digests)) == 1, dict(zip(THREADS, digests, strict=True))


def test_the_few_shot_probe_is_bitwise_the_same_on_any_thread_count(every_thread_count):
    for rows, dim in ((193, 256), (600, 192)):  # n < d and n > d: the two systems it solves
        x, y = features(rows, dim, 24)

        def fit(x=x, y=y):
            whiten, weight = ridge_fewshot_fit(x, y, num_classes=24, l2=1e-3)
            return digest(whiten.mean, whiten.std, weight)

        assert len(set(every_thread_count(fit))) == 1, (rows, dim)


def products(rows: int, dim: int, classes: int) -> dict:
    """Each kind of product a fit runs, at one shape (inputs from a seeded generator)."""
    gen = torch.Generator().manual_seed(rows * dim + classes)
    x, r = torch.randn(rows, dim, generator=gen), torch.randn(rows, classes, generator=gen)
    w = torch.randn(dim, classes, generator=gen)
    pieces = -(-rows // PIECE)
    padded = torch.zeros(pieces * PIECE, dim)
    padded[:rows] = x
    columns = padded.bfloat16().view(pieces, PIECE, dim).transpose(1, 2).contiguous()
    changes = torch.zeros(pieces * PIECE, classes, dtype=torch.bfloat16)
    changes[:rows] = r
    line = torch.zeros(rows, classes)
    part = torch.zeros(rows, classes, dtype=torch.bfloat16)
    kinds = {
        "exact logits X·W (fp32)": lambda: x @ w,
        "scores X·W (fp64)": lambda: x.double() @ w.double(),
        "exact gradient Xᵀ·R (fp32)": lambda: x.T @ r,
        "moments Xᵀ·X (fp32)": lambda: x.T @ x,
        "bf16 gradient, pieces": lambda: torch.bmm(columns, changes.view(pieces, PIECE, -1)),
        "bf16 moments, pieces": lambda: torch.bmm(columns, padded.bfloat16().view(pieces, -1, dim)),
    }
    kinds["bf16 line X·dW, pieces"] = lambda: pieced_product(x.bfloat16(), w.bfloat16(), line, part)
    kinds["bias gradient, column sums"] = lambda: _row_sums(r)
    return kinds


SHAPES = list(itertools.product((96, 960), (64, 768, 1536), (37, 1000)))


def test_each_product_a_fit_runs_is_bitwise_the_same_on_any_thread_count(every_thread_count):
    """The shapes where, without MKL's strict mode and the bf16 pieces, these products
    differed between thread counts on a CPU with AMX (a fit at 960 × 64 × 24 among them)."""
    varied = []
    for shape in SHAPES:
        for kind, compute in products(*shape).items():
            if len(set(every_thread_count(lambda compute=compute: digest(compute())))) > 1:
                varied.append((kind, shape))
    assert varied == []


def in_a_fresh_process(code: str) -> str:
    """Runs ``code`` in a process that does not inherit this one's MKL setting."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return result.stdout.strip() + result.stderr.strip()


@pytest.mark.skipif(evalkit.device.mkl_strict() is None, reason="torch here has no MKL")
def test_importing_evalkit_puts_mkl_in_its_strict_mode_and_a_late_import_fits_on_one_thread():
    assert evalkit.device.mkl_strict() is True  # this process imported evalkit first
    assert in_a_fresh_process("import evalkit.device as d; print(d.mkl_strict())") == "True"
    late = in_a_fresh_process(
        "import torch; torch.ones(64, 64) @ torch.ones(64, 64)\n"
        "import evalkit.device as d; print(d.mkl_strict(), d.reproducible_cpus())"
    )
    assert late.startswith("False 1") and "MKL_CBWR=AUTO,STRICT" in late
