"""The leaderboard of a zoo (``evalkit leaderboard RESULTS``): per task each backbone's value
with its interval and rank, an aggregate rank over the tasks, and for every pair of backbones
on every task a paired test on the same images (``evalkit.significance``),
Holm-corrected over the task's pairs, so that an order the test set's noise could have made is
said to be one; each pair also states the smallest difference its test could have seen (its
MDE at its Holm level, ``evalkit.power``), so "no significant difference" never reads "the same".

Ranks are per task on its headline metric (the first a task reports: top-1, mIoU, MSE, ...),
lower-is-better metrics inverted, tied values sharing the mean of their places. The aggregate
is the mean rank over the tasks a backbone has a value for; the tasks it lacks are named, and
so are the cells a zoo recorded as failed. A fairness task also gives each backbone's accuracy
at every demographic-parity level: one curve per backbone. Pairs need the per-image outputs a zoo keeps
(``--save-predictions``, on whenever several backbones run): without them, or on different
images, a pair is reported as untested, never as a tie.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from evalkit.core.results import (
    FAILED,
    aggregate,
    cell_key,
    dataset_label,
    file_rows,
    format_value,
    natural_order,
    predictions_file,
    row_cell,
    rows_files,
    run_spec,
)
from evalkit.errors import EvalkitError
from evalkit.power import difference_text, mde, sight
from evalkit.protocols.paired_tests import DECLARED
from evalkit.significance import (
    CHUNK,
    LEVEL,
    RESAMPLES,
    Paired,
    bootstrap_p,
    default_paired_test,
    holm,
    mcnemar,
    mcnemar_all,
    mean_of,
    paired_bootstrap,
    paired_bootstrap_seeds,
    resample_counts,
    resampled_metric,
    signed_rank_p,
)


@dataclass
class Cell:
    """One backbone on one task: its headline value, the rows behind it, its rank."""

    backbone: str
    value: float
    shown: str  # value ± interval, as tables show it
    rows: list[dict]
    rank: float = 0.0


@dataclass
class Board:
    task: str
    metric: str
    higher_is_better: bool
    cells: list[Cell] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    # backbone → its metric on each shared resample of the images (None: no per-image outputs)
    resampled: dict[str, np.ndarray] | None = None


def leaderboard(
    paths, *, level: float = LEVEL, seed: int = 0, mixed: bool = False, cd: str = "wilcoxon-holm"
) -> dict:
    """The leaderboard of the rows under ``paths`` as one JSON-ready record. A board whose
    cells were measured differently (``fingerprint``) is refused unless ``mixed``; ``cd``
    names the across-task test (``CD_TESTS``)."""
    rows = folder_rows(paths)
    boards = [_ranked(board) for board in _boards(rows)]
    prints = {board.task: fingerprint(board, mixed) for board in boards}
    for board in boards:
        board.pairs = paired_tests(board, level, seed)
    backbones = sorted({cell.backbone for board in boards for cell in board.cells})
    ranked = overall(boards, backbones, seed)
    complete = [entry["backbone"] for entry in ranked if entry["mean_rank"] is not None]
    across = across_tasks(boards, complete, level, cd)
    for entry in ranked:
        if across is not None and entry["backbone"] in across["tiers"]:
            entry["tier"] = across["tiers"][entry["backbone"]]
    return {
        "level": level,
        "correction": "Holm, over each task's pairs",
        "suite": _short_hash(sorted(prints.items())),
        "tasks": [
            _board_record(board, level) | {"fingerprint": prints[board.task]} for board in boards
        ],
        "overall": ranked,
        "friedman": friedman(boards, complete),
        "across_tasks": across,
        "curves": parity_curves(rows),
        "curve_intervals": curve_intervals(rows),
        "failed": failed_cells(paths, rows),
    }


def parity_curves(rows: list[dict]) -> dict:
    """Per fairness task, each backbone's test accuracy at each demographic-parity level
    (its ``accuracy@<level>`` rows, means over seeds): one curve per backbone."""
    return _per_level(rows, lambda record, _: record["mean"])


def curve_intervals(rows: list[dict]) -> dict:
    """The 95% interval over test images of each point of ``parity_curves``, from the rows'
    bootstrap (a cell of several seeds: None, its spread over seeds is in its table)."""

    def interval(record, members_of):
        found = [r.get("extra", {}).get("interval95") for r in members_of(record)]
        return found[0] if len(found) == 1 else None

    return _per_level(rows, interval)


def _per_level(rows: list[dict], value_of) -> dict:
    curves: dict = defaultdict(lambda: defaultdict(dict))
    for record in aggregate(rows):
        name, at, level = record["metric"].partition("@")
        if name == "accuracy" and at:
            label = task_label(record["task"], record["dataset"])
            rows_of = lambda rec: members(rows, rec["spec"], rec["metric"])  # noqa: E731
            curves[label][record["backbone"]][float(level)] = value_of(record, rows_of)
    return {
        task: {backbone: dict(sorted(by.items())) for backbone, by in sorted(lines.items())}
        for task, lines in sorted(curves.items())
    }


def folder_rows(paths) -> list[dict]:
    """Rows under each path, however deep, each marked with the folder of its rows file: its
    per-image outputs are in ``predictions/`` there."""
    return [
        {**row, "_folder": str(file.parent)}
        for file in rows_files(paths)
        for row in file_rows(file)
    ]


def _boards(rows: list[dict]) -> list[Board]:
    """One board per task label (task and data), on the task's first reported metric."""
    headline = {}
    for row in rows:
        headline.setdefault(task_label(row["task"], dataset_label(row)), row["metric"])
    boards: dict[str, Board] = {}
    for record in aggregate(rows):
        label = task_label(record["task"], record["dataset"])
        if record["metric"] != headline.get(label):
            continue
        board = boards.setdefault(label, Board(label, record["metric"], record["higher_is_better"]))
        rows_of = members(rows, record["spec"], record["metric"])
        board.cells.append(Cell(record["backbone"], record["mean"], format_value(record), rows_of))
    return [boards[label] for label in sorted(boards, key=natural_order)]


