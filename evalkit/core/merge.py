"""``evalkit merge OUT DIR…``: result folders written on several machines (the shards of a
zoo, runs made elsewhere) brought into one, as if one process had written them.

Rows, per-image outputs and failed cells are copied into OUT under the same relative names.
Merging is idempotent (a row already there is not written again) and safe beside runs and
other merges (rows go through the same locked, all-or-nothing appends as runs; files are
written under a temporary name and renamed). Before anything is written, every source is
checked, and the merge is refused, naming both places, when two rows share a run key but not
a value, when two rows of one setup, task, settings, data and seed were measured differently
(another task version, other data files), or when two per-image files of one name differ.
The cells still missing — a task some setup ran and another did not — are written to
``missing-cells.json``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.core.labels import (
    cell_key,
    dataset_label,
    repeat_key,
    repeat_labels,
    row_cell,
    setup_key,
    setup_labels,
)
from evalkit.core.results import FAILED, file_rows, rows_files, rows_text
from evalkit.errors import EvalkitError
from evalkit.storage.writes import appending, replacing

MISSING = "missing-cells.json"


@dataclass
class Merged:
    rows: int = 0  # rows written
    outputs: int = 0  # per-image files copied
    failed: int = 0  # failed-cell records added
    missing: list[dict] = field(default_factory=list)


def merge(out: Path, sources: list[Path]) -> Merged:
    """Bring the result folders ``sources`` into ``out`` (see the module's docstring)."""
    out = Path(out)
    found = {rel: list(pairs) for rel, pairs in _rows_by_file(sources).items()}
    present = _rows_by_file([out]) if out.exists() else {}
    _check_rows([pair for pairs in [*present.values(), *found.values()] for pair in pairs])
    outputs = _outputs_to_copy(out, sources)
    records = _study_records(sources)
    merged = Merged()
    for rel, pairs in sorted(found.items()):
        have = {_row_id(row) for row, _ in present.get(rel, [])}
        new = {}
        for row, _ in pairs:
            new.setdefault(_row_id(row), row)
        rows = [row for key, row in new.items() if key not in have]
        if rows:
            appending(out / rel, rows_text(rows).encode())
            merged.rows += len(rows)
    for source, target in outputs:
        with replacing(target) as tmp:
            tmp.write_bytes(source.read_bytes())
        merged.outputs += 1
    merged.failed = _merge_failed(out, sources)
    _keep_study_records(out, records)
    merged.missing = missing_cells(out)
    return merged


def _rows_by_file(folders) -> dict[str, list[tuple[dict, Path]]]:
    """Rows files' relative names → (row, the file it was read from) of every folder."""
    found: dict[str, list] = defaultdict(list)
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise EvalkitError(f"{folder} is not a folder of results (evalkit run's --out)")
        for file in rows_files([folder]):
            found[str(file.relative_to(folder))] += [(row, file) for row in file_rows(file)]
    return found


def _row_id(row: dict) -> tuple:
    return (row.get("run_key"), row["metric"], row.get("seed", 0))


def _check_rows(pairs: list[tuple[dict, Path]]):
    """Refuse rows that would make one number two: one run key with two values, or one setup,
    task, settings, data and seed measured two ways."""
    by_id: dict[tuple, tuple[dict, Path]] = {}
    by_measure: dict[tuple, tuple[dict, Path]] = {}
    labels = repeat_labels([row for row, _ in pairs])  # named as every view names the setup
    for row, file in pairs:
        first = by_id.setdefault(_row_id(row), (row, file))
        if not _same_value(first[0]["value"], row["value"]):
            raise EvalkitError(
                f"run key {row.get('run_key')} ({row['task']} {row['metric']}, seed "
                f"{row.get('seed', 0)}) has {first[0]['value']!r} in {first[1]} and "
                f"{row['value']!r} in {file}: one job cannot have two values; keep one"
            )
        measure = (row["task"], setup_key(row), row.get("config_hash"), dataset_label(row))
        measure += (row["metric"], row.get("seed", 0))
        other = by_measure.setdefault(measure, (row, file))[0]
        for what in ("task_version", "data_id"):
            if other.get(what) != row.get(what):
                raise EvalkitError(
                    f"{row['task']} {row['metric']} of {labels[repeat_key(row)]} (seed "
                    f"{row.get('seed', 0)}) was measured with another {what} in "
                    f"{by_measure[measure][1]} than in {file}: they cannot share a table; "
                    "rerun one of them"
                )


def _same_value(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a + b))


