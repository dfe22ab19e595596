"""Whether two backbones really differ on the same test images: paired tests on per-image
outputs, and Holm's correction over the pairs of a leaderboard (``evalkit leaderboard``,
``evalkit compare --paired``; docs/results.md, "Leaderboard").

- Accuracy (one right/wrong per image): the exact McNemar test. Only the images where the two
  disagree carry information; under "no difference" each of them is equally likely to favour
  either model, so the count that favours A is Binomial(disagreements, 1/2), and the two-sided
  p-value is twice the smaller tail (at most 1), as ``scipy.stats.binomtest`` computes it.
  Its 90% interval (for equivalence, TOST) is Tango's score interval of the paired
  difference of two proportions: a Wald interval from the flips has zero width when nothing
  flipped, and certified two copies of a 5-image cell equivalent within ±0.01.
- Any other metric recomputable from per-image parts (mean error, mIoU from per-image
  intersections and unions, a mean of per-seed correctness): a paired bootstrap over images.
  Images are resampled with replacement, the same draw for both models; the interval of the
  difference is the resamples' percentile interval, and the two-sided p-value is twice the
  share of resampled differences on the far side of zero, counted as (far + 1) / (resamples
  + 1), at most 1. That count cannot go below 2 / 2001, which Holm's correction over a zoo's
  pairs (55 for 11 backbones) would lift above any level: so where fewer than ``FAR_ENOUGH``
  resamples fall on the far side — the tail too thin to count — the p-value is the tail of
  the bootstrap distribution's spread, |difference| / its standard deviation, whose
  resolution has no floor. Either is then read on Student's t with n − 1 degrees of freedom
  after the plug-in spread's n / (n − 1) correction (``on_student_t``): on the normal, p ≤
  0.01 came twice as often as it should at 30 images. The test says which it used.
- A metric that is a function of sums over images (mIoU of summed intersections and unions,
  ECE of each bin's summed gap, shape bias, an accuracy per group) declares those sums
  (``Sums``): a resample is then a count per image, and the sums of many resamples one matrix
  product of their counts with the per-image rows; the same draws, the same statistic, no
  Python loop over resamples.
- Across a suite's tasks, the Wilcoxon signed-rank test of every two setups' per-task ranks,
  all pairs at once (``signed_rank_p``: scipy's p-values, bit for bit).
- A cell of several seeds is one cluster per image: what is tested is the mean over its seeds
  of the metric (what the leaderboard ranks), each resample drawing the same images for every
  seed of both cells (``paired_bootstrap_seeds``); seeds are never counted as extra images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from evalkit.metrics import binned_ece, confidence_bins, miou_of_classes

RESAMPLES = 2000
LEVEL = 0.05
FAR_ENOUGH = 10  # resamples on the far side of zero below which the tail is too thin to count
CHUNK = 64  # resamples drawn and scored at once (memory: CHUNK × images indices)


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A and B on the same images: the difference of the metric
    (A − B), its 95% interval where a bootstrap gives one, and the p-value of "no difference"."""

    difference: float
    p: float
    test: str
    interval: tuple[float, float] | None = None
    images: int = 0
    interval90: tuple[float, float] | None = None  # for equivalence at 5% each side (TOST)
    flips: tuple[int, int] | None = None  # images only A got right, only B got right


def mcnemar(a_right: np.ndarray, b_right: np.ndarray) -> Paired:
    """The exact McNemar test of two models' per-image correctness on the same images."""
    a_right, b_right = np.asarray(a_right, bool), np.asarray(b_right, bool)
    only_a = int((a_right & ~b_right).sum())
    only_b = int((~a_right & b_right).sum())
    p = binomial_two_sided(min(only_a, only_b), only_a + only_b)
    (interval90,) = tango_interval(only_a, only_b, len(a_right))
    return _mcnemar_of(only_a, only_b, len(a_right), p, interval90)


def mcnemar_all(rights: np.ndarray) -> dict[tuple[int, int], Paired]:
    """``mcnemar`` of every two rows of ``rights`` (models × images, right or wrong on the
    same images), keyed (i, j) for i < j: each pair's discordant counts from one product of
    the correctness matrix with its complement (whole numbers, exact in any order), and the
    binomial tails and score intervals of all pairs at once."""
    right = np.asarray(rights, dtype=np.float64)
    only = right @ (1.0 - right).T  # only[i, j]: images row i got right and row j did not
    i, j = np.triu_indices(len(right), k=1)
    only_a, only_b = only[i, j].astype(np.int64), only[j, i].astype(np.int64)
    p = binomial_two_sided(np.minimum(only_a, only_b), only_a + only_b)
    count = right.shape[1]
    intervals = tango_interval(only_a, only_b, count)
    return {
        (int(a), int(b)): _mcnemar_of(int(x), int(y), count, float(q), interval)
        for a, b, x, y, q, interval in zip(i, j, only_a, only_b, p, intervals, strict=True)
    }


