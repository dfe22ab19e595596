"""What a paired test could have seen: the minimum detectable effect (MDE) of each test in
``evalkit.significance`` — the smallest true difference it finds at its level 80% of the time —
and the images or seeds it would take to see a given one (``evalkit power``; the MDE beside
every paired verdict of ``evalkit leaderboard`` and ``evalkit compare``; docs/results.md).

- Exact McNemar (accuracies): the normal approximation for paired proportions at the observed
  discordant rate ψ (images only one of the two got right, over n): δ = (z₁₋α/₂ + z₀.₈)·√(ψ/n).
  The variance is taken at the observed ψ rather than Connor's ψ − δ² under the alternative: the
  exact conditional test is slightly conservative (it reaches 77–79% at this δ, for ψ from 2% to
  40% and n from 50 to 1,000), and the two effects nearly cancel. A difference of δ needs at
  least δ of the images to flip, so ψ is never taken below δ: at small churn the MDE is
  (z₁₋α/₂ + z₀.₈)²/n, a handful of one-way flips, never zero.
- Paired bootstrap (any other metric): δ = (t₁₋α/₂ + t₀.₈)·sd_diff/√n on Student's t with
  n − 1 degrees of freedom, as the bootstrap's p is read (``significance.on_student_t``).
  sd_diff/√n is the bootstrap's own standard error of the difference, taken from the width of
  its 95% percentile interval and rescaled by √(n/(n − 1)) as the test rescales it; for a mean
  of per-image values that is the per-image sd of the paired differences over √n.
- Seeds (a comparison of the means of k seeds per setup): δ = (t₁₋α/₂ + t₀.₈)·√(s_a²/k_a +
  s_b²/k_b) with k_a + k_b − 2 degrees of freedom, s the spread over seeds.

Where a verdict is Holm-corrected the level is Holm's for that verdict (``holm_level``).
"""

from __future__ import annotations

import math

from evalkit.significance import Paired

POWER = 0.8
Z975 = 1.959963984540054  # the 95% interval's half-width in standard errors


def _z(p: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(p))


def _t(p: float, freedom: float) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(max(freedom, 1.0), p))


def holm_level(level: float, tested: int, rejected_others: int) -> float:
    """The level Holm's step-down rule holds one of ``tested`` p-values to when
    ``rejected_others`` of the others are rejected: it is judged at step rejected_others + 1,
    against level / (tested − rejected_others). For a pair found not significant this is
    exactly the level its p would have had to clear."""
    return level / max(tested - rejected_others, 1)


def mcnemar_mde(discordant: int, images: int, level: float) -> float:
    """The exact McNemar test's MDE in points on ``images`` images of which ``discordant``
    were right for one side only: (z₁₋α/₂ + z₀.₈)·√(ψ/n), ψ never below the δ it implies."""
    if images <= 0:
        return math.inf
    k = _z(1 - level / 2) + _z(POWER)
    share = discordant / images
    return 100.0 * max(k * math.sqrt(share / images), k * k / images)


def bootstrap_mde(standard_error: float, images: int, level: float) -> float:
    """The paired bootstrap's MDE from its standard error of the difference (sd_diff/√n, in
    the metric's points): (t₁₋α/₂ + t₀.₈)·se, t with images − 1 degrees of freedom."""
    freedom = images - 1
    return (_t(1 - level / 2, freedom) + _t(POWER, freedom)) * standard_error


def bootstrap_error(test: Paired) -> float | None:
    """A bootstrap's standard error of the difference from its 95% percentile interval
    (half its width is z₀.₉₇₅ plug-in standard errors), rescaled by √(n/(n − 1)) as
    ``on_student_t`` rescales it; None without an interval or with a single image."""
    if test.interval is None or test.images < 2:
        return None
    low, high = test.interval
    return (high - low) / (2 * Z975) * math.sqrt(test.images / (test.images - 1))


def mde(test: Paired, level: float) -> float | None:
    """The MDE of a paired test at ``level`` (two-sided), in the metric's points; None where
    the outputs carry no spread to size a change by (two identical bootstrapped sides)."""
    if test.flips is not None:
        return mcnemar_mde(sum(test.flips), test.images, level)
    error = bootstrap_error(test)
    return bootstrap_mde(error, test.images, level) if error else None


