"""A binary classifier's scores post-processed to a demographic-parity level (the paper's
CelebA fairness evaluation; docs/protocols.md, "Fairness").

Demographic parity compares selection rates — the share of a subgroup predicted positive.
For each subgroup, every threshold on the scores gives a (selection rate, accuracy) point;
predicting positive at random between two adjacent thresholds reaches every point of the upper
concave hull of those points (Hardt et al. 2016). At a level ε, each subgroup gets its own rate
on that hull, the rates at most ε apart, chosen to maximise the accuracy over all subgroups
(each weighted by its share of the images). Rates are searched on a grid of ``GRID`` steps,
as fairlearn's ``ThresholdOptimizer`` searches them, with the same sliding window over a band
of width ε, so the two choose the same optimum on the same scores (tests/test_fairness.py).

A fitted rule gives each image a probability of being predicted positive; accuracies and
selection rates are reported as their expectations under that randomness, so the numbers do
not depend on a draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = 1000  # selection-rate steps searched (fairlearn's default grid_size)


@dataclass(frozen=True)
class Hull:
    """One subgroup's upper concave hull: at ``rates[k]`` the images scoring at least
    ``thresholds[k]`` are selected, with accuracy ``accuracy[k]`` within the subgroup."""

    rates: np.ndarray
    accuracy: np.ndarray
    thresholds: np.ndarray
    cuts: np.ndarray  # midway between each threshold and the fitted score just below it

    def positive_probability(self, scores: np.ndarray, rate: float) -> np.ndarray:
        """Each image's probability of selection under the randomised rule that selects a
        ``rate`` share of the images the hull was fitted on. An image is selected when its
        score is above the cut midway between the threshold and the fitted score just below
        it, as fairlearn's ``ThresholdOptimizer`` cuts (``score > t``): on fitted scores the
        same as ``≥`` the threshold, and an unseen score between two fitted ones is placed
        as fairlearn places it."""
        upper = int(np.clip(np.searchsorted(self.rates, rate), 1, len(self.rates) - 1))
        lower = upper - 1
        span = self.rates[upper] - self.rates[lower]
        mix = (rate - self.rates[lower]) / span if span else 0.0
        sure = scores > self.cuts[lower]
        maybe = (scores > self.cuts[upper]) & ~sure
        return sure.astype(np.float64) + mix * maybe


def tradeoff_hull(scores: np.ndarray, labels: np.ndarray) -> Hull:
    """The (selection rate, accuracy) points of every threshold between distinct scores, from
    selecting nothing to selecting everything, reduced to their upper concave hull."""
    order = np.argsort(-scores, kind="stable")
    ordered, positives = scores[order], labels[order].astype(np.float64)
    n, total_positive = len(ordered), positives.sum()
    last_of_tie = np.r_[ordered[1:] != ordered[:-1], True]
    selected = np.arange(1, n + 1)[last_of_tie]
    true_pos = np.cumsum(positives)[last_of_tie]
    true_neg = (n - total_positive) - (selected - true_pos)
    rates = np.r_[0.0, selected / n]
    accuracy = np.r_[(n - total_positive) / n, (true_pos + true_neg) / n]
    thresholds = np.r_[np.inf, ordered[last_of_tie]]
    below = np.r_[thresholds[1:], -np.inf]  # distinct scores, descending: the next one down
    with np.errstate(invalid="ignore"):
        cuts = np.where(np.isinf(thresholds), thresholds, (thresholds + below) / 2)
    cuts[-1] = -np.inf  # everything selected
    keep = _upper_hull(rates, accuracy)
    return Hull(rates[keep], accuracy[keep], thresholds[keep], cuts[keep])


def _upper_hull(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Andrew's monotone chain over points sorted by x: the indices of the upper hull."""
    kept: list[int] = []
    for i in range(len(x)):
        while len(kept) >= 2:
            a, b = kept[-2], kept[-1]
            if (y[b] - y[a]) * (x[i] - x[a]) <= (y[i] - y[a]) * (x[b] - x[a]):
                kept.pop()
            else:
                break
        kept.append(i)
    return kept


@dataclass(frozen=True)
class ParityRule:
    """A selection rate per subgroup (their spread at most ``level``) and each one's hull."""

    level: float
    hulls: dict
    rates: dict
    objective: float  # expected accuracy on the images the rule was fitted on

    def positive_probability(self, scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
        out = np.zeros(len(scores))
        for group, hull in self.hulls.items():
            where = groups == group
            out[where] = hull.positive_probability(scores[where], self.rates[group])
        return out


def fit_parity(scores, labels, groups, level: float) -> ParityRule:
    """The subgroup rates at most ``level`` apart that maximise the expected accuracy on
    (``scores``, ``labels``); ties go to the smaller spread, then to the lower rates."""
    scores, labels, groups = (np.asarray(v) for v in (scores, labels, groups))
    names = sorted(set(groups.tolist()))
    hulls, curves, weights = {}, [], []
    grid = np.linspace(0, 1, GRID + 1)
    for name in names:
        where = groups == name
        if len(set(labels[where].tolist())) < 2:
            raise ValueError(f"subgroup {name!r} has one label only: no threshold trades off")
        hulls[name] = tradeoff_hull(scores[where], labels[where])
        curves.append(np.interp(grid, hulls[name].rates, hulls[name].accuracy))
        weights.append(where.mean())
    chosen, objective = _best_in_band(grid, np.stack(curves) * np.array(weights)[:, None], level)
    rates = {name: float(grid[i]) for name, i in zip(names, chosen, strict=True)}
    return ParityRule(level, hulls, rates, objective)


def _best_in_band(grid: np.ndarray, weighted: np.ndarray, level: float):
    """Over every window of grid points at most ``level`` wide, each subgroup's best point;
    the window whose sum is largest (fairlearn's sliding window, the same comparisons)."""
    best, best_sum, best_spread, start = None, -np.inf, np.inf, 0
    for end in range(len(grid)):
        while grid[end] - grid[start] > level:
            start += 1
        window = weighted[:, start : end + 1]
        # the last maximum in the window, as fairlearn's deque keeps it
        picks = start + (window.shape[1] - 1 - np.argmax(window[:, ::-1], axis=1))
        total = float(weighted[np.arange(len(picks)), picks].sum())
        spread = float(np.ptp(grid[picks]))
        if total > best_sum or (total == best_sum and spread <= best_spread):
            best, best_sum, best_spread = picks, total, spread
    return [int(i) for i in best], best_sum


def selection_rates(positive: np.ndarray, groups: np.ndarray) -> dict:
    """Each subgroup's (expected) share of images predicted positive."""
    return {g: float(positive[groups == g].mean()) for g in sorted(set(groups.tolist()))}


def parity_gap(positive, groups) -> float:
    """Demographic-parity difference: the largest minus the smallest subgroup selection rate
    (fairlearn's ``demographic_parity_difference``, here of expected predictions too)."""
    rates = selection_rates(np.asarray(positive, dtype=np.float64), np.asarray(groups))
    return max(rates.values()) - min(rates.values())


def expected_accuracy(positive, labels, groups=None) -> dict:
    """Expected accuracy overall and per subgroup of positive-probabilities ``positive``."""
    positive, labels = np.asarray(positive, np.float64), np.asarray(labels)
    right = np.where(labels == 1, positive, 1 - positive)
    out = {"all": float(right.mean())}
    if groups is not None:
        groups = np.asarray(groups)
        out |= {g: float(right[groups == g].mean()) for g in sorted(set(groups.tolist()))}
    return out
