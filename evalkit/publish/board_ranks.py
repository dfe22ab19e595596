"""The leaderboard's ranks (docs/results.md, "A zoo and its leaderboard"): per task the
ranks on its headline metric, lower-is-better metrics inverted, tied values sharing the mean
of their places; the aggregate over a consistent suite, each setup with a value on every board
ranked by its mean rank among those complete setups (one that lacks a board is listed after
them with what it lacks), with the uncertainty of both the task sample and each task's images
(a rank interval and P(first) per setup); the tests across tasks on per-task ranks (Friedman's,
and per pair the Wilcoxon signed-rank test with Holm or Nemenyi's critical difference) with the
cliques and tiers they draw; per board the tiers its paired tests draw (``board_pairs``); and a
cell's spread over its seeds."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from evalkit.publish.board_reading import Board, Cell
from evalkit.significance import holm, signed_rank_p


def _ranked(board: Board) -> Board:
    """Ranks 1 (best) … n, tied values sharing the mean of their places."""
    sign = -1.0 if board.higher_is_better else 1.0
    ordered = sorted(board.cells, key=lambda c: sign * c.value)
    place = 0
    for _, tied in itertools.groupby(ordered, key=lambda c: c.value):
        tied = list(tied)
        for cell in tied:
            cell.rank = place + (len(tied) + 1) / 2
        place += len(tied)
    board.cells = ordered
    return board


def overall(boards: list[Board], backbones: list[str], seed: int = 0) -> list[dict]:
    """The aggregate over a consistent suite: each setup with a value on every board gets its
    mean rank among those complete setups only (re-ranked per board, so a setup that ran one
    task cannot lead, and one that skipped a task cannot move the others), with the
    uncertainty of the task sample (``rank_uncertainty``); a setup that lacks a board is listed
    after them with what it lacks and no mean rank."""
    missing = {
        name: [b.task for b in boards if name not in {c.backbone for c in b.cells}]
        for name in backbones
    }
    complete = [name for name in backbones if not missing[name]]
    table = complete_ranks(boards, complete)
    draws = [rank_draws(board, complete, table[b]) for b, board in enumerate(boards)]
    spread = rank_uncertainty(draws, seed) if len(complete) > 1 else {}
    records = [
        {
            "backbone": name,
            "mean_rank": round(float(table[:, i].mean()), 3) if table.size else None,
            "tasks": len(boards),
            "missing": [],
            **spread.get(i, {}),
        }
        for i, name in enumerate(complete)
    ]
    records += [
        {"backbone": name, "mean_rank": None, "tasks": len(boards) - len(lack), "missing": lack}
        for name, lack in missing.items()
        if lack
    ]
    return sorted(
        records, key=lambda r: (r["mean_rank"] is None, r["mean_rank"] or 0, r["backbone"])
    )


def complete_ranks(boards: list[Board], complete: list[str]) -> np.ndarray:
    """(boards, setups) ranks of the complete setups among themselves, board by board."""
    table = np.zeros((len(boards), len(complete)))
    for b, board in enumerate(boards):
        kept = [replace(cell) for cell in board.cells if cell.backbone in complete]
        ranked = _ranked(Board(board.task, board.metric, board.higher_is_better, kept))
        place = {cell.backbone: cell.rank for cell in ranked.cells}
        table[b] = [place[name] for name in complete]
    return table


TASK_RESAMPLES = 2000


def rank_draws(board: Board, complete: list[str], observed: np.ndarray) -> np.ndarray:
    """(image resamples, setups) ranks of the complete setups on ``board``, one row per
    shared resample of its images (``Board.resampled``), 1 = best, ties sharing their mean
    place; a board without per-image resamples gives its observed ranks as its one row."""
    from scipy.stats import rankdata

    if not board.resampled or any(name not in board.resampled for name in complete):
        return observed[None, :]
    values = np.stack([board.resampled[name] for name in complete], axis=1)
    return rankdata(-values if board.higher_is_better else values, axis=1)


def rank_uncertainty(draws: list[np.ndarray], seed: int) -> dict[int, dict]:
    """The order's uncertainty at both levels: the suite's tasks as a sample and each task's
    images as a sample. A resample draws the boards with replacement and, for each drawn
    board, one resample of its images (``rank_draws``: the setups' ranks on it), then
    recomputes every setup's mean rank and its place; per setup its place's 95% interval
    [low, high] and P(first), the share of resamples where it is first (a tie for first
    shared). Resampling the tasks alone took each task's observed order as certain, which
    made a leader out of noise. Keyed by column."""
    rng = np.random.default_rng(seed)
    tasks = len(draws)
    picked = rng.integers(0, tasks, size=(TASK_RESAMPLES, tasks))
    sums = np.zeros((TASK_RESAMPLES, draws[0].shape[1]))
    for slot in range(tasks):
        for board, ranks in enumerate(draws):
            rows = picked[:, slot] == board
            sums[rows] += ranks[rng.integers(0, len(ranks), size=int(rows.sum()))]
    places = np.apply_along_axis(_places, 1, sums / tasks)
    first = (places == places.min(axis=1, keepdims=True)).astype(float)
    first /= first.sum(axis=1, keepdims=True)
    low, high = np.percentile(places, [2.5, 97.5], axis=0)
    return {
        index: {
            "rank_interval": [float(low[index]), float(high[index])],
            "p_first": round(float(first[:, index].mean()), 4),
        }
        for index in range(draws[0].shape[1])
    }


def _places(values: np.ndarray) -> np.ndarray:
    """1 … n by value (smaller first), ties sharing the mean of their places."""
    order = np.argsort(values, kind="stable")
    places = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        places[order[start : stop + 1]] = (start + stop) / 2 + 1
        start = stop + 1
    return places


CD_TESTS = {
    "wilcoxon-holm": "Wilcoxon signed-rank on per-task ranks, Holm over the pairs",
    "nemenyi": "Nemenyi's test on mean ranks (Friedman's post-hoc: critical difference)",
}


def across_tasks(
    boards: list[Board], complete: list[str], level: float, test: str = "wilcoxon-holm"
) -> dict | None:
    """Which complete setups differ over the suite's tasks: for every two, ``test`` on their
    per-task ranks (ranks, not raw values, so tasks of different metrics and units pair
    alike) — the Wilcoxon signed-rank test (scipy's ``wilcoxon``'s p-values, exact where it
    can be: ``signed_rank_p``) Holm-corrected over the pairs, or Nemenyi's (``nemenyi_p``);
    then the cliques of setups no test separates (the bars of a critical-difference diagram),
    a tier per setup, and whether so few tasks could separate any two setups at all
    (``separable``). None with fewer than 2 tasks or 2 setups."""
    if len(boards) < 2 or len(complete) < 2:
        return None
    table = complete_ranks(boards, complete)
    i, j = np.triu_indices(len(complete), k=1)
    pairs = [{"a": complete[a], "b": complete[b]} for a, b in zip(i, j, strict=True)]
    if test == "nemenyi":
        raw = adjusted = nemenyi_p(table, i, j)
    else:
        raw = wilcoxon_p(table, i, j)
        adjusted = holm(raw)
    for pair, p, p_adjusted in zip(pairs, raw, adjusted, strict=True):
        pair |= {"p": float(p), "p_holm": float(p_adjusted), "significant": p_adjusted <= level}
    means = table.mean(axis=0)
    order = [complete[i] for i in np.argsort(means, kind="stable")]
    apart = {frozenset((p["a"], p["b"])) for p in pairs if p["significant"]}
    return {
        "test": CD_TESTS[test],
        "pairs": pairs,
        "mean_ranks": {name: float(means[i]) for i, name in enumerate(complete)},
        "cliques": cliques(order, apart),
        "tiers": tiers_of(order, apart),
        **separable(test, len(boards), len(complete), level),
    }


def wilcoxon_p(table: np.ndarray, i: np.ndarray, j: np.ndarray) -> list[float]:
    same = np.all(table[:, i] == table[:, j], axis=0)  # the same rank on every task: p = 1
    raw = np.ones(len(i))
    if (~same).any():
        raw[~same] = signed_rank_p(table[:, i[~same]].T, table[:, j[~same]].T)
    return [float(p) for p in raw]


def nemenyi_p(table: np.ndarray, i: np.ndarray, j: np.ndarray) -> list[float]:
    """Nemenyi's p of each pair (i, j) from the mean ranks over the tasks (rows of
    ``table``): the studentised range of k setups with infinite degrees of freedom at
    |R̄ᵢ − R̄ⱼ| / √(k(k+1)/6N) · √2, as Demšar (2006) and scikit-posthocs compute it."""
    from scipy import stats

    tasks, k = table.shape
    means = table.mean(axis=0)
    q = np.abs(means[i] - means[j]) / np.sqrt(k * (k + 1) / (6.0 * tasks))
    return [float(p) for p in stats.studentized_range.sf(q * np.sqrt(2), k, np.inf)]


def separable(test: str, tasks: int, setups: int, level: float) -> dict:
    """Whether ``tasks`` tasks can separate any two of ``setups`` setups at ``level``, and
    the fewest that could: the signed-rank test's smallest p is 2/2^tasks (every task the
    same way), which Holm's first step compares with level/pairs; Nemenyi's largest
    possible difference of mean ranks is setups − 1, against its critical difference."""
    pairs = setups * (setups - 1) // 2

    def can(n: int) -> bool:
        if test == "nemenyi":
            return setups - 1 > critical_difference(setups, n, level)
        return 2.0 ** (1 - n) <= level / pairs

    needed = next(n for n in range(2, 4096) if can(n))
    found = {"separable": can(tasks), "tasks_needed": needed}
    if not found["separable"]:
        found["note"] = (
            f"{tasks} tasks cannot separate any two of {setups} setups at {level:g} with this "
            f"test, whatever the numbers: it takes at least {needed}; read the per-task boards"
        )
    return found


def critical_difference(setups: int, tasks: int, level: float) -> float:
    """Nemenyi's critical difference of mean ranks: q_level(k, ∞)/√2 · √(k(k+1)/6N)."""
    from scipy import stats

    q = stats.studentized_range.ppf(1 - level, setups, np.inf) / np.sqrt(2)
    return float(q * np.sqrt(setups * (setups + 1) / (6.0 * tasks)))


