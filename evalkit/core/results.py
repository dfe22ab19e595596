"""Result rows (one JSON line per metric) and their files: the rows file of a task, the per-image
file of a cell, appending a job's rows all or nothing, replacing a rerun's, and reading rows back,
skipping what is not a row (docs/results.md, "Result rows").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypedDict

from evalkit.errors import EvalkitError, warn
from evalkit.storage.writes import appending, rewriting


class Row(TypedDict, total=False):
    task: str
    task_version: int
    backbone: str
    weights_id: str
    weights_source: str  # hub repository@commit, local file, or random init
    random_init: bool
    metric: str
    value: float
    stderr: float | None
    std: float | None
    higher_is_better: bool
    n: int | None
    seeds: list[int]
    seed: int
    config: dict[str, Any]
    config_hash: str
    run_key: str
    data_id: dict[str, str]
    extra: dict[str, Any]
    provenance: dict[str, Any]


def task_slug(task: str) -> str:
    return task.replace("/", "_")


def rows_file(out_dir: Path, task: str) -> Path:
    return Path(out_dir) / f"{task_slug(task)}.jsonl"


def predictions_file(out_dir: Path, task: str, backbone: str, seed: int, key: str) -> Path:
    """``<out>/predictions/<task>--<backbone>--s<seed>--<run key>.parquet``: a cell's
    per-image outputs, written by the runner and found by every view from its row."""
    slug = f"{task}--{backbone}--s{seed}--{key}".replace("/", "_")
    return Path(out_dir) / "predictions" / f"{slug}.parquet"


def append_rows(path: Path, rows: list[Row]):
    """Append one job's rows in one write, synced: all of them land or none does (a crash or
    a full disk never leaves a job half-recorded, so a rerun never writes a seed twice)."""
    data = rows_text(rows).encode()
    if data and appending(path, data):
        warn(f"{path} ended in a torn line (an earlier write was cut off): it is kept apart")


def rows_text(rows: list[Row]) -> str:
    """JSON lines, valid JSON only: a value that is not a finite number (NaN, ±inf) is written
    as null with the reason beside it (``value_invalid``), and readers skip such a row."""
    return "".join(json.dumps(finite(row), sort_keys=True, allow_nan=False) + "\n" for row in rows)


def finite(record):
    """``record`` with every float that is not finite replaced by None; a row whose value was
    one says which (``value_invalid``: ``nan``, ``inf`` or ``-inf``)."""
    if isinstance(record, dict):
        out = {key: finite(value) for key, value in record.items()}
        value = record.get("value")
        if isinstance(value, float) and not math.isfinite(value):
            out["value_invalid"] = str(value)
        return out
    if isinstance(record, list | tuple):
        return [finite(value) for value in record]
    if isinstance(record, float) and not math.isfinite(record):
        return None
    return record


def replace_rows(path: Path, key: str, rows: list[Row]):
    """A rerun job's rows in place of the ones it wrote before under run key ``key`` (the
    file keeps one copy of each job), in one all-or-nothing write."""
    data = rows_text(rows).encode()
    rewriting(path, lambda line: _run_key(line) == key, data)


def holds_run_key(path: Path, key: str) -> bool:
    """Whether ``path`` has a line of run key ``key``, a row readers skip (a value that is not
    a number) included."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    return key.encode() in data and any(_run_key(line) == key for line in data.splitlines())


def _run_key(line: bytes) -> str | None:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a torn line stays as it is (readers skip it)
    return row.get("run_key") if isinstance(row, dict) else None


def append_row(path: Path, row: Row):
    append_rows(path, [row])


REQUIRED = {"task": str, "backbone": str, "metric": str}


FAILED = "failed-cells.ndjson"  # a zoo's failed cells, beside its rows (not a rows file)


def load_rows(paths) -> list[Row]:
    """Rows from JSONL files or folders of them. A line that is not a row (a torn last line
    from a crash, a hand edit, another tool's output) is skipped with one warning naming its
    file and line."""
    return [row for file in rows_files(paths) for row in file_rows(file)]


def rows_files(paths) -> list[Path]:
    """The rows files under ``paths`` (files, or folders searched however deep)."""
    files = []
    for path in map(Path, paths):
        if not path.exists():
            raise EvalkitError(
                f"no such file or folder: {path} (expected rows files *.jsonl "
                "or a folder of them, as evalkit run writes)"
            )
        files += sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    return files


def file_rows(file: Path) -> list[Row]:
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalkitError(f"cannot read rows file {file} ({exc})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        row, problem = _parsed(line)
        if problem is None:
            rows.append(row)
        elif line.strip():
            warn(f"{file}:{number} is not a result row ({problem}): skipped")
    return rows


def _parsed(line: str) -> tuple[Row | None, str | None]:
    """The row on one line, or why it is not one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None, "not JSON: cut off or edited"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    for key, kind in REQUIRED.items():
        if not isinstance(row.get(key), kind):
            return None, f"no {key} text"
    value = row.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        reason = row.get("value_invalid") or value
        return None, f"value {reason!r} is not a number"
    return row, None