# What a board's cells must share: the task's version and settings, the data's files (not how
# each backbone's preprocessing reads them), the headline metric.
MEASURED = ("task_version", "config", "data_files", "metric")


def fingerprint(board: Board, mixed: bool) -> str:
    """A short hash of what a board compares — the task's version and settings, the data's
    identity, the headline metric — shared by all its cells. Cells measured differently are
    refused, naming what differs, unless ``mixed`` (then the board's fingerprint is
    ``mixed``): a ranking must compare like with like."""
    seen: dict[str, set[str]] = defaultdict(set)
    for cell in board.cells:
        for row in cell.rows:
            for part in MEASURED:
                seen[part].add(json.dumps(_measured(row, part), sort_keys=True, default=str))
    differ = [part for part in MEASURED if len(seen[part]) > 1]
    if not differ:
        return _short_hash(sorted((part, sorted(seen[part])) for part in MEASURED))
    if mixed:
        return "mixed"
    raise EvalkitError(
        f"the cells of {board.task} were measured with different {', '.join(differ)}: one "
        "ranking would compare unlike numbers; run them alike, look at each with evalkit "
        "table, or pass --allow-mixed"
    )


def _measured(row: dict, part: str):
    value = row.get(part)
    if part == "config":  # the data is the board's; a backbone's settings are its label's
        return {k: v for k, v in (value or {}).items() if k != "dataset"}
    return value


def _short_hash(value) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:12]


def members(rows: list[dict], spec: tuple, metric: str) -> list[dict]:
    """The rows of one aggregated record: its run spec (task, backbone, weights, options,
    settings, data) and metric, every seed."""
    return [r for r in rows if r["metric"] == metric and run_spec(r) == spec[:6]]


def task_label(task: str, data: str) -> str:
    """A board's name: the task and the data it ran on (a stand-in says so)."""
    return f"{task} · {data}" if data else task


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


