"""The leaderboard's paired tests (docs/results.md, "A zoo and its leaderboard" and "A
gate that knows its noise"): for every pair of backbones on every task, the test the task
declares on the same images (``evalkit.significance``: exact McNemar on right-or-wrong outputs,
else a paired bootstrap of the metric recomputed from its per-image parts, a cell's seeds as
clusters), Holm-corrected over the task's pairs, so that an order the test set's noise could
have made is said to be one; each pair also states the smallest difference its test could have
seen (its MDE at its Holm level, ``evalkit.power``), so "no significant difference" never reads
"the same". Pairs need the per-image outputs a zoo keeps (``--save-predictions``, on whenever
several backbones run): without them, or on different images, a pair is reported as untested,
never as a tie. ``evalkit compare --paired`` judges BASE against NEW by the same tests
(``paired_compare``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from evalkit.power import difference_text, mde, sight
from evalkit.protocols.paired_tests import DECLARED
from evalkit.publish.board_reading import Board, Cell, board_task, members, per_image
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
)


def paired_tests(board: Board, level: float, seed: int) -> list[dict]:
    """Every pair of the board's backbones: the paired test of A − B on their shared images,
    p-values Holm-adjusted over the tested pairs, and the verdict at ``level``."""
    outputs = read_outputs(board)
    aligned = _aligned(board, outputs)
    shared = shared_resamples(aligned, seed) if aligned is not None else None
    board.resampled = image_resamples(board, shared)
    at_once = board_tests(board, aligned, shared)
    if at_once is None and any(found is None for found in outputs.values()):
        outputs = read_outputs(board)  # released by ``_aligned``, yet the pairs read them
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


def read_outputs(board: Board) -> dict:
    """Each cell's per-image outputs (``per_image``), every file read once. Cells that name
    the same images in the same order share one list of ids: a zoo's 50,000 ids held once per
    setup were most of the board's memory beyond what its outputs need."""
    outputs, ids = {}, None
    for cell in board.cells:
        found = per_image(cell)
        if not isinstance(found, str):
            if ids is None:
                ids = found[0]
            elif found[0] == ids:
                found = (ids, found[1])
        outputs[id(cell)] = found
    return outputs


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
    if aligned is None or not tested_at_once(board, aligned[0], _one_seed(aligned[1].values())):
        return None
    test, cells = aligned
    if test.binary and _one_seed(cells.values()):
        keys = list(cells)
        tests = mcnemar_all(np.stack([cells[key][0][:, 0] > 0 for key in keys]))
        where = {key: index for index, key in enumerate(keys)}
        return lambda a, b: tests[(where[a], where[b])]
    return None if shared is None else shared.pair


def tested_at_once(board: Board, test, one_seed: bool) -> bool:
    """Whether ``board_tests`` answers every pair of a board whose cells align under ``test``
    (McNemar of all pairs where each cell has ``one_seed``, or the board's shared resamples of
    a mean or a metric of sums), so that no pair reads its frames."""
    if len(board.cells) < 3:
        return False
    return (test.binary and one_seed) or test.statistic is mean_of or test.sums is not None


def _one_seed(per_cell) -> bool:
    """Each cell (its seeds' frames or parts) has one seed."""
    return all(len(seeds) == 1 for seeds in per_cell)


def _aligned(board: Board, outputs: dict):
    """(the task's test, each cell's per-seed parts in the first cell's image order) when
    every cell scored the same images with numbers and the task declares a test; else None.
    Where the board's pairs will all be tested at once (``tested_at_once``) each cell's
    frames are released (its entry in ``outputs`` set to None) once its parts are made: a
    zoo's frames and parts are then never all held together."""
    if any(isinstance(o, str) for o in outputs.values()):
        return None
    first_ids, first_frames = outputs[id(board.cells[0])]
    test = declared_test(board_task(board), board.metric, set(first_frames[0].columns))
    if test is None:
        return None
    release = tested_at_once(board, test, _one_seed(found[1] for found in outputs.values()))
    cells = {}
    for cell in board.cells:
        ids, frames = outputs[id(cell)]
        if ids is not first_ids and sorted(ids) != sorted(first_ids):
            return None
        if ids is first_ids:  # the same list: the same order
            cells[id(cell)] = [test.parts(frame) for frame in frames]
        else:
            order = {image: i for i, image in enumerate(ids)}
            rows = [order[image] for image in first_ids]
            cells[id(cell)] = [test.parts(frame)[rows] for frame in frames]
        if release:
            outputs[id(cell)] = None
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
    whole = None
    if test.sums is None:
        values = {key: np.mean([p[:, 0] for p in parts], axis=0) for key, parts in cells.items()}
        observed = {key: float(value.mean()) for key, value in values.items()}
        whole = whole_numbers(values, count)
    else:
        prepared = {key: [test.sums(p) for p in parts] for key, parts in cells.items()}
        observed = {
            key: float(np.mean([test.statistic(p) for p in parts])) for key, parts in cells.items()
        }
    rng = np.random.default_rng(seed)
    resampled = {key: np.empty(RESAMPLES) for key in cells}
    for start in range(0, RESAMPLES, CHUNK):
        draws = rng.integers(0, count, size=(min(CHUNK, RESAMPLES - start), count))
        chunk = slice(start, start + len(draws))
        exact = test.sums is not None or whole is not None
        counts = resample_counts(draws, count) if exact else None
        if whole is not None:  # every cell's resampled means from one product of the counts
            means = (counts @ whole) / count
            for column, key in enumerate(cells):
                resampled[key][chunk] = means[:, column]
            continue
        for key in cells:
            if counts is None:
                resampled[key][chunk] = values[key][draws].mean(axis=1)
            else:
                resampled[key][chunk] = resampled_metric(prepared[key], counts)
    return observed, resampled


def whole_numbers(values: dict, count: int) -> np.ndarray | None:
    """The cells' per-image values side by side (images × cells) where all are whole numbers
    (a right-or-wrong ×100) whose sums float64 holds exactly, else None. A resample's sum of
    such values is then the same integer in any order, so its mean from the product of the
    resample's counts is the gathered values' mean (``values[draws].mean()``) to the bit,
    at a fraction of the gather's memory traffic."""
    stacked = np.column_stack(list(values.values()))
    bound = float(np.abs(stacked).max(initial=0.0)) * count  # a resample's largest sum
    if not np.isfinite(stacked).all() or bound >= 2**53 or (stacked != np.rint(stacked)).any():
        return None
    return stacked


def declared_test(task: str | None, metric: str, columns: set[str]):
    """The paired test ``task`` declares for ``metric`` on outputs with ``columns``; for a
    task not known here, the default one (a per-image column of the metric's name). A built-in
    task's is read from ``paired_tests.DECLARED`` without importing the task (and torch)."""
    from evalkit.core.catalog import declared_by

    return declared_by(task, DECLARED, "paired_test", default_paired_test)(metric, columns)


def not_numbers(*sides: np.ndarray) -> str | None:
    """Why a pair cannot be tested when some image's output is not a number (NaN, ±inf, or
    missing): the count of those images; None when every output is a number."""
    bad = np.zeros(len(sides[0]), dtype=bool)
    for side in sides:
        values = np.asarray(side, dtype=float).reshape(len(side), -1)
        bad |= ~np.isfinite(values).all(axis=1)
    return f"{int(bad.sum())} NaN images" if bad.any() else None


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
