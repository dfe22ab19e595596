"""Result rows (one JSON line per metric), their files, paper-style tables and comparisons.

Tables and comparisons are rendered from rows only. Rows are grouped by run spec — task,
backbone, weights id, backbone options and settings — and metric; two specs of one backbone
never merge: each is labelled with what sets it apart (its weights id, the options and
settings that differ). Rows of a spec that differ only in seed are aggregated as mean ± std;
a single row that carries its own spread over seeds (few-shot) shows value ± its own std over
seeds (or ± its standard error). ``compare`` matches baseline and new rows by run spec.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import re
import statistics
from collections import defaultdict
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


def cell_key(cell: dict) -> tuple:
    """A cell as failure records and study records name it (task, backbone, seed, the weights
    file given, the backbone options), comparable with ``row_cell``."""
    options = json.dumps(cell.get("options") or {}, sort_keys=True, default=str)
    return (
        cell.get("task"),
        cell.get("backbone"),
        cell.get("seed", 0),
        cell.get("weights"),
        options,
    )


def row_cell(row: Row) -> tuple:
    """The ``cell_key`` of the cell a row belongs to (its weights file read back from
    ``weights_source``)."""
    source = str(row.get("weights_source") or "")
    weights = source.removeprefix("local file ") if source.startswith("local file ") else None
    return cell_key({**row, "options": row.get("backbone_options"), "weights": weights})


def weights_group(row: Row) -> str:
    """Which weights a row came from, for grouping: the weights id, except that random weights
    (whose id follows the seed) form one group, so their seeds aggregate."""
    return "random init" if row.get("random_init") else row.get("weights_id", "")


def run_spec(row: Row) -> tuple:
    """What makes rows comparable: task, backbone, weights, backbone options, settings and the
    data. Rows differing in anything else (seed, time, machine) are repeats of one run spec;
    a stand-in number and a real one never aggregate."""
    backbone, weights, options = setup_key(row)
    return (row["task"], backbone, weights, options, row.get("config_hash", ""), dataset_label(row))


def dataset_label(row: Row) -> str:
    """The data a row was computed on, as views name it: the dataset (``imagenet``,
    ``folder:/data/flowers``) and ``(stand-in)`` for evalkit's embedded stand-in; rows that do
    not record it name their ``dataset`` setting or nothing."""
    recorded = row.get("dataset")
    if isinstance(recorded, dict):
        name = recorded.get("name") or "no dataset"
        return name + (" (stand-in)" if recorded.get("stand_in") else "")
    return str((row.get("config") or {}).get("dataset") or "")


def setup_key(row: Row) -> tuple:
    """The model setup a number belongs to, whatever its task: the backbone, its weights (the
    weights id, or random init, whose seeds aggregate) and its constructor options."""
    options = json.dumps(row.get("backbone_options") or {}, sort_keys=True, default=str)
    return (row["backbone"], weights_group(row), options)


def setup_labels(rows: list[Row]) -> dict[tuple, str]:
    """Model setup → its one label in every view: the backbone alone, or with what sets it
    apart from the other setups of that backbone among ``rows`` (``fake [img_size=64]``, a
    weights id), and ``(random init)`` when its weights are random. Chosen over all the rows
    at once, never per task, so one setup has one label and two setups never share one."""
    return {
        key: setup_label(key[0], parts, random) for key, (parts, random) in _setups(rows).items()
    }


def _setups(rows: list[Row]) -> dict[tuple, tuple[list[str], bool]]:
    """Model setup → (what sets it apart from its backbone's other setups, random init)."""
    by_backbone: dict[str, dict[tuple, Row]] = defaultdict(dict)
    for row in rows:
        by_backbone[row["backbone"]].setdefault(setup_key(row), row)
    found = {}
    for setups in by_backbone.values():
        options = _differing([r.get("backbone_options") or {} for r in setups.values()])
        several_weights = len({weights_group(r) for r in setups.values()}) > 1
        for key, row in setups.items():
            own = row.get("backbone_options") or {}
            parts = [f"{k}={_short(own[k])}" for k in options if k in own]
            if several_weights and not row.get("random_init"):
                parts.append(f"weights {_short(str(row.get('weights_id', '')))}")
            found[key] = (parts, bool(row.get("random_init")))
        labels = {key: setup_label(key[0], *found[key]) for key in setups}
        for key in setups:  # parts cut alike: the options themselves tell them apart
            if list(labels.values()).count(labels[key]) > 1:
                found[key][0].append(f"options {key[2]}")
    return found


def setup_label(name: str, parts: list[str], random_init: bool) -> str:
    """``name [part, part] (random init)``: the one way every view writes a setup."""
    text = name + (f" [{', '.join(parts)}]" if parts else "")
    return text + (" (random init)" if random_init else "")


UNLABELLED_SETTINGS = ("dataset",)  # views show the data beside the label (column or board)


def spec_labels(rows: list[Row]) -> dict[tuple, str]:
    """Run spec → how views name it: its setup's label (``setup_labels``) with the task
    settings it ran away from the task's defaults, where that setup ran the task in more than
    one way (``timm/x [pool=mean]`` beside plain ``timm/x``). Chosen per task over every data
    set at once, so a setup's default run has one label on every board, whatever runs beside
    it; runs that still look alike on one data set get their settings hash."""
    setups = _setups(rows)
    variants: dict[tuple, dict[tuple, Row]] = defaultdict(dict)
    for row in rows:  # the task as registered: views may rename it per data set
        task = (row.get("config") or {}).get("name") or row["task"]
        variants[(task, setup_key(row))][run_spec(row)] = row
    labels = {}
    for (task, setup), specs in variants.items():
        parts, random_init = setups[setup]
        settings = [k for k in _differing([r.get("config") or {} for r in specs.values()])]
        settings = [k for k in settings if k not in UNLABELLED_SETTINGS]
        defaults = task_defaults(task) if settings else {}
        if defaults:  # a setting this version no longer has names no run apart
            settings = [k for k in settings if k in defaults]
        for spec, row in specs.items():
            own = row.get("config") or {}
            shown = [
                k for k in settings if defaults is None or _text(own.get(k)) != defaults.get(k)
            ]
            labels[spec] = setup_label(
                setup[0], parts + [f"{k}={_short(own.get(k))}" for k in shown], random_init
            )
        _tell_apart(labels, specs)
    return labels


@functools.cache
def task_defaults(task: str) -> dict[str, str] | None:
    """The settings ``task`` runs with when none is given, each as JSON text; None for a
    task this installation does not know (its rows then name every setting that differs)."""
    from evalkit.core.catalog import resolve_task

    try:
        config = resolve_task(task).config()
    except (EvalkitError, ImportError):
        return None
    return {key: _text(value) for key, value in config.items()}


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _differing(dicts: list[dict]) -> list[str]:
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({_text(d.get(k)) for d in dicts}) > 1]


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:21] + "..."