def _mcnemar_of(only_a: int, only_b: int, images: int, p: float, interval90) -> Paired:
    difference = 100.0 * (only_a - only_b) / max(images, 1)
    test = f"exact McNemar ({only_a} images only A right, {only_b} only B)"
    low, high = (float(bound) for bound in interval90)
    return Paired(
        difference, p, test, images=images, interval90=(low, high), flips=(only_a, only_b)
    )


Z90 = 1.6448536269514722  # the standard normal's 95th percentile: a 90% two-sided interval


def tango_interval(only_a, only_b, images, z: float = Z90) -> np.ndarray:
    """Tango's score interval (Statistics in Medicine 17:891, 1998) of the paired difference
    of two proportions, A − B in points, from the images only A and only B got right, one
    (low, high) row per pair (elementwise over arrays): every difference δ whose score
    statistic ``tango_score`` lies within ±z. With z = ``Z90`` its ends are the two
    one-sided 5% score tests of TOST. Unlike the Wald interval it never has zero width: with
    no image flipped, n images still allow ±z²/(n + z²).

    Each end solves T(δ) = ±z; squared, with the restricted estimate substituted, that is
    a quartic in δ, solved for all pairs at once from the eigenvalues of its companion
    matrices. Squaring and the quadratic's other root add false roots: only those where
    T really is ±z, on the right side of the estimate, are ends; an end that never comes
    is the bound ±1 itself."""
    sides = np.broadcast_arrays(only_a, only_b, images)
    b, c, images = (np.asarray(x, float).reshape(-1) for x in sides)
    n = np.maximum(images, 1.0)
    roots = np.linalg.eigvals(_companions(b, c, n, z * z))
    delta, estimate = roots.real, ((b - c) / n)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        score = tango_score(b[:, None], c[:, None], n[:, None], delta)
    real = (np.abs(roots.imag) < 1e-7) & (np.abs(delta) < 1)
    low = real & (delta < estimate) & (np.abs(score - z) < 1e-5)
    high = real & (delta > estimate) & (np.abs(score + z) < 1e-5)
    low = np.where(low, delta, -1.0).max(axis=1)
    high = np.where(high, delta, 1.0).min(axis=1)
    none = images == 0  # no images say nothing: the whole range
    return 100.0 * np.stack([np.where(none, -1.0, low), np.where(none, 1.0, high)], axis=1)


def tango_score(b, c, n, delta):
    """Tango's score statistic of "A − B = δ": (b − c − nδ) / √(n(2q + δ(1 − δ))), q the
    restricted maximum-likelihood probability of an image only B gets right (the larger
    root of 2n·q² + w·q − c·δ(1 − δ) = 0, w = (2n − b + c)·δ − b − c)."""
    w = (2 * n - b + c) * delta - b - c
    q = (np.sqrt(w * w + 8 * n * c * delta * (1 - delta)) - w) / (4 * n)
    return (b - c - n * delta) / np.sqrt(n * (2 * q + delta * (1 - delta)))


def _companions(b, c, n, k) -> np.ndarray:
    """Companion matrices of T(δ)² = k as a quartic in δ: 2q = (b − c − nδ)²/(kn) − δ(1 − δ)
    =: A(δ), a quadratic, put into q's equation: n·A² + w·A − 2c·δ(1 − δ) = 0."""
    r = b - c
    a2, a1, a0 = n / k + 1, -(2 * r / k + 1), r * r / (k * n)  # A = a2·δ² + a1·δ + a0
    w1, w0 = 2 * n - r, -(b + c)  # w = w1·δ + w0
    quartic = np.stack(
        [
            n * a2 * a2,
            2 * n * a2 * a1 + w1 * a2,
            n * (a1 * a1 + 2 * a2 * a0) + w1 * a1 + w0 * a2 + 2 * c,
            2 * n * a1 * a0 + w1 * a0 + w0 * a1 - 2 * c,
            n * a0 * a0 + w0 * a0,
        ],
        axis=1,
    )
    companions = np.zeros((len(b), 4, 4))
    companions[:, 0, :] = -quartic[:, 1:] / quartic[:, :1]
    companions[:, [1, 2, 3], [0, 1, 2]] = 1.0
    return companions