def paired_tests(board: Board, level: float, seed: int) -> list[dict]:
    """Every pair of the board's backbones: the paired test of A − B on their shared images,
    p-values Holm-adjusted over the tested pairs, and the verdict at ``level``."""
    outputs = {id(cell): per_image(cell) for cell in board.cells}  # each file read once
    aligned = _aligned(board, outputs)
    shared = shared_resamples(aligned, seed) if aligned is not None else None
    board.resampled = image_resamples(board, shared)
    at_once = board_tests(board, aligned, shared)
    results = []
    for a, b in itertools.combinations(board.cells, 2):
        if at_once is not None:
            test = at_once(id(a), id(b))
        else:
            test = _paired(board, (outputs[id(a)], outputs[id(b)]), seed)
        results.append({"a": a.backbone, "b": b.backbone, "test": test})
    tested = [r for r in results if isinstance(r["test"], Paired)]
    for record, adjusted in zip(tested, holm([r["test"].p for r in tested]), strict=True):
        record["p_holm"] = adjusted
    _holm_levels(tested, level)
    return [_pair_record(r, board, level) for r in results]


def _holm_levels(tested: list[dict], level: float) -> None:
    """Each tested pair's Holm level (``power.holm_level``), for its MDE: the step it is
    judged at depends on how many other pairs the rule rejects."""
    from evalkit.power import holm_level

    rejected = [r["p_holm"] <= level and r["test"].difference != 0 for r in tested]
    for record, own in zip(tested, rejected, strict=True):
        record["level_holm"] = holm_level(level, len(tested), sum(rejected) - own)


def _pair_record(result: dict, board: Board, level: float) -> dict:
    test = result["test"]
    record = {"a": result["a"], "b": result["b"]}
    if not isinstance(test, Paired):
        return record | {"verdict": f"untested: {test}"}
    better_a = (test.difference > 0) == board.higher_is_better
    winner, loser = (result["a"], result["b"]) if better_a else (result["b"], result["a"])
    significant = result["p_holm"] <= level and test.difference != 0
    verdict = (
        f"{winner} > {loser} (p = {result['p_holm']:.3g})"
        if significant
        else f"no significant difference (p = {result['p_holm']:.3g}): {difference_text(test)}"
    )
    detectable = mde(test, result["level_holm"])
    return record | {
        "verdict": f"{verdict}; {sight(detectable, result['level_holm'])}",
        "mde": detectable,
        "level_holm": result["level_holm"],
        "difference": test.difference,
        "interval": test.interval,
        "p": test.p,
        "p_holm": result["p_holm"],
        "test": test.test,
        "images": test.images,
        "significant": significant,
        **(
            {"flips": {"only_a_right": test.flips[0], "only_b_right": test.flips[1]}}
            if test.flips
            else {}
        ),
    }


def _paired(board: Board, outputs: tuple, seed: int) -> Paired | str:
    """The paired test of two cells' per-image outputs (``per_image``: each seed's) on their
    shared images, or why there is none."""
    if any(isinstance(o, str) for o in outputs):
        return next(o for o in outputs if isinstance(o, str))
    (ids_a, frames_a), (ids_b, frames_b) = outputs
    if sorted(ids_a) != sorted(ids_b):
        return "the two ran on different images"
    order_b = {image: i for i, image in enumerate(ids_b)}
    rows = [order_b[image] for image in ids_a]
    frames_b = [frame.iloc[rows].reset_index(drop=True) for frame in frames_b]
    task = board_task(board)
    if len(frames_a) == len(frames_b) == 1:
        return paired_on(board.metric, frames_a[0], frames_b[0], seed, task)
    return paired_on_seeds(board.metric, frames_a, frames_b, seed, task)


def paired_on(metric: str, frame_a, frame_b, seed: int, task: str | None = None) -> Paired | str:
    """The paired test of two one-seed cells' per-image outputs that ``task`` declares for
    ``metric`` (``Task.paired_test``): exact McNemar on right-or-wrong parts, else a paired
    bootstrap of the metric recomputed from its parts."""
    test = declared_test(task, metric, set(frame_a.columns))
    if test is None:
        return f"no paired test of {metric} from these per-image outputs (none declared, or no column of it)"
    parts = test.parts(frame_a), test.parts(frame_b)
    if (bad := not_numbers(*parts)) is not None:
        return bad
    if test.binary:
        return mcnemar(*(side[:, 0] > 0 for side in parts))
    return paired_bootstrap(*parts, test.statistic, seed=seed, sums=test.sums)


