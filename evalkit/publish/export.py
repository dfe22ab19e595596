"""``evalkit export RESULTS --format eee|mteb``: result rows in the layouts other tools read,
each checked in tests/test_export.py by the receiver's own rules.

- ``eee``: Every Eval Ever aggregate records in its datastore layout,
  ``OUT/data/<task>/<developer>/<model>/<uuid4>.json`` (``evalkit.publish.eee``).
- ``mteb``: MTEB's results layout, ``OUT/<org__model>/<revision>/<task>.json`` with a
  ``model_meta.json`` per revision (``evalkit.publish.mteb_results``).

Rows are grouped by setup (``setup_labels``) exactly as tables group them, so two setups of
one backbone never share a file.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from evalkit.core.labels import dataset_label, setup_key, setup_labels
from evalkit.core.results import Row, load_rows
from evalkit.errors import EvalkitError
from evalkit.publish import eee, mteb_results
from evalkit.storage.writes import replacing

FORMATS = ("eee", "mteb")


def export(results: Path, out: Path, fmt: str, *, organization: str = "unknown") -> list[Path]:
    """Write ``results``' rows to ``out`` in format ``fmt``; the files written."""
    if fmt not in FORMATS:
        raise EvalkitError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    rows = load_rows([results])
    if not rows:
        raise EvalkitError(f"no result rows under {results} (expected evalkit run's *.jsonl)")
    labels = setup_labels(rows)
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[(setup_key(row), row["task"], dataset_label(row))].append(row)
    written = []
    for (setup, task, _), members in sorted(groups.items(), key=lambda item: str(item[0])):
        if fmt == "eee":
            record = eee.eee_record(members, labels[setup], organization)
            written.append(_write(eee.record_path(out, record, task), record))
        else:
            path = mteb_results.result_path(out, members, task)
            written.append(_write(path, mteb_results.mteb_record(members)))
            _write(path.parent / "model_meta.json", mteb_results.model_meta(members[0]))
    return written


def _write(path: Path, record: dict) -> Path:
    try:  # both receivers read strict JSON (EEE's reader rejects NaN outright)
        text = json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n"
    except ValueError as error:
        raise EvalkitError(f"export: {path.name} would hold a non-finite number") from error
    with replacing(path) as tmp:
        tmp.write_text(text)
    return path
