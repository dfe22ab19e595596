"""The paper's debiaser: the randomized threshold optimizer (RTO) of Alabdulmohsin & Lucic
(NeurIPS 2021), which the CelebA fairness evaluation uses by default (docs/protocols.md,
"Fairness").

RTO is label-free. A classifier's score p ∈ [0, 1] is rescaled to y = 2p − 1 ∈ [−1, 1]. Within
each subgroup k the rule predicts positive with probability h(y) = clip((y − t_k)/γ, 0, 1): a
threshold t_k with a randomised band of width γ above it. The thresholds solve

    minimise  Σ_i γ/2·h_i² − y_i·h_i   subject to   |E_k[h] − ρ| ≤ ε/2 for every subgroup k,

ρ being the mean score E[p] over all images (the band's anchor), so every two subgroups'
selection rates are at most ε apart and each rule changes the scores as little as the band
allows. The problem splits by subgroup, and for one subgroup its dual has one variable, the
threshold: with t = 0 (h = clip(y/γ)) inside the band nothing moves; otherwise t is where the
subgroup's mean selection E_k[h] — continuous and non-increasing in t — meets the nearer edge
of the band. The authors reach that point by projected SGD then full gradient descent on the
dual; here it is found by bisection to float64 precision (tests/test_fairness.py checks both
agree on the same scores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BISECTIONS = 200  # halvings of the threshold's interval: far below float64's resolution


@dataclass(frozen=True)
class RandomizedThresholds:
    """Fitted RTO rules: per subgroup its threshold on the rescaled score, the band's width
    ``gamma``, and the selection rates reached where it was fitted."""

    thresholds: dict[int, float]
    gamma: float
    rates: dict[int, float]
    anchor: float  # ρ, the mean score the rates are held around

    def positive_probability(self, scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Each image's probability of being predicted positive."""
        shift = np.array([self.thresholds.get(int(g), 0.0) for g in groups])
        return randomized_rule(2.0 * np.asarray(scores, float) - 1.0, shift, self.gamma)


def randomized_rule(rescaled: np.ndarray, threshold, gamma: float) -> np.ndarray:
    return np.clip((rescaled - threshold) / gamma, 0.0, 1.0)


def fit_rto(scores: np.ndarray, groups: np.ndarray, level: float, gamma: float):
    """RTO's rules for demographic-parity level ``level`` (the largest gap allowed between
    two subgroups' selection rates) from scores p ∈ [0, 1] and subgroups; no labels."""
    scores, groups = np.asarray(scores, float), np.asarray(groups)
    rescaled, anchor = 2.0 * scores - 1.0, float(scores.mean())
    low, high = anchor - level / 2.0, anchor + level / 2.0
    thresholds, rates = {}, {}
    for group in np.unique(groups):
        mine = rescaled[groups == group]
        thresholds[int(group)] = _threshold(mine, gamma, low, high)
        rates[int(group)] = float(randomized_rule(mine, thresholds[int(group)], gamma).mean())
    return RandomizedThresholds(thresholds, gamma, rates, anchor)


def _threshold(rescaled: np.ndarray, gamma: float, low: float, high: float) -> float:
    """The threshold of one subgroup: 0 when its mean selection is already in [low, high],
    else where that mean meets the nearer edge."""
    start = randomized_rule(rescaled, 0.0, gamma).mean()
    if low <= start <= high:
        return 0.0
    target = high if start > high else low
    left, right = (0.0, 1.0) if start > high else (-1.0 - gamma, 0.0)  # selects all … none
    for _ in range(BISECTIONS):
        middle = (left + right) / 2.0
        if randomized_rule(rescaled, middle, gamma).mean() > target:
            left = middle
        else:
            right = middle
    return (left + right) / 2.0