def paired_on_seeds(
    metric: str, frames_a: list, frames_b: list, seed: int, task=None
) -> Paired | str:
    """Cells of several seeds: a paired bootstrap over images of the mean over seeds of the
    metric (what is ranked), each image one cluster of its seeds' outputs. McNemar needs one
    right-or-wrong per image, so accuracies are bootstrapped here too."""
    test = declared_test(task, metric, set(frames_a[0].columns))
    if test is None:
        return f"no paired test of {metric} from these per-image outputs (none declared, or no column of it)"
    seeds_a, seeds_b = [test.parts(f) for f in frames_a], [test.parts(f) for f in frames_b]
    return not_numbers(*seeds_a, *seeds_b) or paired_bootstrap_seeds(
        seeds_a, seeds_b, test.statistic, seed=seed, sums=test.sums
    )


@dataclass
class SharedResamples:
    """The paired bootstrap of a whole board at once, for a metric that is a mean of
    per-image values or a function of sums over images (``Sums``): every cell scored on one
    set of resampled images (the draws a pair's own bootstrap makes from the same seed), so
    each cell's resampled metric is computed once and a pair's resampled differences are a
    subtraction — 20 backbones cost 20 passes over the images, not 190."""

    observed: dict[int, float]
    resampled: dict[int, np.ndarray]
    images: int
    seeds: dict[int, int]

    def pair(self, a: int, b: int) -> Paired:
        differences = self.resampled[a] - self.resampled[b]
        observed = self.observed[a] - self.observed[b]
        low, high = np.percentile(differences, [2.5, 97.5])
        low90, high90 = np.percentile(differences, [5, 95])
        p, how = bootstrap_p(observed, differences, self.images)
        seeds = self.seeds[a] + self.seeds[b]
        clusters = f", {self.seeds[a]} and {self.seeds[b]} seeds per image" if seeds > 2 else ""
        test = (
            f"paired bootstrap over {self.images} images ({len(differences)} resamples"
            f"{clusters}; p: {how})"
        )
        return Paired(
            observed, p, test, (float(low), float(high)), self.images, (float(low90), float(high90))
        )


def board_tests(board: Board, aligned, shared):
    """Every pair of a board tested at once, where its cells scored the same images with
    numbers (``aligned``: ``_aligned``): ``pair(id_a, id_b)`` answers each pair as its own test
    would. One-seed right-or-wrong cells: exact McNemar of all pairs from one product of their
    correctness (``mcnemar_all``); a mean or a metric of sums: the board's ``SharedResamples``.
    None otherwise, and on boards of two cells (each pair is then tested on its own, and says
    why it cannot be)."""
    if aligned is None or len(board.cells) < 3:
        return None
    test, cells = aligned
    if test.binary and all(len(parts) == 1 for parts in cells.values()):
        keys = list(cells)
        tests = mcnemar_all(np.stack([cells[key][0][:, 0] > 0 for key in keys]))
        where = {key: index for index, key in enumerate(keys)}
        return lambda a, b: tests[(where[a], where[b])]
    if shared is None or (test.statistic is not mean_of and test.sums is None):
        return None
    return shared.pair


def _aligned(board: Board, outputs: dict):
    """(the task's test, each cell's per-seed parts in the first cell's image order) when
    every cell scored the same images with numbers and the task declares a test; else None."""
    if any(isinstance(o, str) for o in outputs.values()):
        return None
    first_ids, first_frames = outputs[id(board.cells[0])]
    test = declared_test(board_task(board), board.metric, set(first_frames[0].columns))
    if test is None:
        return None
    cells = {}
    for cell in board.cells:
        ids, frames = outputs[id(cell)]
        if sorted(ids) != sorted(first_ids):
            return None
        order = {image: i for i, image in enumerate(ids)}
        rows = [order[image] for image in first_ids]
        cells[id(cell)] = [test.parts(frame)[rows] for frame in frames]
        if not_numbers(*cells[id(cell)]) is not None:
            return None  # the pair's own test names the images that are not numbers
    return test, cells


