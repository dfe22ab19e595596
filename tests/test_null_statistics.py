"""The statistics test themselves: under a simulated null (two backbones drawn from one
distribution) the exact McNemar test and the paired bootstrap reject at most at their level,
Holm holds the family-wise error over a board's pairs, and the bootstrap's 95% interval covers
a known difference about 95% of the time (each within three Monte Carlo standard errors)."""

from __future__ import annotations

import math

import numpy as np

from evalkit.significance import holm, mcnemar, mean_of, paired_bootstrap

LEVEL, BOARDS = 0.05, 1000


def allowed(rate: float, trials: int = BOARDS) -> float:
    """The level plus three Monte Carlo standard errors of a rejection rate."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / trials)


def test_mcnemars_type_one_error_is_at_most_the_level():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.3, 0.9, size=300)  # each image's chance of being right, for both
    rejected = 0
    for _ in range(BOARDS):
        a, b = rng.uniform(size=(2, 300)) < truth
        rejected += mcnemar(a, b).p <= LEVEL
    assert rejected / BOARDS <= allowed(LEVEL)


def test_the_bootstraps_type_one_error_and_coverage():
    rng = np.random.default_rng(1)
    rejected = covered = 0
    for _ in range(BOARDS):
        base = rng.gamma(2.0, 1.0, size=(200, 1))
        a = base + rng.normal(0, 0.5, size=(200, 1))
        b = base + rng.normal(0, 0.5, size=(200, 1))  # the same distribution: no difference
        seed = int(rng.integers(1 << 30))
        rejected += paired_bootstrap(a, b, mean_of, seed=seed, resamples=400).p <= LEVEL
        low, high = paired_bootstrap(a + 0.3, b, mean_of, seed=seed, resamples=400).interval
        covered += low <= 0.3 <= high  # the true difference of A + 0.3 and B
    assert rejected / BOARDS <= allowed(LEVEL)
    assert 0.93 <= covered / BOARDS <= 0.97


def test_holm_holds_the_family_wise_error_of_a_boards_pairs():
    rng = np.random.default_rng(2)
    truth = rng.uniform(0.3, 0.9, size=200)
    wrong_boards = 0
    for _ in range(BOARDS // 2):
        right = rng.uniform(size=(6, 200)) < truth  # six backbones, none better: 15 pairs
        pairs = [mcnemar(right[i], right[j]).p for i in range(6) for j in range(i + 1, 6)]
        wrong_boards += min(holm(pairs)) <= LEVEL
    assert wrong_boards / (BOARDS // 2) <= allowed(LEVEL, BOARDS // 2)


def test_a_twenty_backbone_board_finds_the_one_truly_better_backbone():
    from evalkit.significance import holm as adjust

    rng = np.random.default_rng(3)
    truth = rng.uniform(0.3, 0.9, size=2000)
    right = rng.uniform(size=(20, 2000)) < truth
    right[0] = rng.uniform(size=2000) < np.minimum(truth + 0.1, 1.0)  # ten points better
    pairs = [(i, j) for i in range(20) for j in range(i + 1, 20)]
    p = adjust([mcnemar(right[i], right[j]).p for i, j in pairs])
    found = {pair for pair, value in zip(pairs, p, strict=True) if value <= LEVEL}
    assert {(0, j) for j in range(1, 20)} <= found
    assert len(found - {(0, j) for j in range(1, 20)}) <= 1  # at most a chance false alarm
