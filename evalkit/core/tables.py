"""Paper-style tables from rows: one record per repeat key (a run, seeds apart) and metric, aggregated over seeds as
mean ± std, or, for a single row that carries its own spread (few-shot's draws), value ± its own
std (or ± its standard error over the test items); how a value and its interval are printed, and
the pivot table ``evalkit table`` prints.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any

from evalkit.core.labels import repeat_key, repeat_labels
from evalkit.core.results import Row


def aggregate(rows: list[Row], labels: dict[tuple, str] | None = None) -> list[dict[str, Any]]:
    """One record per repeat key and metric: mean and spread over seeds; ``labels`` names the
    specs when they were chosen over more rows than these (``repeat_labels``)."""
    labels = labels or repeat_labels(rows)
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[(repeat_key(row), row["metric"])].append(row)
    out = []
    for (spec, metric), members in groups.items():
        for part_spec, part in _one_weights_per_seed(spec, members):
            label = labels[spec] + (f" [{part[0].get('weights_id')}]" if part_spec != spec else "")
            out.append(_aggregated(part_spec, label, metric, part))
    return out


def _one_weights_per_seed(spec: tuple, members: list[Row]) -> list[tuple[tuple, list[Row]]]:
    """Random weights aggregate over seeds, one weights id per seed; rows that give one seed
    two weights ids (written by different commands) are different backbones: each weights id
    is then a spec of its own, never merged."""
    ids = defaultdict(set)
    for row in members:
        ids[row.get("seed", 0)].add(row.get("weights_id"))
    if all(len(found) == 1 for found in ids.values()):
        return [(spec, members)]
    parts: dict[str, list[Row]] = defaultdict(list)
    for row in members:
        parts[row.get("weights_id")].append(row)
    return [((*spec, weights), rows) for weights, rows in sorted(parts.items(), key=str)]


def _aggregated(spec: tuple, label: str, metric: str, members: list[Row]) -> dict[str, Any]:
    by_seed = {r.get("seed", 0): r for r in members}  # a rerun of a seed replaces it
    values = [r["value"] for r in by_seed.values()]
    last = members[-1]
    return {
        "task": spec[0],
        "backbone": label,
        "spec": spec,
        "setup": spec[1:4],
        "dataset": spec[5],
        "metric": metric,
        "config_hash": spec[4],
        "mean": statistics.fmean(values),
        **interval(values, last),
        "n": last.get("n"),
        "runs": len(values),
        "higher_is_better": members[0].get("higher_is_better", True),
        "finetuned": bool((members[0].get("config") or {}).get("finetune")),
        "random_init": any(r.get("random_init") for r in members),
    }


INTERVALS = {
    "sd": "standard deviation over job seeds (runs differing only in --seed)",
    "draws": "standard deviation over the task's own draws within one job (few-shot's "
    "training subsets)",
    "se": "standard error over the test items",
}


def interval(values: list[float], row: Row) -> dict[str, Any]:
    """What the ``±`` of an aggregated value is: the standard deviation over its job seeds
    when there are several (``sd``, ``seeds`` of them), else the row's own standard deviation
    over the draws it made internally (``sd`` with ``draws`` of them: one job seed), else its
    standard error over the test items (``se``)."""
    if len(values) > 1:
        return {"std": statistics.stdev(values), "interval": "sd", "seeds": len(values)}
    if row.get("std") is not None:
        draws = len(row.get("seeds") or [])
        return {"std": row["std"], "interval": "sd", "seeds": 1, "draws": draws}
    if row.get("stderr") is not None:
        return {"std": row["stderr"], "interval": "se", "seeds": 1}
    return {"std": None, "interval": None, "seeds": 1}


def own_spread(row: Row) -> float | None:
    """The spread a single row carries: its std over its own seeds, else its standard error."""
    return row["std"] if row.get("std") is not None else row.get("stderr")


def format_value(record: dict[str, Any]) -> str:
    """An aggregated record's cell: ``24.22 ± 2.19 (se, n=384)`` (standard error over n test
    items), ``24.22 ± 1.10 (sd/3)`` (standard deviation over 3 job seeds) or ``24.22 ± 1.10
    (sd/5 draws)`` (over the task's own 5 draws in one job: not the same spread)."""
    mean, std = record["mean"], record["std"]
    if std is None or math.isnan(std):
        return number(mean)
    n = f", n={record['n']}" if record.get("n") else ""
    spread = f"{record['draws']} draws" if record.get("draws") else record["seeds"]
    label = {"se": f" (se{n})", "sd": f" (sd/{spread})"}.get(record["interval"] or "", "")
    return f"{number(mean)} ± {number(std)}{label}"


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
        cells[column][rec[index]] = format_value(rec)
        for model, value in (
            (references or {}).get(rec["task"], {}).get(rec["metric"], {})
        ).items():
            cells[column][f"paper: {model}"] = number(value)
    frame = pd.DataFrame(cells).fillna("–")
    ours = sorted(i for i in frame.index if not i.startswith("paper: "))
    paper = sorted(i for i in frame.index if i.startswith("paper: "))
    return frame.loc[ours + paper, sorted(frame.columns, key=natural_order)]


def natural_order(text: str) -> tuple:
    """Sort key that reads numbers as numbers: ``imagenet-1shot`` before ``imagenet-10shot``,
    ``ade20k-1/2`` before ``ade20k-1/16``."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)
    )