def _tell_apart(labels: dict[tuple, str], specs: dict[tuple, Row]):
    """Specs of one data set whose visible differences do not separate them (settings
    recorded the same under different hashes) get their settings hash too."""
    seen: dict[tuple, int] = defaultdict(int)
    for spec in specs:
        seen[(labels[spec], spec[5])] += 1
    for spec in specs:
        if seen[(labels[spec], spec[5])] > 1:
            labels[spec] += f" [settings {spec[4][:8]}]"


def aggregate(rows: list[Row], labels: dict[tuple, str] | None = None) -> list[dict[str, Any]]:
    """One record per run spec and metric: mean and spread over seeds; ``labels`` names the
    specs when they were chosen over more rows than these (``spec_labels``)."""
    labels = labels or spec_labels(rows)
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[(run_spec(row), row["metric"])].append(row)
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
    ``one_sided`` ``improved`` (tolerated); ``missing`` and ``new`` for rows on one side only.

    Seeds are part of what is compared: where the two sides ran different seed sets, both
    are cut to the seeds they share (a mean of seeds 0 and 1 is never set against seed 0
    alone), and each record's ``seeds`` says which seeds it compares."""
    if not isinstance(tolerance, Tolerances):
        tolerance = Tolerances(tolerance)

    labels = spec_labels([*base, *new])  # one naming for both sides: what differs shows
    base, new, seeds = on_shared_seeds(base, new)

    def index(rows):
        return {(r["spec"], r["metric"]): r for r in aggregate(rows, labels)}

    base_idx, new_idx = index(base), index(new)
    out = []
    for key in sorted(base_idx.keys() | new_idx.keys()):
        b, n = base_idx.get(key), new_idx.get(key)
        rec = {
            "task": key[0][0],
            "dataset": (b or n)["dataset"],
            "backbone": (b or n)["backbone"],
            "metric": key[1],
            "base": b["mean"] if b else None,
            "new": n["mean"] if n else None,
            "delta": None,
            "allowed": None,
            "spec": key[0],
            "seeds": seeds.get((key[0][:6], key[1]), ""),
            "higher_is_better": (b or n)["higher_is_better"],
        }
        if b is None:
            rec["status"] = "new"
        elif n is None:
            rec["status"] = "missing"
        else:
            rec["delta"] = n["mean"] - b["mean"]
            gain = rec["delta"] if b["higher_is_better"] else -rec["delta"]
            up = "improved" if one_sided else "changed-up"
            allowed = rec["allowed"] = tolerance.allowed(rec["task"], rec["metric"], b["mean"])
            rec["status"] = "regression" if gain < -allowed else (up if gain > allowed else "ok")
        out.append(rec)
    return out


