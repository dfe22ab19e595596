"""Result rows (one JSON line per metric), their files, paper-style tables and comparisons.

Tables and comparisons are rendered from rows only. Rows are grouped by task, backbone and
weights id (a backbone name whose rows come from two weights files shows both, each labelled
with its weights id), metric and settings; rows of runs that differ only in seed
are aggregated as mean ± std; a single row that carries its own spread over seeds (few-shot)
shows value ± its own std over seeds (or ± its standard error).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, TypedDict

from evalkit.errors import EvalkitError


class Row(TypedDict, total=False):
    task: str
    task_version: int
    backbone: str
    weights_id: str
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


def append_row(path: Path, row: Row):
    """Append one line and fsync: a finished row survives any later crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_rows(paths) -> list[Row]:
    """Rows from JSONL files or folders of them; a torn last line (crash mid-write) is skipped."""
    rows: list[Row] = []
    for path in map(Path, paths):
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            for line in file.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def weights_group(row: Row) -> str:
    """Which weights a row came from, for grouping: the weights id, except that random weights
    (whose id follows the seed) form one group, so their seeds aggregate."""
    return "random init" if row.get("random_init") else row.get("weights_id", "")


def backbone_labels(rows: list[Row]) -> dict[tuple[str, str], str]:
    """(backbone, weights group) → how tables name it: the backbone alone, or with its weights
    id when rows of one backbone name come from different weights."""
    groups: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        groups[row["backbone"]].add(weights_group(row))
    return {
        (name, group): name if len(found) == 1 else f"{name} [{group}]"
        for name, found in groups.items()
        for group in found
    }


def aggregate(rows: list[Row]) -> list[dict[str, Any]]:
    """One record per (task, backbone and weights, metric, config): mean and spread over
    seeds."""
    labels = backbone_labels(rows)
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        label = labels[(row["backbone"], weights_group(row))]
        groups[(row["task"], label, row["metric"], row.get("config_hash", ""))].append(row)
    out = []
    for (task, backbone, metric, config_hash), members in groups.items():
        by_seed = {r.get("seed", 0): r for r in members}  # a rerun of a seed replaces it
        values = [r["value"] for r in by_seed.values()]
        if len(values) > 1:
            spread = statistics.stdev(values)
        else:
            spread = own_spread(next(iter(by_seed.values())))
        out.append(
            {
                "task": task,
                "backbone": backbone,
                "metric": metric,
                "config_hash": config_hash,
                "mean": statistics.fmean(values),
                "std": spread,
                "runs": len(values),
                "higher_is_better": members[0].get("higher_is_better", True),
                "random_init": any(r.get("random_init") for r in members),
            }
        )
    return out


def own_spread(row: Row) -> float | None:
    """The spread a single row carries: its std over its own seeds, else its standard error."""
    return row["std"] if row.get("std") is not None else row.get("stderr")


def format_value(mean: float, std: float | None) -> str:
    if std is None or math.isnan(std):
        return number(mean)
    return f"{number(mean)} ± {number(std)}"


def number(value: float) -> str:
    """Two decimals, three below 1 (calibration errors, depth errors: 0.012 is not 0.01)."""
    return f"{value:.3f}" if 0 < abs(value) < 1 else f"{value:.2f}"


def pivot_table(
    rows: list[Row],
    *,
    index: str = "backbone",
    columns: str = "task",
    references: dict[str, dict[str, dict[str, float]]] | None = None,
):
    """A pandas DataFrame of formatted cells, columns named ``<task> <metric> ↑/↓``, with one
    extra row per paper model for the tasks that have a paper number."""
    import pandas as pd

    records = aggregate(rows)
    cells: dict[str, dict[str, str]] = defaultdict(dict)
    for rec in records:
        arrow = "↑" if rec["higher_is_better"] else "↓"
        column = f"{rec[columns]} {rec['metric']} {arrow}"
        label = rec[index] + (
            " (random init)" if rec["random_init"] and index == "backbone" else ""
        )
        cells[column][label] = format_value(rec["mean"], rec["std"])
        for model, value in (
            (references or {}).get(rec["task"], {}).get(rec["metric"], {})
        ).items():
            cells[column][f"paper: {model}"] = number(value)
    frame = pd.DataFrame(cells).fillna("–")
    ours = sorted(i for i in frame.index if not i.startswith("paper: "))
    paper = sorted(i for i in frame.index if i.startswith("paper: "))
    return frame.loc[ours + paper, sorted(frame.columns)]


