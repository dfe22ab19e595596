"""Linear heads on frozen features (the linear-probe and few-shot rows of the paper's Table 3
and effect-table row 5).

- ``logistic_path``: multinomial logistic regression, full-batch L-BFGS in torch, swept over L2
  strengths from strong to weak with each fit warm-started from the previous one. The rows are
  a tensor or ``FeatureRows``, chunks streamed from wherever they live: loss and gradient are summed
  over the chunks, so memory is one chunk × (features + classes), whatever the number of rows.

  Where the speed comes from: the matrix products run in the rows' own precision (fp32 for
  fp32, bf16 or fp16 features; fp64 only for fp64 rows), while the weights, the optimiser's
  state and the block sums of loss and gradient are fp64; and L-BFGS runs on preconditioned
  weights, W = T·V with T = (Σ + μI)^(-1/2) from the rows' second moments Σ (one pass and
  one D×D eigendecomposition per path), which makes the loss about equally curved in every
  direction, so a fit takes tens of evaluations instead of hundreds. μ = ``MU_SCALE``·l2·C
  is the regulariser's curvature against the loss's (≈ Σ/C for C classes). Fits whose rows'
  logits fit in memory keep them (``evalkit.heads.kept_logits_fit``: two passes per iteration, bf16
  passes on differences where bf16 is fast); others stream (``evalkit.heads.streamed_fit``).

  The same inputs give the same probe on any thread count, rank count or device, to within a
  borderline hold-out image: the blocks are summed in a fixed order, and on a CPU a fit takes
  the same route, to the last bit, on any thread count (MKL's strict mode, set by ``import
  evalkit``; bf16 sums in pieces of ``PIECE`` terms; dots, sums over rows and solvers on one
  thread:
  ``threads``); and every fit (the path's too) runs until the largest entry of the gradient of the objective itself (in W, not V) is
  below ``TOL``. The objective is strictly convex, so that pins its one optimum; a fit stopped
  short by floating point or ``max_iter`` says so (``converged: false``).
- ``ridge_fewshot_accuracy``: big_vision's closed-form few-shot probe — whitened features, a
  constant bias feature of 100, {-1, +1} targets, least squares with L2 via one eigendecomposition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from evalkit.device import fast_bf16, gpu_free_bytes, on_reproducible_cores, threads
from evalkit.heads.kept_logits_fit import KeptLogitsFit
from evalkit.heads.logistic import (
    BLOCK_ROWS,
    LOW_PRECISION,
    PIECE,
    TOL,
    FeatureRows,
    LinearModel,
    PathLogits,
    blocks,
    compute_dtype,
)
from evalkit.heads.streamed_fit import fit_streamed
from evalkit.metrics import topk_hits

BIAS_CONSTANT = 100.0
WEAK_TOL_PER_L2 = 1e-2  # the tolerance of a fit with a weak penalty: at most 1% of l2
KEEP_LOGITS_BYTES = 2 * 2**30  # fits keep every row's logits up to this size (else streamed)
LOW_PRECISION_PASSES = True  # bf16 passes between exact points where bf16 is fast (kept_logits_fit)
MU_SCALE = 3.0  # μ = MU_SCALE·l2·classes; 1 is the curvature ratio, 3 measured ~10% fewer steps


def hits(model: LinearModel, rows: FeatureRows, k: int) -> torch.Tensor:
    """Top-k hits of every row, chunk by chunk."""
    return torch.cat([topk_hits(model.logits(x), y, k).cpu() for x, y in rows.chunks()])


@dataclass(frozen=True)
class Standardizer:
    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def fit(cls, x: torch.Tensor) -> Standardizer:
        """Statistics in float64, so they do not depend on how a reduction is split."""
        return cls.fit_chunks([x])

    @classmethod
    def fit_chunks(cls, chunks: Iterable[torch.Tensor]) -> Standardizer:
        """The same statistics from one pass over chunks (sums in float64)."""
        count, total, squares = 0, 0.0, 0.0
        for chunk in chunks:
            for x in chunk.split(BLOCK_ROWS):  # fp64 a block at a time: no fp64 copy of the chunk
                x = x.double()
                count, total, squares = count + len(x), total + x.sum(0), squares + x.pow(2).sum(0)
        mean = total / count
        std = (squares / count - mean.pow(2)).clamp_min(0).sqrt()
        return cls(mean.float(), std.float() + 1e-5)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # the statistics follow the rows: fitted on cached CPU rows, applied on any device
        return (x - self.mean.to(x.device)) / self.std.to(x.device)


def _moment_pairs(rows: FeatureRows, low_precision: bool):
    """(Xᵀ, X) piece by piece for the rows' second moments: the bf16 copies (pieces of
    ``PIECE``), or the blocks in their products' precision."""
    if low_precision:
        by_rows = rows.low_precision_rows(LOW_PRECISION, padded=True).view(-1, PIECE, rows.dim)
        yield from zip(rows.low_precision_columns(LOW_PRECISION), by_rows, strict=True)
        return
    for x, _ in blocks(rows):
        x = x.to(compute_dtype(x.dtype))
        yield x.T, x


