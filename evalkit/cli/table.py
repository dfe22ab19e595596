"""``evalkit table``: result rows as a paper-style table (pivoted, with the paper's numbers
beside ours where the protocol matches), as CSV/JSON records, or one line per row with where
its weights and data came from."""

from __future__ import annotations

import functools
from pathlib import Path

from evalkit.errors import EvalkitError


def add_table(sub) -> None:
    """render result rows as a paper-style table"""
    table = sub.add_parser("table", help="render result rows as a paper-style table")
    table.add_argument("paths", nargs="+", type=Path)
    table.add_argument(
        "--pivot", default="backbone,task", help="ROWS,COLUMNS (backbone,task or task,backbone)"
    )
    table.add_argument(
        "--format",
        choices=("md", "csv", "json"),
        default="md",
        help="md: the paper-style table; csv, json: one record per (task, data, backbone, "
        "metric) with numeric value, interval, its kind, n and seeds",
    )
    table.add_argument("--output", "-o", type=Path, help="write to a file instead of stdout")
    table.add_argument(
        "--detail",
        action="store_true",
        help="one line per row: value, where its weights and data came from, when and how",
    )


def cmd_table(args, console) -> int:
    from evalkit.core.results import load_rows
    from evalkit.core.tables import pivot_table

    rows = load_rows(args.paths)
    if not rows:
        raise EvalkitError(
            f"no result rows in {', '.join(map(str, args.paths))} (expected *.jsonl from evalkit run)"
        )
    index, _, columns = args.pivot.partition(",")
    if {index, columns} != {"backbone", "task"}:
        raise EvalkitError(f"--pivot expects backbone,task or task,backbone, got {args.pivot!r}")
    if args.format != "md":
        text = records_text(rows, args.format)
    elif args.detail:
        text = markdown(detail_table([{**row, "task": table_task(row)} for row in rows]), "task")
    else:
        rows = [{**row, "task": table_task(row)} for row in rows]
        frame = pivot_table(rows, index=index, columns=columns, references=references_for(rows))
        text = markdown(frame, index) + legend(frame)
    if args.output:
        args.output.write_text(text)
        console.print(f"wrote {args.output}")
    else:
        print(text)
    return 0


RECORD_COLUMNS = (
    "task",
    "finetuned",
    "dataset",
    "backbone",
    "metric",
    "value",
    "interval",
    "interval_kind",
    "n",
    "seeds",
    "higher_is_better",
    "random_init",
    "draws",
)


def records_text(rows, fmt: str) -> str:
    """One numeric record per (task, data, backbone, metric): the mean, the interval and what
    it is (``sd``: over ``seeds`` job seeds, or over the task's own ``draws`` in one job when
    that is set; ``se``: over ``n`` test items), for other tools."""
    import json

    import pandas as pd

    from evalkit.core.tables import aggregate

    records = [
        {
            "task": r["task"],
            "finetuned": r["finetuned"],
            "dataset": r["dataset"],
            "backbone": r["backbone"],
            "metric": r["metric"],
            "value": r["mean"],
            "interval": r["std"],
            "interval_kind": r["interval"],
            "n": r["n"],
            "seeds": r["seeds"],
            "draws": r.get("draws"),
            "higher_is_better": r["higher_is_better"],
            "random_init": r["random_init"],
        }
        for r in aggregate(rows)
    ]
    records.sort(key=lambda r: (r["task"], r["dataset"], r["backbone"], r["metric"]))
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    return pd.DataFrame(records, columns=RECORD_COLUMNS).to_csv(index=False)


def legend(frame) -> str:
    """What the table's ``±`` means, for the kinds it shows (a spread over job seeds and one
    over a task's own draws are different quantities, so each is named), and why a stand-in
    column has no paper numbers beside it."""
    import re

    from evalkit.core.tables import INTERVALS

    cells = " ".join(str(v) for v in frame.values.ravel())
    shown = []
    if "(se" in cells:
        shown.append(f"± … (se, n): {INTERVALS['se']}, n of them")
    if re.search(r"\(sd/\d+\)", cells):
        shown.append(f"± … (sd/k): {INTERVALS['sd']}, k of them")
    if "draws)" in cells:
        shown.append(f"± … (sd/k draws): {INTERVALS['draws']}, k of them, one job seed")
    if any(STAND_IN in str(label) for label in [*frame.columns, *frame.index]):
        shown.append(
            f"{STAND_IN.strip()}: measured on evalkit's embedded stand-in images, not the real "
            "set, so the paper's numbers are not shown in that column"
        )
    return f"\n{'; '.join(shown)}.\n" if shown else ""