def cliques(order: list[str], apart: set) -> list[list[str]]:
    """The maximal runs of setups, in mean-rank order, no two of which a test separates:
    the bars of a critical-difference diagram (runs of one are left out)."""
    runs = []
    for start in range(len(order)):
        stop = start
        while stop + 1 < len(order) and all(
            frozenset((order[k], order[stop + 1])) not in apart for k in range(start, stop + 1)
        ):
            stop += 1
        if stop > start and not any(s <= start and stop <= e for s, e in runs):
            runs.append((start, stop))
    return [order[s : e + 1] for s, e in runs]


def tiers_of(order: list[str], apart: set) -> dict[str, int]:
    """A tier per name, best first and monotone in ``order``: the best name not yet placed
    leads a tier, and the names after it join while no test separates them from it; the
    first that a test separates leads the next tier (so a tier never holds a name ranked
    below one of a later tier)."""
    placed, tier, leader = {}, 0, None
    for name in order:
        if leader is None or frozenset((leader, name)) in apart:
            tier, leader = tier + 1, name
        placed[name] = tier
    return placed


def friedman(boards: list[Board], complete: list[str]) -> dict | None:
    """Friedman's test over the suite's tasks that the complete setups' ranks differ at all
    (tie-corrected; scipy's ``friedmanchisquare``): None with fewer than 2 tasks or 3 setups."""
    if len(boards) < 2 or len(complete) < 3:
        return None
    from scipy import stats

    table = complete_ranks(boards, complete)
    result = stats.friedmanchisquare(*table.T)
    return {
        "statistic": float(result.statistic),
        "p": float(result.pvalue),
        "tasks": len(boards),
        "setups": len(complete),
    }


def tiers(board: Board) -> dict[str, int]:
    """Tier of each cell: the best cell not yet placed leads a tier, and every unplaced cell
    not significantly different from that leader (after Holm; an untested pair cannot tell
    them apart) shares it."""
    apart = {frozenset((pair["a"], pair["b"])) for pair in board.pairs if pair.get("significant")}
    return tiers_of([cell.backbone for cell in board.cells], apart)


def seed_spread(cell: Cell) -> float | None:
    """The standard deviation over a cell's seeds (None with one seed): the spread of the
    training, apart from the image-level interval."""
    values = {r.get("seed", 0): r["value"] for r in cell.rows}
    return float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else None