@dataclass(frozen=True)
class Preconditioner:
    """The eigenvectors and eigenvalues of the rows' second moments Σ = XᵀX / n (fp64):
    ``maps(mu)`` gives T = (Σ + μI)^(-1/2) and its inverse."""

    basis: torch.Tensor
    spectrum: torch.Tensor

    @classmethod
    def of(cls, rows: FeatureRows, low_precision: bool = False) -> Preconditioner:
        """``low_precision``: Σ from the rows' bf16 copies, the ones the fit's bf16 passes
        use (a preconditioner needs no more precision: any T leads to the same optimum)."""
        moments = None
        for columns, x in _moment_pairs(rows, low_precision):
            block = (columns @ x).double()
            moments = block if moments is None else moments + block
        with threads(1):  # threaded LAPACK's last bits follow the thread count, and T with them
            spectrum, basis = torch.linalg.eigh(moments / rows.n)
        return cls(basis, spectrum.clamp_min(0))

    def maps(self, mu: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(mu), self._map((self.spectrum + mu).sqrt())

    def forward(self, mu: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """T alone (the kept-logits fit maps one way only, in fp32)."""
        return self._map((self.spectrum + mu).rsqrt(), dtype)

    def _map(self, scale: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        basis = self.basis.to(dtype)
        return (basis * scale.to(dtype)) @ basis.T


@on_reproducible_cores
def fit_logistic(
    x,
    y,
    *,
    num_classes: int,
    l2: float,
    init: LinearModel | None = None,
    max_iter: int = 1000,
    tol: float = TOL,
    precondition: Preconditioner | None = None,
    keep_logits: bool | None = None,
    logits: PathLogits | None = None,
) -> LinearModel:
    """Minimise the L2-regularised multinomial logistic loss with preconditioned L-BFGS until
    the largest entry of the gradient in W is at most ``tol``: with the rows' logits kept
    (``evalkit.heads.kept_logits_fit``) when ``keep_logits`` (default: when they take at most
    ``KEEP_LOGITS_BYTES``), else with one pass over the rows per objective evaluation
    (``evalkit.heads.streamed_fit``). ``x`` is a feature tensor with
    labels ``y``, or ``FeatureRows`` (then ``y`` is None); ``precondition`` (computed from the rows
    when absent) is shared by the fits of one path. A weak penalty pins its optimum less (the
    weights can move by about gradient / l2), so the tolerance tightens to
    ``WEAK_TOL_PER_L2``·l2 below l2 = 1e-4. ``logits``: a path's exact logits at the start
    and end of this fit (kept-logits fits). The passes run on the cores free when the fit
    starts (``reproducible_cpus``): the numbers do not depend on the thread count, the time
    does."""
    rows = x if isinstance(x, FeatureRows) else FeatureRows.of(x, y)
    if init is None:
        init = LinearModel(rows.zeros(rows.dim, num_classes), rows.zeros(num_classes))
    mu = MU_SCALE * l2 * num_classes
    model = LinearModel(init.weight.detach().double().clone(), init.bias.detach().double().clone())
    tol = min(tol, WEAK_TOL_PER_L2 * l2)
    keep_logits = _keeps_logits(rows, num_classes, keep_logits, model.weight.device)
    low_precision = keep_logits and _low_precision(rows)
    precondition = precondition or Preconditioner.of(rows, low_precision)
    if not keep_logits:
        return fit_streamed(rows, model, l2, precondition.maps(mu), max_iter, tol)
    forward = precondition.forward(mu, torch.float32).to(model.weight.device)
    fit = KeptLogitsFit(rows, model, l2, forward, low_precision, logits)
    fit.run(max_iter, tol)
    return fit.model


def _keeps_logits(rows: FeatureRows, classes: int, keep_logits: bool | None, device=None) -> bool:
    """``keep_logits`` as asked, or (None) whether the kept logits fit the budget of
    ``device`` (default: the rows', read from their first chunk only when needed)."""
    if keep_logits is not None:
        return keep_logits
    device = device if device is not None else rows.zeros(0).device
    return kept_logits_bytes(rows.n, classes) <= keep_logits_budget(device)


def keep_logits_budget(device: torch.device) -> int:
    """Bytes a fit may hold for kept logits: ``KEEP_LOGITS_BYTES``, or half the free memory
    of the fit's GPU when that is more."""
    return max(KEEP_LOGITS_BYTES, gpu_free_bytes(device) // 2)


def _low_precision(rows: FeatureRows) -> bool:
    """bf16 passes between exact points: resident fp32 rows on a device where bf16 products
    are fast (a GPU; a CPU with AVX-512 BF16 or AMX)."""
    if not (LOW_PRECISION_PASSES and rows.resident):
        return False
    x, _ = next(iter(rows.chunks()))
    return x.dtype == torch.float32 and fast_bf16(x.device)


def kept_logits_bytes(rows: int, classes: int) -> int:
    """What a kept-logits fit holds per row and class: fp32 logits (the last exact point's and
    the steps since, and the path's last fit's end), the residual at the last exact point, the
    softmax the search started from and the one it ends on, a step's logits (and their bf16
    product), the search's trial logits and the residual's bf16 change."""
    return rows * classes * 36


def block_bytes(rows: int, dim: int, classes: int) -> int:
    return min(rows, BLOCK_ROWS) * (dim + 3 * classes) * 8


def resident_bytes(rows: int, dim: int, classes: int) -> int:
    """Resident rows: their float32 features and two bf16 copies (by rows, and by columns on a
    CPU), one block and the kept logits."""
    return rows * dim * 8 + block_bytes(rows, dim, classes) + kept_logits_bytes(rows, classes)


# Passes over the rows (one matrix product each) of an 8-value L2 path and its refit: ~320
# for the path of benchmarks.bench_linear_probe (20k × 768, 100 classes), ~40 for the refit
PATH_PASSES = 360


def path_flops(rows: int, dim: int, classes: int) -> int:
    return PATH_PASSES * 2 * rows * dim * classes


@on_reproducible_cores
def logistic_path(
    x,
    y,
    *,
    num_classes: int,
    l2_values,
    max_iter: int = 1000,
    tol: float = TOL,
    keep_logits: bool | None = None,
):
    """Fit every L2 value, strongest first, each warm-started from the last; returns
    ``[(l2, model), ...]`` in the order fitted. Each fit runs to the same tolerance as a final
    fit: an unconverged fit's hold-out score would depend on floating-point summation order."""
    rows = x if isinstance(x, FeatureRows) else FeatureRows.of(x, y)
    keep_logits = _keeps_logits(rows, num_classes, keep_logits)
    precondition = Preconditioner.of(rows, keep_logits and _low_precision(rows))
    path, ends = [], []  # ends: the fits' exact end logits, where known (kept-logits fits)
    for l2 in sorted(l2_values, reverse=True):
        init, start = _next_start(path, l2, ends)
        logits, ends = PathLogits(start), ends[-1:]  # the older ends are not needed again
        model = fit_logistic(
            rows,
            None,
            num_classes=num_classes,
            l2=l2,
            init=init,
            max_iter=max_iter,
            tol=tol,
            precondition=precondition,
            keep_logits=keep_logits,
            logits=logits,
        )
        path.append((l2, model))
        ends.append(logits.end)
    return path


def _next_start(path: list, l2: float, ends: list):
    """Where the fit at ``l2`` starts: the last fit's optimum moved on along the line through
    the last two, linear in log L2 (the optimum moves smoothly as the penalty weakens); and
    the logits there, moved on the same way from the last two fits' exact end logits when
    both are known (``ends``), which costs no pass over the rows."""
    if len(path) < 2:
        return (path[-1][1], ends[-1]) if path else (None, None)
    (l2_a, a), (l2_b, b) = path[-2:]
    step = math.log(l2 / l2_b) / math.log(l2_b / l2_a)
    start = LinearModel(b.weight + step * (b.weight - a.weight), b.bias + step * (b.bias - a.bias))
    known = all(end is not None for end in ends[-2:])
    return start, ends[-1].extrapolated(ends[-2], step) if known else None


def ridge_fewshot_accuracy(
    x_train, y_train, x_test, y_test, *, num_classes: int, l2: float
) -> float:
    """Top-1 of the closed-form least-squares probe, computed in float64."""
    hits = ridge_fewshot_hits(x_train, y_train, x_test, y_test, num_classes=num_classes, l2=l2)
    return hits.double().mean().item()


def ridge_fewshot_hits(
    x_train, y_train, x_test, y_test, *, num_classes: int, l2: float
) -> torch.Tensor:
    """Whether the closed-form least-squares probe gets each test image right (float64)."""
    whiten, weight = ridge_fewshot_fit(x_train, y_train, num_classes=num_classes, l2=l2)
    predictions = (_with_bias(whiten(x_test.double())) @ weight).argmax(1)
    return predictions == y_test


def ridge_fewshot_fit(x_train, y_train, *, num_classes: int, l2: float):
    """The closed-form probe's whitening and its weights (bias row last), in float64."""
    x_train = x_train.double()
    whiten = Standardizer.fit(x_train)
    design = _with_bias(whiten(x_train))
    targets = 2.0 * torch.nn.functional.one_hot(y_train, num_classes).double() - 1.0
    n, d = design.shape
    if n >= d:  # (XᵀX + λI)⁻¹ XᵀY
        return whiten, _serial_solve(design.T @ design, l2, design.T @ targets)
    # Xᵀ (XXᵀ + λI)⁻¹ Y: the same solution through the smaller n×n system
    return whiten, design.T @ _serial_solve(design @ design.T, l2, targets)


def _serial_solve(gram: torch.Tensor, l2: float, right: torch.Tensor) -> torch.Tensor:
    """(gram + l2·I)⁻¹·right on one thread: threaded LAPACK's last bits follow the thread
    count (MKL's strict mode covers its matrix products, not its solvers)."""
    with threads(1):
        return torch.linalg.solve(gram + l2 * torch.eye(len(gram), dtype=gram.dtype), right)


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 1), value=BIAS_CONSTANT)