def unrelated_mde(value_a: float, value_b: float, images: int, level: float) -> float:
    """McNemar's MDE were the two sides' mistakes unrelated (accuracies in points): churn
    ψ = a(1 − b) + b(1 − a). What a gate can promise about a regression it has not seen,
    whose churn its NEW-equals-BASE comparison cannot show."""
    a, b = value_a / 100.0, value_b / 100.0
    churn = a * (1 - b) + b * (1 - a)
    return mcnemar_mde(round(churn * images), images, level)


def equivalence_margin(test: Paired) -> float | None:
    """The smallest margin TOST at 5% each side shows 80% of the time when nothing truly
    differs: (z₀.₉₅ + z₀.₉₀)·se (both one-sided tests must pass, so the power is shared
    between the two sides). McNemar's se is √(ψ/n), floored by the score interval's
    half-width with no flip, z²/(n + z²); a bootstrap's its own (``bootstrap_error``)."""
    k = _z(0.95) + _z(1 - (1 - POWER) / 2)
    if test.flips is None:
        error = bootstrap_error(test)
        return k * error if error else None
    n = max(test.images, 1)
    z2 = _z(0.95) ** 2
    return 100.0 * max(k * math.sqrt(sum(test.flips) / n / n), z2 / (n + z2))


def images_needed(test: Paired, detect: float, level: float) -> int | None:
    """Images to detect a true difference of ``detect`` points 80% of the time at ``level``,
    at the observed discordant rate (McNemar: n = k²·max(ψ, δ)/δ²) or per-image spread (the
    bootstrap: n = ((t + t)·sd_diff/δ)², t's freedom n − 1 found by a few fixed-point steps)."""
    delta = detect / 100.0
    if test.flips is not None:
        k = _z(1 - level / 2) + _z(POWER)
        share = sum(test.flips) / max(test.images, 1)
        return math.ceil(k * k * max(share, delta) / (delta * delta))
    error = bootstrap_error(test)
    if not error:
        return None
    spread, needed = error * math.sqrt(test.images), test.images
    for _ in range(8):  # t's quantiles settle within a few steps
        k = _t(1 - level / 2, needed - 1) + _t(POWER, needed - 1)
        needed = max(2, math.ceil((k * spread / detect) ** 2))
    return needed


def seed_mde(spreads: tuple[float, float], seeds: tuple[int, int], level: float) -> float:
    """The MDE of comparing two setups' means over seeds (``spreads``: each side's sd over
    its seeds, ``seeds``: how many each ran): (t + t)·√(s_a²/k_a + s_b²/k_b)."""
    (s_a, s_b), (k_a, k_b) = spreads, seeds
    freedom = k_a + k_b - 2
    error = math.sqrt(s_a * s_a / k_a + s_b * s_b / k_b)
    return (_t(1 - level / 2, freedom) + _t(POWER, freedom)) * error


MOST_SEEDS = 10_000


def seeds_needed(spreads: tuple[float, float], detect: float, level: float) -> int | None:
    """Seeds per setup for the seed-level MDE to reach ``detect`` points (at least 2: one seed
    has no spread); None if even ``MOST_SEEDS`` would not."""
    for k in range(2, MOST_SEEDS + 1):
        if seed_mde(spreads, (k, k), level) <= detect:
            return k
    return None


def interval95(test: Paired) -> tuple[float, float] | None:
    """The 95% interval of the difference: the bootstrap's percentile interval, or for
    McNemar Tango's score interval at z₀.₉₇₅ (what its 90% one is at z₀.₉₅)."""
    if test.flips is None:
        return test.interval
    from evalkit.significance import tango_interval

    ((low, high),) = tango_interval(*test.flips, test.images, Z975)
    return float(low), float(high)


def difference_text(test: Paired) -> str:
    """The difference with its 95% interval, signed: ``-0.80 [-2.10, +0.52]``."""
    interval = interval95(test)
    shown = f"{test.difference:+.2f}"
    return shown + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "")


def sight(detectable: float | None, level: float) -> str:
    """What a verdict could have seen, in words: the MDE at its (Holm) level."""
    if detectable is None:
        return "MDE unknown (the two sides' outputs show no spread to size a change by)"
    return f"would detect ≥ {points(detectable)} points 80% of the time (at level {level:.3g})"


def points(value: float) -> str:
    """An MDE or a margin as text: one decimal, two significant digits below 1."""
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2g}"
