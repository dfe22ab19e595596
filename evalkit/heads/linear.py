"""Linear heads on frozen features.

- ``logistic_path``: multinomial logistic regression, full-batch L-BFGS in torch, swept over L2
  strengths from strong to weak with each fit warm-started from the previous one (the sweep is
  where the speed is: later fits start near their optimum). The rows are a tensor or ``Rows``,
  chunks streamed from wherever they live: loss and gradient are summed over the chunks, so
  memory is one chunk × (features + classes), whatever the number of rows.

  The same inputs give the same probe on any thread count, rank count or device: the weights,
  the loss and the gradient are float64, summed block by block in a fixed order, and every fit
  (the path's too) runs until the largest gradient entry is below ``TOL``. The objective is
  strictly convex, so that pins its one optimum far below what could flip a prediction; a fit
  stopped short by floating point or ``max_iter`` says so (``converged: false``).
- ``ridge_fewshot_accuracy``: big_vision's closed-form few-shot probe — whitened features, a
  constant bias feature of 100, {-1, +1} targets, least squares with L2 via one eigendecomposition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from evalkit.metrics import topk_hits

BIAS_CONSTANT = 100.0
TOL = 1e-6  # largest gradient entry at which a fit counts as converged
BLOCK = 4096  # rows per float64 block of the loss: bounds memory, fixes the summation order


@dataclass(frozen=True)
class FitInfo:
    """How an L-BFGS fit ended: iterations used, the largest gradient entry, and whether it
    converged — stopped by one of L-BFGS's tolerances (gradient, or no more change in the
    objective) rather than by ``max_iter``, where the objective is not at its optimum."""

    iterations: int
    converged: bool
    grad_max: float

    def as_dict(self) -> dict:
        return {"iterations": self.iterations, "converged": self.converged,
                "grad_max": float(f"{self.grad_max:.3g}")}  # fmt: skip


@dataclass
class LinearModel:
    weight: torch.Tensor  # (D, C)
    bias: torch.Tensor  # (C,)
    fit: FitInfo | None = None

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.weight.dtype) @ self.weight + self.bias


@dataclass(frozen=True)
class Rows:
    """Training or evaluation rows as chunks: ``chunks()`` yields (features, labels) pairs
    ready for the fit (standardised, on its device); ``n`` rows of ``dim`` features."""

    chunks: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    n: int
    dim: int

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor) -> Rows:
        return cls(lambda: [(x, y)], len(y), x.shape[1])

    def zeros(self, *shape) -> torch.Tensor:
        x, _ = next(iter(self.chunks()))
        return x.new_zeros(shape)


def hits(model: LinearModel, rows: Rows, k: int) -> torch.Tensor:
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
        for x in chunks:
            x = x.double()
            count, total, squares = count + len(x), total + x.sum(0), squares + x.pow(2).sum(0)
        mean = total / count
        std = (squares / count - mean.pow(2)).clamp_min(0).sqrt()
        return cls(mean.float(), std.float() + 1e-5)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # the statistics follow the rows: fitted on cached CPU rows, applied on any device
        return (x - self.mean.to(x.device)) / self.std.to(x.device)


def _loss_and_grad(model: LinearModel, x, y, l2: float) -> torch.Tensor:
    return _rows_loss_and_grad(model, Rows.of(x, y), l2)


def _rows_loss_and_grad(model: LinearModel, rows: Rows, l2: float) -> torch.Tensor:
    """Mean cross-entropy + l2/2·|W|², summed over the chunks; writes analytic gradients
    into ``.grad`` (no autograd graph: two matmuls per chunk and evaluation)."""
    loss = torch.zeros((), dtype=model.weight.dtype, device=model.weight.device)
    grad_w, grad_b = torch.zeros_like(model.weight), torch.zeros_like(model.bias)
    for x, y in _blocks(rows):
        x = x.to(model.weight.dtype)
        logits = model.logits(x)
        log_z = torch.logsumexp(logits, dim=1)
        loss += (log_z - logits.gather(1, y[:, None]).squeeze(1)).sum() / rows.n
        probs = torch.exp(logits - log_z[:, None])
        probs[torch.arange(len(y)), y] -= 1.0
        probs /= rows.n
        grad_w += x.T @ probs
        grad_b += probs.sum(0)
    model.weight.grad = grad_w + l2 * model.weight
    model.bias.grad = grad_b
    return loss + 0.5 * l2 * model.weight.pow(2).sum()


def _blocks(rows: Rows):
    """The rows in blocks of at most ``BLOCK``, in their order."""
    for x, y in rows.chunks():
        for start in range(0, len(y), BLOCK):
            yield x[start : start + BLOCK], y[start : start + BLOCK]


def fit_logistic(
    x,
    y,
    *,
    num_classes: int,
    l2: float,
    init: LinearModel | None = None,
    max_iter: int = 1000,
    tol: float = TOL,
) -> LinearModel:
    """Minimise the L2-regularised multinomial logistic loss with L-BFGS (strong Wolfe) in
    float64 until the largest gradient entry is at most ``tol``. ``x`` is a feature tensor with
    labels ``y``, or ``Rows`` (then ``y`` is None)."""
    rows = x if isinstance(x, Rows) else Rows.of(x, y)
    if init is None:
        init = LinearModel(rows.zeros(rows.dim, num_classes), rows.zeros(num_classes))
    model = LinearModel(init.weight.detach().double().clone(), init.bias.detach().double().clone())
    opt = torch.optim.LBFGS(
        [model.weight, model.bias],
        lr=1,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=tol,
        tolerance_change=1e-15,  # stop on the gradient, not on a stalled objective
        line_search_fn="strong_wolfe",
    )
    with torch.no_grad():
        opt.step(lambda: _rows_loss_and_grad(model, rows, l2))
        _rows_loss_and_grad(model, rows, l2)  # the gradient where the fit stopped
    grad_max = max(model.weight.grad.abs().max().item(), model.bias.grad.abs().max().item())
    state = opt.state[opt._params[0]]
    model.fit = FitInfo(state["n_iter"], grad_max <= tol, grad_max)
    return model


def logistic_path(x, y, *, num_classes: int, l2_values, max_iter: int = 1000, tol: float = TOL):
    """Fit every L2 value, strongest first, each warm-started from the last; returns
    ``[(l2, model), ...]`` in the order fitted. Each fit runs to the same tolerance as a final
    fit: an unconverged fit's hold-out score would depend on floating-point summation order."""
    path, model = [], None
    for l2 in sorted(l2_values, reverse=True):
        model = fit_logistic(
            x, y, num_classes=num_classes, l2=l2, init=model, max_iter=max_iter, tol=tol
        )
        path.append((l2, model))
    return path


def ridge_fewshot_accuracy(
    x_train, y_train, x_test, y_test, *, num_classes: int, l2: float
) -> float:
    """Top-1 of the closed-form least-squares probe, computed in float64."""
    x_train, x_test = x_train.double(), x_test.double()
    whiten = Standardizer.fit(x_train)
    design = _with_bias(whiten(x_train))
    targets = 2.0 * torch.nn.functional.one_hot(y_train, num_classes).double() - 1.0
    n, d = design.shape
    if n >= d:  # (XᵀX + λI)⁻¹ XᵀY
        weight = torch.linalg.solve(
            design.T @ design + l2 * torch.eye(d, dtype=design.dtype), design.T @ targets
        )
    else:  # Xᵀ (XXᵀ + λI)⁻¹ Y: the same solution through the smaller n×n system
        weight = design.T @ torch.linalg.solve(
            design @ design.T + l2 * torch.eye(n, dtype=design.dtype), targets
        )
    predictions = (_with_bias(whiten(x_test)) @ weight).argmax(1)
    return (predictions == y_test).double().mean().item()


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 1), value=BIAS_CONSTANT)