def equivalence(test: Paired, margin: float, higher_is_better: bool) -> str:
    """Two one-sided tests at 5% each (TOST) that A − B lies within ±``margin`` (in the
    metric's points), from the 90% interval of the difference (``interval90``: Tango's score
    interval for an accuracy, the bootstrap's otherwise): "equivalent within ±margin"
    when the interval lies inside; otherwise "not shown equivalent", said to be worse when
    the whole interval lies beyond the margin on the losing side."""
    low, high = test.interval90
    if -margin < low and high < margin:
        return f"equivalent within ±{margin:g}"
    worse = high < -margin if higher_is_better else low > margin
    return "not shown equivalent" + (f"; worse by more than {margin:g}" if worse else "")


def binomial_two_sided(k, n):
    """P(X ≤ k or X ≥ n − k) for X ~ Binomial(n, 1/2), k ≤ n/2: twice the lower tail (the
    regularised incomplete beta function, scipy's ``bdtr``); 1 where 2k ≥ n. Elementwise over
    arrays."""
    from scipy.special import bdtr

    k, n = np.asarray(k), np.asarray(n)
    tail = np.minimum(1.0, 2.0 * bdtr(k, np.maximum(n, 1), 0.5))
    p = np.where((n == 0) | (2 * k >= n), 1.0, tail)
    return float(p) if p.ndim == 0 else p


def paired_bootstrap(
    parts_a: np.ndarray,
    parts_b: np.ndarray,
    metric: Callable[[np.ndarray], float],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    sums: Sums | None = None,
) -> Paired:
    """A paired bootstrap over images of ``metric`` (computed from per-image parts, rows of
    ``parts_*``) for A − B; ``sums``: the same metric from sums over images (``Sums``)."""
    return paired_bootstrap_seeds(
        [parts_a], [parts_b], metric, seed=seed, resamples=resamples, sums=sums
    )


def paired_bootstrap_seeds(
    seeds_a: list[np.ndarray],
    seeds_b: list[np.ndarray],
    metric: Callable[[np.ndarray], float],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    sums: Sums | None = None,
) -> Paired:
    """A paired bootstrap over images of the mean over seeds of ``metric`` for A − B: each
    side's seeds are per-image parts of the same images in the same order; a resample draws
    images once and scores every seed of both sides on that draw (an image is one cluster,
    however many seeds saw it). With ``sums`` a chunk of resamples is scored at once."""
    seeds_a = [np.asarray(p, float) for p in seeds_a]
    seeds_b = [np.asarray(p, float) for p in seeds_b]
    count = len(seeds_a[0])

    def difference(draw) -> float:
        a = np.mean([metric(p if draw is None else p[draw]) for p in seeds_a])
        return float(a - np.mean([metric(p if draw is None else p[draw]) for p in seeds_b]))

    prepared_a = [sums(p) for p in seeds_a] if sums else []
    prepared_b = [sums(p) for p in seeds_b] if sums else []

    def differences_of(draws) -> np.ndarray:
        """A chunk of resamples: at once for a mean of per-image values or a metric of sums,
        else one by one."""
        if sums is not None:
            counts = resample_counts(draws, count)
            return resampled_metric(prepared_a, counts) - resampled_metric(prepared_b, counts)
        if metric is not mean_of:
            return np.array([difference(d) for d in draws])
        a = np.mean([p[:, 0][draws].mean(axis=1) for p in seeds_a], axis=0)
        return a - np.mean([p[:, 0][draws].mean(axis=1) for p in seeds_b], axis=0)

    observed = difference(None)
    rng = np.random.default_rng(seed)
    differences = np.empty(resamples)
    for start in range(0, resamples, CHUNK):  # a chunk of draws at a time: bounded memory
        draws = rng.integers(0, count, size=(min(CHUNK, resamples - start), count))
        differences[start : start + len(draws)] = differences_of(draws)
    low, high = np.percentile(differences, [2.5, 97.5])
    low90, high90 = np.percentile(differences, [5, 95])
    p, how = bootstrap_p(observed, differences, count)
    clusters = (
        f", {len(seeds_a)} and {len(seeds_b)} seeds per image"
        if len(seeds_a) + len(seeds_b) > 2
        else ""
    )
    test = f"paired bootstrap over {count} images ({resamples} resamples{clusters}; p: {how})"
    return Paired(
        observed, p, test, (float(low), float(high)), count, (float(low90), float(high90))
    )