class Tolerances:
    """Allowed change per metric: ``"task:metric"`` glob patterns (the first match wins) to an
    absolute tolerance in the metric's units or a share of the baseline (``"10%"``); metrics
    no pattern matches get ``default``. Read from TOML (``BASE/tolerances.toml``)."""

    def __init__(self, default: float, patterns: dict[str, float | str] | None = None):
        self.default = default
        # parsed up front, so a bad entry is refused before anything is compared
        self.rules = [(p, *self._parse(p, v)) for p, v in (patterns or {}).items()]

    @classmethod
    def read(cls, path: Path, default: float) -> Tolerances:
        import tomllib

        try:
            return cls(default, tomllib.loads(Path(path).read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise EvalkitError(f"tolerances {path} are not valid TOML: {exc}") from None

    def allowed(self, task: str, metric: str, base: float) -> float:
        for pattern, amount, relative in self.rules:
            if fnmatch.fnmatchcase(f"{task}:{metric}", pattern):
                return amount * abs(base) if relative else amount
        return self.default

    @staticmethod
    def _parse(pattern: str, value) -> tuple[float, bool]:
        """(amount, relative) of one entry: a number ≥ 0, or a percentage ``"N%"``."""
        text = str(value).strip()
        try:
            amount = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            amount = -1.0
        if amount < 0 or isinstance(value, bool):
            raise EvalkitError(f"tolerance {pattern!r} = {value!r}: expected a number ≥ 0 or 'N%'")
        return amount, text.endswith("%")


def compare(
    base: list[Row], new: list[Row], *, tolerance: float | Tolerances, one_sided: bool = False
) -> list[dict[str, Any]]:
    """Per (task, backbone, metric): base, new, delta and a status — ``ok``, ``regression``
    (worse by more than the metric's tolerance, in its units), ``changed-up`` (better by more
    than that: a change the baseline does not explain, which fails the gate too), or with
    ``one_sided`` ``improved`` (tolerated); ``missing`` and ``new`` for rows on one side only."""
    if not isinstance(tolerance, Tolerances):
        tolerance = Tolerances(tolerance)

    def index(rows):
        return {(r["task"], r["backbone"], r["metric"]): r for r in aggregate(rows)}

    base_idx, new_idx = index(base), index(new)
    out = []
    for key in sorted(base_idx.keys() | new_idx.keys()):
        b, n = base_idx.get(key), new_idx.get(key)
        rec = {
            "task": key[0],
            "backbone": key[1],
            "metric": key[2],
            "base": b["mean"] if b else None,
            "new": n["mean"] if n else None,
            "delta": None,
            "allowed": None,
        }
        if b is None:
            rec["status"] = "new"
        elif n is None:
            rec["status"] = "missing"
        else:
            rec["delta"] = n["mean"] - b["mean"]
            gain = rec["delta"] if b["higher_is_better"] else -rec["delta"]
            up = "improved" if one_sided else "changed-up"
            allowed = rec["allowed"] = tolerance.allowed(key[0], key[2], b["mean"])
            rec["status"] = "regression" if gain < -allowed else (up if gain > allowed else "ok")
        out.append(rec)
    return out


FAILING = ("regression", "changed-up", "missing")  # statuses that fail the gate


def describe(rec: dict[str, Any]) -> str:
    """One line for a compared metric: what it was, what it is, what was allowed."""
    if rec["status"] == "missing":
        return f"{rec['status']}: baseline {rec['base']:.4g}, no new row"
    if rec["status"] == "new":
        return f"new: {rec['new']:.4g}, no baseline"
    return (f"{rec['status']}: baseline {rec['base']:.4g}, new {rec['new']:.4g}, "
            f"delta {rec['delta']:+.4g}, tolerance ±{rec['allowed']:.4g}")  # fmt: skip


def junit_xml(records: list[dict[str, Any]]) -> str:
    """A JUnit report: one test case per compared metric (suite = task), a failure for each
    status that fails the gate, with baseline, value and tolerance in its message."""
    from xml.etree import ElementTree as ET

    suites = ET.Element("testsuites", name="evalkit compare")
    by_task: dict[str, ET.Element] = {}
    for rec in records:
        suite = by_task.get(rec["task"])
        if suite is None:
            suite = by_task[rec["task"]] = ET.SubElement(suites, "testsuite", name=rec["task"])
        case = ET.SubElement(suite, "testcase", classname=rec["task"],
                             name=f"{rec['backbone']} {rec['metric']}")  # fmt: skip
        if rec["status"] in FAILING:
            ET.SubElement(case, "failure", message=describe(rec), type=rec["status"])
    for suite in suites:
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(sum(1 for case in suite if len(case))))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def github_annotations(records: list[dict[str, Any]]) -> str:
    """GitHub Actions workflow commands: an ``::error`` per failing metric."""
    lines = []
    for rec in records:
        if rec["status"] in FAILING:
            title = f"{rec['task']} {rec['backbone']} {rec['metric']}"
            lines.append(f"::error title={_escape(title, True)}::{_escape(describe(rec), False)}")
    return "".join(line + "\n" for line in lines)


def _escape(text: str, property_value: bool) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text