def on_shared_seeds(base: list[Row], new: list[Row]) -> tuple[list[Row], list[Row], dict]:
    """Both sides' rows cut, per (run spec, metric), to the seeds both ran, and what each
    comparison is made on: ``"0, 1"`` where the seed sets agree, ``"base seeds 0, 1; new seed
    0: compared on seed 0"`` where they differ. Sides with no seed in common keep all their
    rows (their means are compared) and say so."""
    found: dict[tuple, list[set]] = defaultdict(lambda: [set(), set()])
    for side, rows in enumerate((base, new)):
        for row in rows:
            found[(run_spec(row), row["metric"])][side].add(row.get("seed", 0))
    kept: dict[tuple, set] = {}
    said = {}
    for key, (ran_base, ran_new) in found.items():
        shared = ran_base & ran_new
        kept[key] = shared or ran_base | ran_new
        said[key] = _seeds_said(ran_base, ran_new, shared)

    def cut(rows):
        return [r for r in rows if r.get("seed", 0) in kept[(run_spec(r), r["metric"])]]

    return cut(base), cut(new), said


def _seeds_said(ran_base: set, ran_new: set, shared: set) -> str:
    def named(seeds: set) -> str:
        return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, sorted(seeds)))

    if ran_base == ran_new or not (ran_base and ran_new):
        return ", ".join(map(str, sorted(ran_base | ran_new)))
    sides = f"base {named(ran_base)}; new {named(ran_new)}"
    if not shared:
        return f"{sides}: no seed in common, their means compared"
    return f"{sides}: compared on {named(shared)}"


FAILING = ("regression", "changed-up", "missing")  # statuses that fail the gate


def describe(rec: dict[str, Any]) -> str:
    """One line for a compared metric: what it was, what it is, what was allowed."""
    if rec["status"] == "missing":
        return f"{rec['status']}: baseline {rec['base']:.4g}, no new row"
    if rec["status"] == "new":
        return f"new: {rec['new']:.4g}, no baseline"
    return (
        f"{rec['status']}: baseline {rec['base']:.4g}, new {rec['new']:.4g}, "
        f"delta {rec['delta']:+.4g}, tolerance ±{rec['allowed']:.4g}"
    )


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
        case = ET.SubElement(
            suite, "testcase", classname=rec["task"], name=f"{rec['backbone']} {rec['metric']}"
        )
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