def shared_resamples(aligned: tuple, seed: int) -> SharedResamples | None:
    """``SharedResamples`` of a board's ``_aligned`` parts whose metric is a mean, a metric of
    sums or a right-or-wrong (an accuracy, the mean of it): each cell scored once on one set
    of resampled images, for the pairs' bootstrap (``board_tests``) and the overall order's
    uncertainty (``image_resamples``); None for a statistic of none of these kinds."""
    test, cells = aligned
    if test.statistic is not mean_of and test.sums is None and not test.binary:
        return None
    images = len(next(iter(cells.values()))[0])
    observed, resampled = _resampled_cells(cells, test, images, seed)
    seeds = {key: len(parts) for key, parts in cells.items()}
    return SharedResamples(observed, resampled, images, seeds)


def image_resamples(board: Board, shared) -> dict[str, np.ndarray] | None:
    """Each cell's metric on the board's shared resamples of its images, by backbone, for the
    overall order's uncertainty; None without them (the overall order then resamples the
    tasks alone for this board)."""
    if shared is None:
        return None
    return {cell.backbone: shared.resampled[id(cell)] for cell in board.cells}


def _resampled_cells(cells: dict, test, count: int, seed: int) -> tuple[dict, dict]:
    """Each cell's observed metric (mean over its seeds) and its metric on each of the shared
    resamples: the mean of its values for a mean (seeds average first, as the statistic is
    linear), else ``Sums`` of each seed from one product of counts per chunk."""
    if test.sums is None:
        values = {key: np.mean([p[:, 0] for p in parts], axis=0) for key, parts in cells.items()}
        observed = {key: float(value.mean()) for key, value in values.items()}
    else:
        prepared = {key: [test.sums(p) for p in parts] for key, parts in cells.items()}
        observed = {
            key: float(np.mean([test.statistic(p) for p in parts])) for key, parts in cells.items()
        }
    rng = np.random.default_rng(seed)
    resampled = {key: np.empty(RESAMPLES) for key in cells}
    for start in range(0, RESAMPLES, CHUNK):
        draws = rng.integers(0, count, size=(min(CHUNK, RESAMPLES - start), count))
        counts = resample_counts(draws, count) if test.sums is not None else None
        for key in cells:
            chunk = slice(start, start + len(draws))
            if counts is None:
                resampled[key][chunk] = values[key][draws].mean(axis=1)
            else:
                resampled[key][chunk] = resampled_metric(prepared[key], counts)
    return observed, resampled


def board_task(board: Board) -> str | None:
    """The task a board's cells ran (its name is the task and the data, for a board)."""
    rows = [row for cell in board.cells for row in cell.rows]
    return rows[0]["task"] if rows else board.task


def declared_test(task: str | None, metric: str, columns: set[str]):
    """The paired test ``task`` declares for ``metric`` on outputs with ``columns``; for a
    task not known here, the default one (a per-image column of the metric's name). A built-in
    task's is read from ``paired_tests.DECLARED`` without importing the task (and torch); any
    other is built and asked."""
    from evalkit.core.catalog import TASKS, resolve_task, task_settings

    try:
        target = TASKS.get(task_settings(task)[0]).target if task else None
    except EvalkitError:
        target = None
    if target in DECLARED:
        return DECLARED[target](metric, columns)
    try:
        declared = resolve_task(task) if task else None
    except EvalkitError:
        declared = None
    if declared is None:
        return default_paired_test(metric, columns)
    return declared.paired_test(metric, columns)


def not_numbers(*sides: np.ndarray) -> str | None:
    """Why a pair cannot be tested when some image's output is not a number (NaN, ±inf, or
    missing): the count of those images; None when every output is a number."""
    bad = np.zeros(len(sides[0]), dtype=bool)
    for side in sides:
        values = np.asarray(side, dtype=float).reshape(len(side), -1)
        bad |= ~np.isfinite(values).all(axis=1)
    return f"{int(bad.sum())} NaN images" if bad.any() else None