def bootstrap_p(observed: float, differences: np.ndarray, images: int) -> tuple[float, str]:
    """The two-sided p-value of "no difference" from resampled differences over ``images``
    images (clusters), and how it was found: the far side's count where it holds at least
    ``FAR_ENOUGH`` resamples, else the resamples' spread (no resolution floor for Holm to
    lift). Either is read as a z and then on Student's t (``on_student_t``)."""
    if observed == 0:
        return 1.0, "no difference observed"
    if images < 2:
        return 1.0, "one image: nothing to resample"
    far_side = int((differences <= 0).sum() if observed > 0 else (differences >= 0).sum())
    if far_side >= FAR_ENOUGH:
        from scipy.special import ndtri

        counted = min(1.0, 2.0 * (far_side + 1) / (len(differences) + 1))
        return on_student_t(-float(ndtri(counted / 2)), images), "far-side count, on t"
    spread = float(differences.std(ddof=1))
    if spread == 0:
        return 0.0, "every resample on one side, no spread"
    tail = on_student_t(abs(observed) / spread, images)
    return tail, "t tail of the resamples' spread (fewer than 10 on the far side)"


def on_student_t(z: float, images: int) -> float:
    """The two-sided p of a bootstrap's z over ``images`` images, on Student's t with
    images − 1 degrees of freedom. A bootstrap's spread is the plug-in one, which divides by
    n, not n − 1, and a normal reference ignores that the spread is itself estimated: at 30
    images the two together doubled the rate of p ≤ 0.01 under no difference. Rescaled by
    √((n − 1)/n), z is the paired t statistic (for a mean, exactly in expectation), and t's
    tail makes the p calibrated at small n; at hundreds of images it is the normal tail."""
    from scipy.special import stdtr

    t = z * math.sqrt((images - 1) / images)
    return float(min(1.0, 2.0 * stdtr(images - 1, -t)))


EXACT_SIGNS = 13  # up to this many pairs scipy's wilcoxon enumerates every sign (2^13 < 9,999)