def _outputs_to_copy(out: Path, sources) -> list[tuple[Path, Path]]:
    """(source, target) of each per-image file not yet in ``out``; one of the same name with
    other contents is refused."""
    copies = {}
    for folder in map(Path, sources):
        for source in sorted(folder.rglob("predictions/*.parquet")):
            target = out / _readable(source).relative_to(folder)
            known = copies.get(target, _readable(target) if target.exists() else None)
            if known is not None and not _same_outputs(known, source):
                raise EvalkitError(
                    f"per-image outputs {source} differ from {known}, which has the same name "
                    "(the same cell): one job cannot have two outputs; keep one"
                )
            if known is None:
                copies[target] = source
    return [(source, target) for target, source in copies.items()]


def _readable(path: Path) -> Path:
    """``path``, read whole as Parquet, or one line naming it: nothing is merged from a cut
    or damaged file (a merged folder has no run that would recompute it)."""
    import pandas as pd

    try:
        pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a damaged file
        raise EvalkitError(
            f"per-image outputs {path} cannot be read ({type(exc).__name__}): the file was cut "
            "off or damaged; rerun its cell (evalkit run ... --save-predictions) or delete it, "
            "then merge again (nothing was written)"
        ) from None
    return path


def _same_outputs(a: Path, b: Path) -> bool:
    import pandas as pd

    if a.read_bytes() == b.read_bytes():
        return True
    return pd.read_parquet(a).equals(pd.read_parquet(b))


def _merge_failed(out: Path, sources) -> int:
    """Failed-cell records of the sources not yet in ``out``'s file."""
    target = out / FAILED
    have = set(target.read_text(encoding="utf-8").splitlines()) if target.exists() else set()
    new = []
    for folder in map(Path, sources):
        for file in sorted(Path(folder).rglob(FAILED)):
            new += [x for x in file.read_text(encoding="utf-8").splitlines() if x not in have]
            have |= set(new)
    if new:
        appending(target, "".join(line + "\n" for line in new).encode())
    return len(new)


def missing_cells(out: Path) -> list[dict]:
    """The cells a merged folder lacks, written to ``missing-cells.json`` and returned: every
    cell of a study that no merged share delivered (a share never merged, a cell that failed
    or was lost; ``<out>/shares/``), and a (task, data) some setup has and another does not."""
    rows = [row for file in rows_files([out]) for row in file_rows(file)]
    missing = undelivered_cells(out, rows) + _gaps(rows)
    with replacing(out / MISSING) as tmp:
        tmp.write_text(json.dumps(missing, indent=1) + "\n")
    return missing


def _gaps(rows: list[dict]) -> list[dict]:
    labels = setup_labels(rows)
    tasks = {(row["task"], dataset_label(row)) for row in rows}
    have = {(row["task"], dataset_label(row), setup_key(row)) for row in rows}
    return [
        {"task": task, "dataset": data, "backbone": labels[setup], "why": "not run"}
        for setup in sorted(labels, key=labels.get)
        for task, data in sorted(tasks)
        if (task, data, setup) not in have
    ]


SHARES = "shares"  # where each share keeps its study's record (cells.study_record)


def _study_records(sources) -> dict[str, dict]:
    """File name → the study record of each share among ``sources`` (read before any write)."""
    found = {}
    for folder in map(Path, sources):
        for path in sorted((folder / SHARES).glob("*.json")):
            try:
                found[path.name] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise EvalkitError(f"cannot read the share record {path} ({exc})") from None
    return found


def _keep_study_records(out: Path, records: dict[str, dict]):
    for name, record in records.items():
        with replacing(out / SHARES / name) as tmp:
            tmp.write_text(json.dumps(record))


def undelivered_cells(out: Path, rows: list[dict]) -> list[dict]:
    """Every cell of each study under ``out/shares`` with no row in ``rows``: named by the
    share that should have run it, and whether that share was merged at all."""
    studies: dict[str, dict] = {}
    for record in _study_records([out]).values():
        study = studies.setdefault(record["study"], {"record": record, "merged": set()})
        study["merged"].add(record["share"])
    done = {row_cell(row) for row in rows} | {row.get("request_key") for row in rows}
    missing = []
    for study in studies.values():
        record = study["record"]
        shares = record["share_of"]
        for position, cell in enumerate(record["cells"]):
            # by the key its rows carry; a cell whose data could not be read where the share
            # ran has none, and is matched by its names
            if (cell.get("request_key") or cell_key(cell)) in done:
                continue
            share = shares[position]
            why = "merged, but the cell has no rows (it failed or was lost)"
            if share not in study["merged"]:
                why = "that share was not merged"
            missing.append(
                {**cell, "why": f"share {share} of {record['of']}: {why}", "study": record["study"]}
            )
    return missing