def per_image(cell: Cell):
    """(image ids relative to their common folder, one outputs frame per seed of the cell, in
    the order of the ids), or why there are none."""
    import pandas as pd

    frames = []
    for path in output_files(cell):
        if not path.exists():
            return f"no per-image outputs for {cell.backbone} (run the zoo with several backbones or --save-predictions)"
        try:
            frames.append(pd.read_parquet(path))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a damaged file
            return (
                f"the per-image outputs of {cell.backbone} cannot be read ({path.name}: "
                f"{type(exc).__name__}); the next run of the cell recomputes them"
            )
    ids = relative_ids(frames[0]["image"].astype(str).tolist())
    for index, frame in enumerate(frames[1:], start=1):
        own = relative_ids(frame["image"].astype(str).tolist())
        if sorted(own) != sorted(ids):
            return f"the seeds of {cell.backbone} ran on different images"
        order = {image: i for i, image in enumerate(own)}
        frames[index] = frame.iloc[[order[i] for i in ids]].reset_index(drop=True)
    return ids, frames


def relative_ids(ids: list[str]) -> list[str]:
    """Image ids with the folder they share removed: older per-image files name images by
    absolute path, today's by their path under the dataset's root, so both kinds, and runs on
    copies of a data set in different places, pair image by image."""
    if len(ids) < 2 or len({os.path.isabs(i) for i in ids}) > 1:
        return ids
    # the shared folder from the first and last ids in sorted order, cut by string slicing:
    # os.path.commonpath and relpath cost 11 µs an image (0.7 s on 60,000), this 1 µs
    shared = os.path.commonprefix([min(ids), max(ids)]).rpartition("/")[0]
    if not shared and not os.path.isabs(ids[0]):
        return ids
    cut = len(shared) + 1
    return [i[cut:] or "." for i in ids]


def failed_cells(paths, rows: list[dict] | None = None) -> list[dict]:
    """The cells a zoo recorded as failed (the latest record of each), less those whose rows
    a later run wrote (``rows``: the rows under ``paths``): a cell a rerun completed is no
    longer missing."""
    latest = {}
    for path in map(Path, paths):
        found = sorted(path.rglob(FAILED)) if path.is_dir() else [path.parent / FAILED]
        for line in _lines(file for file in found if file.exists()):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            cell = ("task", "backbone", "seed", "weights", "options")
            latest[json.dumps([record.get(k) for k in cell], sort_keys=True)] = record
    done = _finished_at(rows or [])
    return [r for r in latest.values() if done.get(cell_key(r), -1.0) < _epoch(r.get("time"))]


def _finished_at(rows: list[dict]) -> dict[tuple, float]:
    """Cell (``row_cell``) → when its newest row was written (seconds since the epoch)."""
    found: dict[tuple, float] = {}
    for row in rows:
        cell, written = row_cell(row), _epoch((row.get("provenance") or {}).get("time"))
        found[cell] = max(found.get(cell, written), written)
    return found


def _epoch(stamp) -> float:
    """A row's or a failure record's time in seconds since the epoch: rows write an offset,
    failure records the writer's local time; an unreadable stamp is the oldest."""
    from datetime import datetime

    for layout in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.strptime(str(stamp), layout).timestamp()
        except ValueError:
            continue
    return float("-inf")


def _lines(files) -> list[str]:
    return [line for file in files for line in file.read_text(encoding="utf-8").splitlines()]


def _board_record(board: Board, level: float = LEVEL) -> dict:
    tier = tiers(board)
    return {
        "task": board.task,
        "metric": board.metric,
        "higher_is_better": board.higher_is_better,
        "cells": [
            {
                "backbone": c.backbone,
                "value": c.value,
                "shown": c.shown,
                "rank": c.rank,
                "tier": tier[c.backbone],
                "seeds": len({r.get("seed", 0) for r in c.rows}),
                "seed_sd": seed_spread(c),
                **recomputable(c),
            }
            for c in board.cells
        ],
        "pairs": board.pairs,
    }