def signed_rank_p(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Two-sided p-values of the Wilcoxon signed-rank test of each row of ``x`` against the
    same row of ``y`` (zeros split between the signs), as ``scipy.stats.wilcoxon(x, y,
    zero_method="zsplit")`` gives them, for rows of at most ``EXACT_SIGNS`` pairs: there scipy
    counts, over all 2^n signs of the differences, the sums of positive ranks at least as far
    out as the observed one, and so does this, for every row at once. Longer rows (scipy's
    normal approximation) are left to scipy, one by one."""
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = x.shape[1]
    if n > EXACT_SIGNS:
        pairs = zip(x, y, strict=True)
        return np.array([stats.wilcoxon(a, b, zero_method="zsplit").pvalue for a, b in pairs])
    d = x - y
    ranks = stats.rankdata(np.abs(d), axis=1)  # average ranks of ties, zeros ranked too
    zeros = np.where(d == 0, ranks / 2, 0.0).sum(axis=1)  # half of each zero's rank each side
    plus = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(float)  # every sign: (2^n, n)
    # sums of (half-)ranks, whole multiples of 1/2: exact whatever the order of the additions
    null = np.where(d != 0, ranks, 0.0) @ plus.T + zeros[:, None]  # (rows, 2^n)
    observed = np.where(d > 0, ranks, 0.0).sum(axis=1) + zeros
    tolerance = 100 * np.finfo(float).eps * np.abs(observed)[:, None]
    low = (null <= observed[:, None] + tolerance).sum(axis=1)
    high = (null >= observed[:, None] - tolerance).sum(axis=1)
    return np.clip(2 * np.minimum(low, high) / 2**n, 0, 1)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one family): the adjusted p-values, in the
    given order; reject where an adjusted value is at most the level."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class PerImageTest:
    """How a task's metric is recomputed from one cell's per-image outputs, for its paired
    test: ``parts(frame)`` gives an (images, k) array and ``statistic(parts)`` the metric from
    it; ``binary`` parts are one right-or-wrong per image, ×100, so a pair of one-seed cells
    gets the exact McNemar test. Tasks declare theirs (``Task.paired_test``)."""

    parts: Callable
    statistic: Callable[[np.ndarray], float]
    binary: bool = False
    sums: Sums | None = None  # the statistic from sums over images, for fast resampling


Sums = Callable[[np.ndarray], tuple[np.ndarray, Callable[[np.ndarray, int], np.ndarray]]]
"""A metric that is a function of column sums over images: ``sums(parts)`` gives each image's
row (images × m) and ``of_sums(totals, images)``, the metric of many resamples at once from
their column totals ((resamples × m) → (resamples,)). ``of_sums`` of the plain totals is the
metric itself, up to the order of the additions."""


def resample_counts(draws: np.ndarray, images: int) -> np.ndarray:
    """How often each image is drawn by each resample (rows of ``draws``): (resamples, images)."""
    offsets = draws + images * np.arange(len(draws))[:, None]
    counts = np.bincount(offsets.ravel(), minlength=len(draws) * images)
    return counts.reshape(len(draws), images).astype(np.float64)


def resampled_metric(prepared: list, counts: np.ndarray) -> np.ndarray:
    """The metric on each resample (a row of ``counts``), averaged over seeds (``prepared``:
    each seed's (rows, of_sums), as ``Sums`` gives them)."""
    images = counts.shape[1]
    return np.mean([of_sums(counts @ rows, images) for rows, of_sums in prepared], axis=0)


def column_mean(column: str, scale: float = 1.0) -> PerImageTest:
    """A metric that is the mean of a per-image column (× ``scale``)."""
    return PerImageTest(lambda frame: scale * frame[[column]].to_numpy(float), mean_of)


def default_paired_test(metric: str, columns: set[str]) -> PerImageTest | None:
    """A metric that is the mean of a per-image column of its name (a task that declares no
    paired test of its own, or one not known here); a column of lists or text is no such
    mean, and its pair is untested."""
    if metric not in columns:
        return None
    test = column_mean(metric)
    return PerImageTest(_numeric_parts(test.parts), test.statistic)


def _numeric_parts(parts):
    def numeric(frame):
        try:
            return parts(frame)
        except (TypeError, ValueError):  # lists or text: NaN, and the pair says it is untested
            return np.full((len(frame), 1), np.nan)

    return numeric


def right_or_wrong(correct_of: Callable) -> PerImageTest:
    """An accuracy in points from each image's right or wrong (``correct_of(frame)``)."""
    return PerImageTest(
        lambda frame: 100.0 * np.asarray(correct_of(frame), float).reshape(-1, 1),
        mean_of,
        binary=True,
    )


def mean_of(parts: np.ndarray) -> float:
    """The mean over images of a per-image value (the first column when there are several)."""
    return float(parts.reshape(len(parts), -1)[:, 0].mean())


def miou_of(parts: np.ndarray) -> float:
    """Mean IoU (×100) from per-image intersections and unions, laid side by side per image
    (classes first, then the same classes' unions), summed over the images first."""
    intersections, unions = np.split(parts.sum(axis=0), 2)
    return miou_of_classes(intersections, unions)


def miou_of_sums(totals: np.ndarray, images: int) -> np.ndarray:
    """``miou_of`` of each row of summed (intersections, unions): the mean IoU (×100) over the
    classes present in that resample (0 where none is)."""
    intersections, unions = np.split(totals, 2, axis=1)
    present = unions > 0
    ratios = np.divide(intersections, unions, out=np.zeros_like(intersections), where=present)
    classes = present.sum(axis=1)
    return np.where(classes > 0, 100.0 * ratios.sum(axis=1) / np.maximum(classes, 1), 0.0)


def miou_sums(parts: np.ndarray):
    """``Sums`` of mIoU: the per-image (intersections, unions) rows as they are."""
    return parts, miou_of_sums


def ece_of(parts: np.ndarray, bins: int) -> float:
    """ECE from per-image (confidence, correct) rows, binned as the calibration task bins."""
    confidence, correct = parts[:, 0], parts[:, 1]
    return binned_ece(confidence_bins(confidence, bins), correct, confidence, bins)


def ece_gaps(parts: np.ndarray) -> np.ndarray:
    """Each image's (correct − confidence) in its confidence bin's column, from (confidence,
    correct, bins) rows: a bin's column sum is its gap, and ECE Σ_b |gap_b| / images."""
    bins = int(parts[0, 2])
    gaps = np.zeros((len(parts), bins))
    gaps[np.arange(len(parts)), confidence_bins(parts[:, 0], bins)] = parts[:, 1] - parts[:, 0]
    return gaps


def ece_sums(parts: np.ndarray):
    """``Sums`` of ECE from (confidence, correct, bins) rows."""
    return ece_gaps(parts), lambda totals, images: np.abs(totals).sum(axis=1) / images
