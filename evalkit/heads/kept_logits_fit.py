"""The linear probe's fit when every row's logits are kept (``evalkit.heads.linear.fit_logistic``; the
linear-probe rows of the paper's Table 3): L-BFGS whose line search costs no pass over the rows.

The logits of every row are kept (the last exact point's plus the steps since, both fp32),
and a step's direction is turned into logits once (one product, Z = X·dW + db), so the
objective along the line, logits + t·Z, is searched exactly by Newton's method on its
derivative, in O(rows × classes). An iteration is two passes over the rows (the direction's
logits, the gradient), never more; the derivative-only search also keeps resolving steps
after the objective's own decreases fall below fp32's resolution. A path's fit starts from
logits extrapolated from the last two fits' exact ones, as its weights are (no pass), and
the logits-sized tensors of the search are buffers made once per fit.

Low-precision passes (resident fp32 rows, where bf16 products are fast: a GPU, a CPU with
AVX-512 BF16 or AMX): between two exact points every product is a *difference* — Z is the
logits of a step, and the gradient is G_ref + Xᵀ(R − R_ref), R the rows' softmax residual at
the last exact point — so bf16's rounding (2⁻⁹ relative) is relative to how far the fit moved
since that point, not to the logits or gradient themselves. The kept logits drift from X·W by
that rounding, so they and the gradient are recomputed exactly (fp32 products, fp64 sums)
every ``REFRESH`` iterations, once the gradient has fallen ``REFRESH_DROP``-fold since the last
exact point, and before a fit is declared converged: ``converged`` is always judged on an
exact gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from evalkit.device import threads
from evalkit.heads.logistic import (
    BLOCK_ROWS,
    LOW_PRECISION,
    PIECE,
    FeatureRows,
    FitInfo,
    LinearModel,
    PathLogits,
    blocks,
    compute_dtype,
    serial_dot,
)


@dataclass(frozen=True)
class ExactLogits:
    """X·W + b from the weights (fp32 products, or fp64 for fp64 rows), with the rows' labels
    and their blocks' sizes learnt on the way."""

    values: torch.Tensor
    labels: torch.Tensor
    sizes: list[int]

    def extrapolated(self, before: ExactLogits, step: float) -> ExactLogits:
        """The logits at W + step·(W − W_before): logits are linear in the weights."""
        return replace(self, values=torch.lerp(before.values, self.values, 1 + step))


