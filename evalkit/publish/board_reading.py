"""The leaderboard's reading (docs/results.md, "A zoo and its leaderboard"): rows files
and the per-image files beside them turned into boards of cells. A board is one task on one
dataset (``task_label``), on the task's headline metric (the first it reports: top-1, mIoU,
MSE, ...); a cell is one backbone's value on it, the mean over its seeds, with the rows behind
it, and a board's cells must have been measured alike (``fingerprint``). Also read here: each
cell's per-image outputs (``per_image``: one frame per seed, images paired by their path under
the data's root), what a third party needs to redo a cell's tests (``recomputable``), the cells
a zoo recorded as failed, and a fairness task's accuracy at every demographic-parity level: one
curve per backbone."""

from __future__ import annotations

import itertools
import json
import os
import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalkit.core.labels import cell_key, dataset_label, repeat_key, row_cell
from evalkit.core.results import FAILED, file_rows, predictions_file, rows_files
from evalkit.core.tables import aggregate, format_value, natural_order
from evalkit.errors import EvalkitError


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
    """The rows of one aggregated record: its repeat key (task, backbone, weights, options,
    settings, data) and metric, every seed."""
    return [r for r in rows if r["metric"] == metric and repeat_key(r) == tuple(spec)]


def task_label(task: str, data: str) -> str:
    """A board's name: the task and the data it ran on (a stand-in says so)."""
    return f"{task} · {data}" if data else task


def board_task(board: Board) -> str | None:
    """The task a board's cells ran (its name is the task and the data, for a board)."""
    rows = [row for cell in board.cells for row in cell.rows]
    return rows[0]["task"] if rows else board.task


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
    if len(ids) < 2 or 0 < absolute_count(ids) < len(ids):
        return ids
    # the shared folder from the first and last ids in sorted order, cut by string slicing:
    # os.path.commonpath and relpath cost 11 µs an image (0.7 s on 60,000), this 1 µs
    shared = os.path.commonprefix([min(ids), max(ids)]).rpartition("/")[0]
    if not shared and not os.path.isabs(ids[0]):
        return ids
    cut = len(shared) + 1
    return [i[cut:] or "." for i in ids]


def absolute_count(ids: list[str]) -> int:
    """How many ids are absolute paths: on POSIX those starting with ``/``, counted by a
    C-level ``map`` (``os.path.isabs`` called per id cost 0.8 µs: 4 s of a 20-backbone board of
    six tasks at 50,000 images)."""
    if os.path is posixpath:
        return sum(map(str.startswith, ids, itertools.repeat("/")))
    return sum(map(os.path.isabs, ids))


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