def recomputable(cell: Cell) -> dict:
    """What a third party needs to redo a cell's tests: its test items (``n``), for an
    accuracy the images right (over its seeds' files, summed), and the SHA-256 of each seed's
    per-image file."""
    import hashlib

    files = [path for path in output_files(cell) if path.exists()]
    found = {"n": next((r.get("n") for r in cell.rows if r.get("n")), None)}
    found["outputs"] = [hashlib.sha256(path.read_bytes()).hexdigest() for path in files]
    found["right"] = None
    if files and cell.rows[0]["metric"].startswith("top1"):
        import pandas as pd

        try:
            frames = [pd.read_parquet(path, columns=["correct"]) for path in files]
            found["right"] = int(sum(frame["correct"].sum() for frame in frames))
        except Exception:  # noqa: BLE001 - no such column, or a damaged file (named elsewhere)
            pass
    return found


def output_files(cell: Cell) -> list[Path]:
    """The per-image file of each seed of a cell (whether or not it exists)."""
    by_seed = {row.get("seed", 0): row for row in cell.rows}
    paths = []
    for number, row in sorted(by_seed.items()):
        paths.append(
            predictions_file(
                row["_folder"], row["task"], row["backbone"], number, row.get("run_key")
            )
        )
    return paths


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


def paired_compare(records: list[dict], base: list[dict], new: list[dict], **options) -> list[dict]:
    """``compare``'s records judged by a paired test of BASE against NEW on the same images
    where both kept per-image outputs: a change fails only when the test finds it at
    ``level`` (Holm over the tested metrics), and the tolerance's own verdict is kept beside
    it (``tolerance_status``); untested metrics keep the tolerance's verdict. ``options``:
    level, one_sided, seed."""
    level, seed = options.get("level", LEVEL), options.get("seed", 0)
    tests = {}
    for index, record in enumerate(records):
        if record["base"] is None or record["new"] is None:
            continue
        cells = [
            Cell(side, 0.0, "", members(rows, record["spec"], record["metric"]))
            for side, rows in (("new", new), ("base", base))
        ]
        board = Board(record["task"], record["metric"], record["higher_is_better"])
        tests[index] = _paired(board, tuple(per_image(cell) for cell in cells), seed)
    tested = [i for i, t in tests.items() if isinstance(t, Paired)]
    adjusted = dict(zip(tested, holm([tests[i].p for i in tested]), strict=True))
    judged = [
        _judged(record, tests.get(i), adjusted.get(i), level, options.get("one_sided", False))
        for i, record in enumerate(records)
    ]
    return _with_sight(judged, level)


def _with_sight(records: list[dict], level: float) -> list[dict]:
    """Each tested record with its MDE at its Holm level (``mde``, points): what this gate
    could catch. An accuracy's is taken at the larger of the observed churn and that of
    unrelated mistakes (``power.unrelated_mde``): NEW usually equals BASE, so its churn (none)
    says nothing of a regression's; ``mde_at_churn`` keeps the observed one's."""
    from evalkit.power import holm_level, unrelated_mde

    tested = [r for r in records if isinstance(r.get("test"), Paired)]
    rejected = [r["p_holm"] <= level and r["test"].difference != 0 for r in tested]
    for record, own in zip(tested, rejected, strict=True):
        at = holm_level(level, len(tested), sum(rejected) - own)
        test = record["test"]
        found = mde(test, at)
        if test.flips is not None:
            found = max(found, unrelated_mde(record["base"], record["new"], test.images, at))
        record |= {"level_holm": at, "mde": found, "mde_at_churn": mde(test, at)}
    return records


def _judged(record: dict, test, p_holm: float | None, level: float, one_sided: bool) -> dict:
    record = {**record, "tolerance_status": record["status"], "test": test}
    if not isinstance(test, Paired):
        return record | ({"paired": f"untested: {test}"} if test else {})
    if test.flips:  # NEW is side A: right→wrong are the images only BASE got right
        record["flips"] = {"right_to_wrong": test.flips[1], "wrong_to_right": test.flips[0]}
    gain = test.difference if record["higher_is_better"] else -test.difference
    significant = p_holm <= level and test.difference != 0
    status = "ok"
    if significant:
        status = "regression" if gain < 0 else ("improved" if one_sided else "changed-up")
    return record | {"status": status, "p": test.p, "p_holm": p_holm, "paired": test.test}