class KeptLogitsFit:
    HISTORY = 20  # curvature pairs kept
    REFRESH = 10  # iterations between exact recomputations of the logits, at most
    REFRESH_DROP = 16.0  # low-precision passes: also once the gradient fell this much
    LINE_TOL = 0.1  # the search stops where |φ'(t)| ≤ LINE_TOL·|φ'(0)|
    LINE_STEPS = 20

    def __init__(
        self,
        rows: FeatureRows,
        model: LinearModel,
        l2: float,
        forward: torch.Tensor,
        low_precision: bool,
        logits: PathLogits | None = None,
    ):
        self.rows, self.model, self.l2, self.path_logits = rows, model, l2, logits
        self.forward = forward.float()  # T: fp32 maps (the fit's state stays fp64)
        self.low = rows.low_precision_rows(LOW_PRECISION) if low_precision else None
        self.low_columns = rows.low_precision_columns(LOW_PRECISION) if low_precision else None
        self.pairs: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self.iterations = self.evaluations = self.low_passes = self.exact_at = 0
        self.exact_grad_max = math.inf
        self.full_line = False
        self.buffers: dict[str, torch.Tensor] = {}

    def run(self, max_iter: int, tol: float) -> None:
        grad, grad_max = self._exact_gradient(self.path_logits and self.path_logits.take_start())
        while True:
            if grad_max <= tol:  # confirmed on logits recomputed from the weights
                if self.exact_at != self.iterations:
                    grad, grad_max = self._exact_gradient()
                if grad_max <= tol:
                    break
            if self.iterations >= max_iter:
                break
            if not self._step(grad):
                if self.exact_at != self.iterations:  # drift or differences: recompute
                    grad, grad_max = self._exact_gradient()
                    continue
                if self.low is None or self.full_line:
                    break  # no step lowers the objective from an exact point: floating
                    # point has run out
                self.full_line = True  # bf16 lines can no longer resolve the steps left
                continue
            self.iterations += 1
            new_grad, grad_max = (
                self._exact_gradient() if self._exact_due(grad_max) else self._gradient()
            )
            self._remember(new_grad - grad)
            grad = new_grad
        self.model.fit = FitInfo(
            self.iterations, grad_max <= tol, grad_max, self.evaluations, self.low_passes
        )
        if self.path_logits is not None and self.exact_at == self.iterations:
            self.path_logits.end = ExactLogits(self.anchor, self.labels, self.sizes)

    def _exact_due(self, last_grad_max: float) -> bool:
        if self.iterations - self.exact_at >= self.REFRESH:
            return True
        return self.low is not None and last_grad_max * self.REFRESH_DROP < self.exact_grad_max

    # --- passes over the rows -------------------------------------------------------------

    def _exact_gradient(self, known: ExactLogits | None = None):
        """Logits recomputed from the weights (or ``known``: the path extrapolated them), then
        the gradient with full-precision products; with low-precision passes, this point
        becomes the reference of the differences."""
        known = known or self._exact_logits()
        self.anchor, self.labels, self.sizes = known.values, known.labels, known.sizes
        self.compute = self.anchor.dtype  # the products' precision
        self.moved = torch.zeros_like(self.anchor)
        residual = self._residual(torch.softmax(self.anchor, dim=1))
        grad_w = self._full_product(residual)
        if self.low is not None:
            self.reference = (residual, grad_w)
        self.exact_at = self.iterations
        grad, grad_max = self._finish_gradient(grad_w, residual)
        self.exact_grad_max = grad_max
        return grad, grad_max

    def _gradient(self):
        """The gradient from the kept logits (the softmax the line search ended on): full
        precision, or the reference's plus the low-precision product of the residual's change
        since the reference."""
        residual = self._residual(self.probs)
        if self.low is None:
            return self._finish_gradient(self._full_product(residual), residual)
        reference, grad_w = self.reference
        grad_w = grad_w.clone()
        # the residual's change in bf16, its rows padded with zeros to whole pieces (as the
        # columns are); one batched product, then the pieces' parts added in order (fp64)
        change = self._buffer(
            "change", LOW_PRECISION, (len(self.low_columns) * PIECE, residual.shape[1])
        )
        torch.sub(residual, reference, out=change[: self.rows.n])
        changes = change.view(len(self.low_columns), PIECE, -1)
        parts = self._buffer(
            "parts", LOW_PRECISION, (len(changes), self.rows.dim, changes.shape[2])
        )
        for part in torch.bmm(self.low_columns, changes, out=parts):
            grad_w += part
        self.low_passes += 1
        return self._finish_gradient(grad_w, residual)

    def _full_product(self, residual: torch.Tensor) -> torch.Tensor:
        """Xᵀ·residual: full-precision products, block by block, summed in fp64."""
        grad_w = torch.zeros_like(self.model.weight)
        for (x, _), part in zip(blocks(self.rows), residual.split(self.sizes), strict=True):
            grad_w += _product(x.T, part).double()
        return grad_w

    def _finish_gradient(self, grad_w: torch.Tensor, residual: torch.Tensor):
        """The gradient in preconditioned coordinates (weights then bias, flat) and the
        largest entry of the gradient in W and b."""
        n, model = self.rows.n, self.model
        self.residual = residual
        grad_w = grad_w / n + self.l2 * model.weight
        grad_b = _row_sums(residual) / n
        self.evaluations += 1
        grad_max = max(grad_w.abs().max().item(), grad_b.abs().max().item())
        return torch.cat([self._mapped(grad_w).flatten(), grad_b]), grad_max

    def _exact_logits(self) -> ExactLogits:
        """X·W + b (full-precision products), the rows' labels and their blocks' sizes
        (chunks may end mid-block)."""
        logits, labels, start = None, [], 0
        for x, y in blocks(self.rows):
            if logits is None:  # the first block says the products' precision
                weight = self.model.weight.to(compute_dtype(x.dtype))
                logits = weight.new_empty((self.rows.n, weight.shape[1]))
            torch.matmul(x.to(weight.dtype), weight, out=logits[start : start + len(y)])
            labels.append(y)
            start += len(y)
        logits.add_(self.model.bias.to(weight.dtype))
        return ExactLogits(logits, torch.cat(labels), [len(y) for y in labels])

    def _line(self, step_w: torch.Tensor, step_b: torch.Tensor) -> torch.Tensor:
        """Z = X·dW + db, in the products' precision (fp32, or fp64 for fp64 rows)."""
        if self.low is not None and not self.full_line:
            return self._low_line(step_w.to(LOW_PRECISION), step_b)
        step = step_w.to(self.compute)
        line = self._buffer("line", step.dtype)
        for (x, _), part in zip(blocks(self.rows), line.split(self.sizes), strict=True):
            torch.matmul(x.to(step.dtype), step, out=part)
        return line.add_(step_b.to(self.compute))

    def _low_line(self, step: torch.Tensor, step_b: torch.Tensor) -> torch.Tensor:
        """Z from the bf16 rows (``pieced_product``)."""
        line, part = self._buffer("line", self.compute), self._buffer("low line", LOW_PRECISION)
        pieced_product(self.low, step, line, part)
        self.low_passes += 1
        return line.add_(step_b.to(self.compute))

    def _buffer(self, name: str, dtype: torch.dtype, shape: tuple | None = None) -> torch.Tensor:
        """A buffer (default: rows × classes; made zero) made once per fit and rewritten by
        every step: a new logits-sized tensor per pass costs the faults of its fresh pages each
        time, which on a CPU took longer than the arithmetic done in it."""
        if name not in self.buffers:
            shape = shape or (self.rows.n, self.model.bias.numel())
            self.buffers[name] = torch.zeros(shape, dtype=dtype, device=self.model.weight.device)
        return self.buffers[name]

    def _residual(self, probs: torch.Tensor) -> torch.Tensor:
        """softmax − onehot(y), in place."""
        probs[torch.arange(len(self.labels), device=probs.device), self.labels] -= 1.0
        return probs

    # --- the step -------------------------------------------------------------------------

    def _step(self, grad: torch.Tensor) -> bool:
        """One step along the L-BFGS direction to the minimum on its line; False when no
        step lowers the objective (floating point has run out)."""
        direction = self._direction(grad)
        slope = serial_dot(grad, direction)
        if not slope < 0:  # the history no longer gives a descent direction: restart
            self.pairs.clear()
            direction, slope = -grad, -serial_dot(grad, grad)
        classes = self.model.bias.numel()
        step_w = self._mapped(direction[:-classes].view_as(self.model.weight))
        step_b = direction[-classes:]
        line = self._line(step_w, step_b)
        t = self._line_search(line, step_w, slope)
        if not t > 0:
            return False
        self.model.weight = self.model.weight + t * step_w
        self.model.bias = self.model.bias + t * step_b
        self.moved.add_(line, alpha=t)
        self.last_step = t * direction
        return True

    def _mapped(self, weights: torch.Tensor) -> torch.Tensor:
        """T·weights: between the preconditioned coordinates and the weights' own, in fp32
        (a direction or gradient rounded to fp32 loses nothing the fit can use)."""
        return (self.forward @ weights.float()).double()

    def _direction(self, grad: torch.Tensor) -> torch.Tensor:
        """The two-loop recursion: −H·grad for the inverse-Hessian estimate of the pairs."""
        q, alphas = grad.clone(), []
        for s, y, rho in reversed(self.pairs):
            alphas.append(rho * serial_dot(s, q))
            q.add_(y, alpha=-alphas[-1])
        if self.pairs:
            s, y, rho = self.pairs[-1]
            q *= 1 / (rho * serial_dot(y, y))
        for (s, y, rho), alpha in zip(self.pairs, reversed(alphas), strict=True):
            q.add_(s, alpha=alpha - rho * serial_dot(y, q))
        return q.neg_()

    def _remember(self, grad_change: torch.Tensor) -> None:
        """Keeps the step and gradient change as a pair, with ρ = 1 / (sᵀy), when they show
        positive curvature."""
        s, curvature = self.last_step, serial_dot(self.last_step, grad_change)
        if curvature > 1e-12 * math.sqrt(serial_dot(s, s) * serial_dot(grad_change, grad_change)):
            self.pairs = [*self.pairs[-(self.HISTORY - 1) :], (s, grad_change, 1 / curvature)]

    def _line_search(self, line, step_w, slope: float) -> float:
        """Newton's method on φ'(t), bracketed, where φ(t) is the objective at logits + t·Z,
        from the quadratic model at t = 0 (the softmax there is known: no pass for it).
        φ'(t) = slope + mean (softmax(t) − softmax(0))·Z + l2·t·|dW|²: the loss part enters
        as a change since t = 0, so a rounding error of Z that is the same all along the line
        (bf16 products: 2⁻⁹ of Z, far above the slope near the optimum, where the loss and
        the penalty's parts of φ'(0) nearly cancel) drops out, as it does from the slope."""
        curvature = self.l2 * serial_dot(step_w.flatten(), step_w.flatten())
        chosen = line.gather(1, self.labels[:, None]).squeeze(1)
        # (softmax(0) − onehot)·Z, then softmax(0)·Z; the trial logits' buffer is free until then
        weighted = torch.mul(self.residual, line, out=self._buffer("trial", line.dtype))
        mean_z = weighted.sum(1).add_(chosen)
        squares = _row_dots(weighted, line).add_(chosen * chosen)
        second = _row_sums(squares - mean_z * mean_z).item() / self.rows.n
        low, high, t, first = 0.0, math.inf, 0.0, slope
        for _ in range(self.LINE_STEPS):
            guess = t - first / (second + curvature)
            t = guess if low < guess < high else (low + high) / 2 if high < math.inf else 2 * t
            first = self._line_slope(line, mean_z, t) + slope + curvature * t
            if abs(first) <= self.LINE_TOL * abs(slope):
                return t
            low, high = (t, high) if first < 0 else (low, t)
            second = self._line_curvature(line)
        if low:  # the search did not settle: the last point known to lie before the minimum
            self._line_slope(line, mean_z, low)
        return low

    def _line_slope(self, line, mean_z0, t: float) -> float:
        """The loss part of φ'(t) − φ'(0), summed over the rows in a fixed order; keeps the
        softmax at t (the next gradient's, if the step ends there)."""
        trial = torch.add(self.anchor, self.moved, out=self._buffer("trial", line.dtype))
        trial.add_(line, alpha=t)
        self.probs = torch.softmax(trial, dim=1, out=self._softmax_buffer(line.dtype))
        self.mean_z = _row_dots(self.probs, line)
        return _row_sums(self.mean_z - mean_z0).item() / self.rows.n

    def _softmax_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        """Of two buffers, the one not holding the residual the search started from."""
        first = self._buffer("softmax a", dtype)
        return self._buffer("softmax b", dtype) if self.residual is first else first

    def _line_curvature(self, line) -> float:
        """The loss part of φ'' at the last t evaluated: the softmax-weighted variance of Z."""
        squares = _row_dots(self.probs * line, line)
        return _row_sums(squares - self.mean_z * self.mean_z).item() / self.rows.n


