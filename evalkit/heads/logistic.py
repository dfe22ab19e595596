"""The multinomial logistic loss the linear probe minimises, and what its two fits share
(``evalkit.heads.kept_logits_fit`` and ``evalkit.heads.streamed_fit``; the fits are chosen by
``evalkit.heads.linear.fit_logistic``): the model and how a fit ended, the feature rows a fit
reads as chunks, the fixed blocks every sum runs over, the loss and gradient of the rows, and
the thread count a fit runs its passes on."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from evalkit.device import threads

TOL = 1e-6  # largest gradient entry at which a fit counts as converged
BLOCK_ROWS = 1024  # rows per block: bounds memory, fixes the summation order, and keeps each
# fp32 product's own sum short (its rounding grows with the rows it adds; fp64 adds the blocks)
LOW_PRECISION = torch.bfloat16  # the precision of the passes between exact points (kept_logits_fit)
# Terms per piece of a bf16 sum: oneDNN (which runs torch's bf16 products on a CPU) splits a
# longer sum by the thread count, so Xᵀ·R and Xᵀ·X are batched products of pieces of rows and
# X·dW a sum of products of pieces of features, the pieces added in a fixed order. Measured on
# 1–16 threads, with and without AMX (ONEDNN_MAX_CPU_ISA): pieces of 256 gave the same bits at
# every shape tried (up to 6,144 features and 1,000 classes), whole sums of 768 or 1,024 terms
# did not (tests/test_thread_invariance.py).
PIECE = 256


@dataclass(frozen=True)
class FitInfo:
    """How an L-BFGS fit ended: iterations and objective evaluations used, the largest
    gradient entry where it stopped, and whether that met the tolerance (``converged``);
    a fit stopped by ``max_iter`` or by floating point (no further decrease) did not."""

    iterations: int
    converged: bool
    grad_max: float
    evaluations: int = 0
    low_precision_passes: int = (
        0  # bf16 passes between exact points (``evalkit.heads.kept_logits_fit``)
    )

    def as_dict(self) -> dict:
        return {
            "iterations": self.iterations,
            "evaluations": self.evaluations,
            "low_precision_passes": self.low_precision_passes,
            "converged": self.converged,
            "grad_max": float(f"{self.grad_max:.3g}"),
        }


@dataclass
class LinearModel:
    weight: torch.Tensor  # (D, C)
    bias: torch.Tensor  # (C,)
    fit: FitInfo | None = None

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.weight.dtype) @ self.weight + self.bias


@dataclass(frozen=True)
class FeatureRows:
    """Training or evaluation rows as chunks: ``chunks()`` yields (features, labels) pairs
    ready for the fit (standardised, on its device); ``n`` rows of ``dim`` features;
    ``resident`` when the chunks are tensors in memory rather than reads."""

    chunks: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    n: int
    dim: int
    resident: bool = False
    copies: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor) -> FeatureRows:
        return cls(lambda: [(x, y)], len(y), x.shape[1], resident=True)

    def low_precision_rows(self, dtype: torch.dtype, padded: bool = False) -> torch.Tensor:
        """Resident rows (one chunk) in ``dtype``, made once and kept (the fits of a path share
        them); ``padded``: with zero rows after the last, up to a whole number of blocks."""
        key = (dtype, "rows")
        if key not in self.copies:
            x, _ = next(iter(self.chunks()))
            self.copies[key] = x.new_zeros((self.n + -self.n % BLOCK_ROWS, self.dim), dtype=dtype)
            self.copies[key][: self.n] = x
        return self.copies[key] if padded else self.copies[key][: self.n]

    def low_precision_columns(self, dtype: torch.dtype) -> torch.Tensor:
        """The padded rows' pieces transposed, (pieces, features, ``PIECE``), for one
        batched product Xᵀ·R over all pieces: copied on a CPU, whose bf16 products with a
        transposed operand are slower; on a GPU, a view."""
        key = (dtype, "columns")
        if key not in self.copies:
            by_rows = self.low_precision_rows(dtype, padded=True).view(-1, PIECE, self.dim)
            columns = by_rows.transpose(1, 2)
            self.copies[key] = columns if columns.is_cuda else columns.contiguous()
        return self.copies[key]

    def zeros(self, *shape) -> torch.Tensor:
        x, _ = next(iter(self.chunks()))
        return x.new_zeros(shape)


def loss_and_grad(model: LinearModel, x, y, l2: float) -> torch.Tensor:
    return loss_and_grad_of_rows(model, FeatureRows.of(x, y), l2)


def loss_and_grad_of_rows(
    model: LinearModel, rows: FeatureRows, l2: float, compute: torch.dtype | None = None
) -> torch.Tensor:
    """Mean cross-entropy + l2/2·|W|², summed over the chunks; writes analytic gradients
    into ``.grad`` (no autograd graph: two matmuls per block). The products run in
    ``compute`` (default: the rows' precision, at least fp32); each block's sums are added
    in fp64."""
    loss = torch.zeros((), dtype=model.weight.dtype, device=model.weight.device)
    grad_w, grad_b = torch.zeros_like(model.weight), torch.zeros_like(model.bias)
    for x, y in blocks(rows):
        compute = compute or compute_dtype(x.dtype)
        x = x.to(compute)
        weight, bias = model.weight.to(compute), model.bias.to(compute)
        logits = x @ weight + bias
        top = logits.max(dim=1, keepdim=True).values
        probs = (logits - top).exp_()
        total = probs.sum(1)
        picked = logits.gather(1, y[:, None]).squeeze(1)
        loss += (top.squeeze(1) + total.log() - picked).double().sum() / rows.n
        probs /= total[:, None]
        probs[torch.arange(len(y)), y] -= 1.0
        grad_w += (x.T @ probs).double() / rows.n
        grad_b += probs.double().sum(0) / rows.n
    model.weight.grad = grad_w + l2 * model.weight
    model.bias.grad = grad_b
    weight = model.weight.flatten()
    return loss + 0.5 * l2 * serial_dot(weight, weight)


def serial_dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """aᵀb on one thread on a CPU: a threaded dot (or a sum of one output) adds in an order
    set by the thread count, and a fit's path (its iterations, where it stops) would change
    with it."""
    with threads(1):
        return (a @ b).item()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def blocks(rows: FeatureRows):
    """The rows in blocks of at most ``BLOCK_ROWS``, in their order."""
    for x, y in rows.chunks():
        for start in range(0, len(y), BLOCK_ROWS):
            yield x[start : start + BLOCK_ROWS], y[start : start + BLOCK_ROWS]


@dataclass
class PathLogits:
    """A path fit's exact logits (``kept_logits_fit.ExactLogits``) at its start, when the path extrapolated
    them, and at its end, when it ended on an exact point (kept-logits fits only)."""

    start: object = None
    end: object = None

    def take_start(self):
        """The start's logits, let go of here (the fit holds them only while it needs them)."""
        start, self.start = self.start, None
        return start