DETAIL = (
    "task",
    "dataset",
    "backbone",
    "metric",
    "value",
    "seed",
    "weights_source",
    "data_source",
    "evalkit",
    "device",
    "time",
    "run_key",
)


def detail_table(rows):
    """``--detail``: every row with its provenance: weights (hub repository@commit, local file,
    random init), data (a hub dataset's resolved commit), evalkit version, device, time, run key."""
    import pandas as pd

    from evalkit.core.labels import dataset_label
    from evalkit.core.tables import number

    lines = [
        {
            "task": r["task"],
            "dataset": dataset_label(r),
            "backbone": r["backbone"],
            "metric": r["metric"],
            "value": number(r["value"]),
            "seed": r.get("seed"),
            "weights_source": r.get("weights_source") or r.get("weights_id", ""),
            "data_source": r.get("data_source", ""),
            "run_key": r.get("run_key", ""),
            **{k: r.get("provenance", {}).get(k, "") for k in ("evalkit", "device", "time")},
        }
        for r in rows
    ]
    return pd.DataFrame(lines, columns=DETAIL).set_index("task")


FINETUNED = " (fine-tuned)"
STAND_IN = " (stand-in)"


def table_task(row) -> str:
    """A row's task as tables name it: fine-tuned runs apart from frozen ones, a run on data
    other than the task's own (``--set dataset=folder:PATH``) under that dataset's name, and a
    run on the embedded stand-in marked as one."""
    config = row.get("config", {})
    label = row["task"] + (FINETUNED if config.get("finetune") else "")
    recorded = row.get("dataset")
    if isinstance(recorded, dict):  # rows say what they read; older rows are looked up
        own = None if recorded.get("own") else recorded.get("name")
        stand_in = STAND_IN if recorded.get("stand_in") else ""
    else:
        own, stand_in = _own_dataset(row["task"], config), ""
    return (f"{label} on {own}" if own else label) + stand_in


def _own_dataset(task: str, config: dict) -> str | None:
    """The dataset a row was run on when it is not the task's own (None when it is)."""
    default, used = _default_dataset(task), config.get("dataset")
    return used if used is not None and default is not None and used != default else None


@functools.cache
def _default_dataset(task: str) -> str | None:
    """A task's own dataset (None for tasks unknown here or without one); once per name."""
    from evalkit.core.runner import resolve_task

    try:
        return getattr(resolve_task(task), "dataset", None)
    except EvalkitError:
        return None


def references_for(rows) -> dict:
    """The paper's numbers for the tasks present, as each was run: frozen numbers beside
    frozen runs, fine-tuned ones beside fine-tuned runs, none beside a run on other data or on
    the embedded stand-in (tasks unknown here have none)."""
    refs, looked_up = {}, set()
    for row in rows:  # rows carry the paper's numbers they sit beside; older rows look them up
        if row["task"].endswith(STAND_IN):  # measured on other images: not comparable
            refs[row["task"]] = {}
        elif "paper" in row:
            refs.setdefault(row["task"], {})[row["metric"]] = row["paper"]
        else:
            looked_up.add(row["task"])
    return refs | _looked_up_references(looked_up)


def _looked_up_references(labels: set[str]) -> dict:
    if not labels:
        return {}  # no task module imported: a table of new rows renders in about a second
    from evalkit.core.runner import resolve_task

    refs = {}
    for label in labels:
        name = label.removesuffix(FINETUNED)
        overrides = ["finetune=true"] if label.endswith(FINETUNED) else []
        try:
            refs[label] = {} if " on " in label else resolve_task(name, overrides).reference
        except EvalkitError:
            refs[label] = {}
    return refs


def markdown(frame, index_name: str) -> str:
    header = [index_name, *frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join([str(i), *map(str, row)]) + " |"
        for i, row in zip(frame.index, frame.values, strict=True)
    ]
    return "\n".join(lines) + "\n"
