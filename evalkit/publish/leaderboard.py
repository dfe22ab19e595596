"""The leaderboard of a zoo (``evalkit leaderboard RESULTS``; docs/results.md, "A zoo and
its leaderboard"), computed once as one JSON-ready record that every format renders
(``rendering``): per task each backbone's value with its interval, rank and tier, and for every
pair of backbones a paired test on the same images, Holm-corrected over the task's pairs; an
aggregate rank over the tasks with its uncertainty and the tests across them; a fairness task's
curves; the cells a zoo recorded as failed. The parts live beside it: ``board_reading`` (rows and
per-image files into boards of cells, and what each board measured), ``board_pairs`` (each
pair's paired test and verdict) and ``board_ranks`` (ranks, their intervals, tiers and the tests
across tasks)."""

from __future__ import annotations

from evalkit.publish.board_pairs import paired_tests
from evalkit.publish.board_ranks import _ranked, across_tasks, friedman, overall, seed_spread, tiers
from evalkit.publish.board_reading import (
    Board,
    _boards,
    _short_hash,
    curve_intervals,
    failed_cells,
    fingerprint,
    folder_rows,
    parity_curves,
    recomputable,
)
from evalkit.significance import LEVEL


def leaderboard(
    paths, *, level: float = LEVEL, seed: int = 0, mixed: bool = False, cd: str = "wilcoxon-holm"
) -> dict:
    """The leaderboard of the rows under ``paths`` as one JSON-ready record. A board whose
    cells were measured differently (``fingerprint``) is refused unless ``mixed``; ``cd``
    names the across-task test (``board_ranks.CD_TESTS``)."""
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