def pieced_product(x: torch.Tensor, step: torch.Tensor, out: torch.Tensor, part: torch.Tensor):
    """x·step into ``out`` as the products of pieces of ``PIECE`` features (each into
    ``part``, in x's precision), added in order in ``out``'s: oneDNN splits a whole row's bf16
    sum by the thread count."""
    for start in range(0, x.shape[1], PIECE):
        features = slice(start, start + PIECE)
        torch.matmul(x[:, features], step[features], out=part)
        out.copy_(part) if start == 0 else out.add_(part)
    return out


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in a's precision (fp32 for fp32, bf16 or fp16 features; fp64 for fp64)."""
    compute = compute_dtype(a.dtype)
    return a.to(compute) @ b.to(compute)


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ a·b over each row's classes. On a CPU a batched product, which makes no rows ×
    classes temporary (``linalg.vecdot`` does, and a fresh one costs its pages' faults); on a
    GPU, whose allocator reuses memory, ``vecdot``."""
    if a.is_cuda:
        return torch.linalg.vecdot(a, b)
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _row_sums(values: torch.Tensor) -> torch.Tensor:
    """Sum over the rows (dim 0), block by block in a fixed order whatever the thread count:
    each block's sum in the values' precision, then the blocks' sums in fp64. On one thread:
    ATen's fp32 column sums round differently where the threads split the columns."""
    whole = len(values) - len(values) % BLOCK_ROWS
    with threads(1):
        sums = values[:whole].view(-1, BLOCK_ROWS, *values.shape[1:]).sum(1).double().sum(0)
        return sums + values[whole:].sum(0).double() if whole < len(values) else sums
