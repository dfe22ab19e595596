"""The linear probe's fit when the rows' logits are not kept (``evalkit.heads.linear.fit_logistic``: rows
too many to keep n × classes logits beside them): torch's L-BFGS with a strong-Wolfe line
search on the preconditioned weights, each objective evaluation one pass over the rows (logits,
loss and gradient together). The products run in fp32 until their rounding stops the search
short of the tolerance (the objective's last decreases fall below fp32's resolution); the fit
then finishes in fp64 from where it stopped."""

from __future__ import annotations

import torch

from evalkit.device import threads
from evalkit.heads.logistic import FeatureRows, FitInfo, LinearModel, loss_and_grad_of_rows


class _Converged(Exception):
    """Raised by the objective at the first point whose gradient meets the tolerance."""


def fit_streamed(rows: FeatureRows, model: LinearModel, l2: float, maps, max_iter: int, tol: float):
    """Fit ``model`` (fp64 weights, changed in place) to ``tol``; ``maps`` = (T, T⁻¹)."""
    forward, inverse = (m.to(model.weight.device) for m in maps)
    v = inverse @ model.weight
    progress = {"evaluations": 0, "iterations": 0, "grad_max": float("inf"), "compute": None}
    workers = torch.get_num_threads()

    def objective():  # the pass on every thread; L-BFGS's own sums run on one (_minimise)
        with threads(workers):
            model.weight = forward @ v
            loss = loss_and_grad_of_rows(model, rows, l2, progress["compute"])
            grads = (model.weight.grad.abs().max().item(), model.bias.grad.abs().max().item())
            progress["evaluations"] += 1
            progress["grad_max"] = max(grads)
            if progress["grad_max"] <= tol:
                raise _Converged
            v.grad = forward @ model.weight.grad
            return loss

    # fp32 products first; if their rounding stops the line search short of ``tol`` (the
    # objective's last decreases are below fp32's resolution), fp64 from where it stopped.
    for compute in (None, torch.float64):
        progress["compute"] = compute
        if _minimise(objective, [v, model.bias], max_iter - progress["iterations"], progress):
            break
    model.weight = model.weight.detach()
    converged = progress["grad_max"] <= tol
    model.fit = FitInfo(
        progress["iterations"], converged, progress["grad_max"], progress["evaluations"]
    )
    return model


def _minimise(objective, params, max_iter: int, progress: dict) -> bool:
    """L-BFGS (strong Wolfe) on ``params`` until ``objective`` raises ``_Converged`` (True)
    or L-BFGS stops: at ``max_iter`` or when no step decreases the objective (False)."""
    if max_iter <= 0:
        return False
    opt = torch.optim.LBFGS(
        params,
        lr=1,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        history_size=20,
        tolerance_grad=0,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )
    try:  # L-BFGS's dot products on one thread: a threaded dot's order follows the count
        with torch.no_grad(), threads(1):
            opt.step(objective)
            objective()  # the gradient where L-BFGS stopped short
        return False
    except _Converged:
        return True
    finally:
        progress["iterations"] += opt.state[opt._params[0]].get("n_iter", 0)
