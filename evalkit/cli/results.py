"""``evalkit table``, ``evalkit compare`` and ``evalkit errors``: result rows as tables, gates between two sets of rows, and the eval items a model got wrong."""

from __future__ import annotations

import functools
from pathlib import Path

from rich.markup import escape

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


def add_compare(sub) -> None:
    """compare two sets of rows"""
    compare = sub.add_parser(
        "compare", help="compare two sets of rows; exit 1 on any change beyond the tolerance"
    )
    compare.add_argument("base", type=Path)
    compare.add_argument("new", type=Path)
    compare.add_argument(
        "--tolerance", type=float, default=0.5, help="allowed change, in metric units"
    )
    compare.add_argument(
        "--tolerances",
        type=Path,
        help="per-metric tolerances (TOML; default: BASE/tolerances.toml when BASE has one)",
    )
    compare.add_argument(
        "--one-sided", action="store_true", help="tolerate gains: fail on drops only"
    )
    compare.add_argument(
        "--allow-new",
        action="store_true",
        help="accept a BASE with no rows, or none in common with NEW (a baseline being "
        "started); without it such a gate fails, since it would compare nothing",
    )
    compare.add_argument(
        "--paired",
        action="store_true",
        help="judge each change by a paired test on the same images (needs both sides' "
        "per-image outputs: --save-predictions): fail only where it is significant",
    )
    compare.add_argument(
        "--level", type=float, default=0.05, help="--paired: the significance level (Holm)"
    )
    compare.add_argument(
        "--detect",
        type=float,
        metavar="D",
        help="--paired: exit 1 when some tested metric's minimum detectable effect (80%% "
        "power at its Holm level) exceeds D points: a gate too blind to see a D-point drop",
    )
    compare.add_argument(
        "--equivalent",
        type=float,
        metavar="MARGIN",
        help="is NEW a drop-in for BASE? a paired equivalence test (TOST, 5%% each side) per "
        "metric at ±MARGIN points, on both sides' per-image outputs; exit 1 unless every "
        "metric is shown equivalent",
    )
    compare.add_argument(
        "--junit",
        type=Path,
        metavar="FILE",
        help="also write a JUnit XML report: one test case per metric",
    )
    compare.add_argument(
        "--format",
        choices=("table", "github"),
        default="table",
        help="github: print GitHub Actions ::error annotations after the table",
    )
    compare.add_argument(
        "--update-baselines",
        action="store_true",
        help="replace BASE (a folder of rows) with NEW's rows after showing the comparison",
    )
    compare.add_argument(
        "--fail-on-regression",
        action="store_true",
        default=True,
        help="exit 1 when a metric regressed or is missing (the default)",
    )
    compare.add_argument(
        "--no-fail",
        dest="fail_on_regression",
        action="store_false",
        help="report only; always exit 0",
    )


def add_errors_command(sub) -> None:
    errors = sub.add_parser(
        "errors", help="a run's most confused classes and worst images (--save-predictions)"
    )
    errors.add_argument("run_dir", type=Path, help="the --out folder of the run")
    errors.add_argument("--task", required=True)
    errors.add_argument("--backbone", help="only this backbone's predictions")
    errors.add_argument("--top", type=int, default=10, help="rows per table (default 10)")


def cmd_table(args, console) -> int:
    from evalkit.core.results import load_rows, pivot_table

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

    from evalkit.core.results import aggregate

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

    from evalkit.core.results import INTERVALS

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

    from evalkit.core.results import dataset_label, number

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


def cmd_compare(args, console) -> int:
    from rich.table import Table

    from evalkit.core.results import (
        FAILING,
        Tolerances,
        compare,
        github_annotations,
        junit_xml,
        load_rows,
    )

    for path in (args.base, args.new):
        if not path.exists():
            raise EvalkitError(f"no such rows file or folder: {path}")
    given = args.tolerances or args.base / "tolerances.toml"
    if args.tolerances and not given.is_file():
        raise EvalkitError(f"no tolerances file {given}")
    tolerance = Tolerances.read(given, args.tolerance) if given.is_file() else args.tolerance
    base, new = load_rows([args.base]), load_rows([args.new])
    records = compare(base, new, tolerance=tolerance, one_sided=args.one_sided)
    if not args.allow_new and not args.update_baselines:
        refuse_empty_gate(records, args)
    if args.detect is not None and not args.paired:
        raise EvalkitError("--detect sizes the paired tests' sight: add --paired")
    if args.paired or args.equivalent is not None:
        records = judged_paired(records, args)
    if args.equivalent is not None:
        records = [with_equivalence(rec, args.equivalent) for rec in records]
    table = Table()
    for column in ("task", "data", "backbone"):
        table.add_column(column, overflow="fold")  # names are folded, never cut
    for column in ("metric", "base", "new", "delta", "status"):
        table.add_column(column, no_wrap=True)  # short: kept whole
    table.add_column("seeds", overflow="fold")
    if args.paired:
        table.add_column("paired test (tolerance)", overflow="fold")
    if args.equivalent is not None:
        table.add_column(f"equivalence (±{args.equivalent:g})", overflow="fold")
    colours = {"regression": "red", "missing": "red", "changed-up": "red", "improved": "green"}

    def fmt(v):
        return "–" if v is None else f"{v:.2f}"

    for rec in records:
        status = rec["status"]
        table.add_row(
            escape(rec["task"]),  # labels are text: "fake [img_size=64]" is no markup
            escape(rec["dataset"]),
            escape(rec["backbone"]),
            escape(rec["metric"]),
            fmt(rec["base"]),
            fmt(rec["new"]),
            "–" if rec["delta"] is None else f"{rec['delta']:+.2f}",
            f"[{colours.get(status, 'white')}]{status}[/]",
            escape(rec["seeds"]),
            *([paired_cell(rec)] if args.paired else []),
            *([escape(rec["equivalence"])] if args.equivalent is not None else []),
        )
    console.print(table)
    if args.junit:
        write_report(args.junit, junit_xml(records))
    if args.format == "github":
        print(github_annotations(records), end="")
    if args.update_baselines:
        update_baselines(args.base, args.new)
        console.print(f"baselines in {args.base} replaced by the rows of {args.new}")
        return 0
    bad = [r for r in records if r["status"] in FAILING]
    if args.equivalent is not None:
        bad = [  # a metric only NEW has is no change from BASE: nothing to hold equal
            r
            for r in records
            if r.get("equivalence", "").startswith("not shown") and r["status"] != "new"
        ]
        console.print(
            f"{len(bad)} metric(s) not shown equivalent within ±{args.equivalent:g}"
            if bad
            else f"every metric equivalent within ±{args.equivalent:g}",
            highlight=False,
        )
        return 1 if bad and args.fail_on_regression else 0
    console.print(verdict(records, args.one_sided), highlight=False)
    if args.paired:
        bad += blind_spot(records, args.detect, console)
    old = unrecorded(base)
    if old and unrecorded(new) < len(new) and any(r["status"] == "missing" for r in records):
        console.print(
            f"note: {old} baseline row(s) do not record the data they were computed on (an "
            "older evalkit wrote them), so no new row can match them: check the new rows, then "
            "refresh the baselines with --update-baselines",
            highlight=False,
            soft_wrap=True,
        )
    return 1 if bad and args.fail_on_regression else 0


def refuse_empty_gate(records: list[dict], args):
    """A gate that compares nothing passes anything: refuse an empty baseline, and one that
    shares no (task, setup, data, metric) with the new rows."""
    if not any(r["base"] is not None for r in records):
        raise EvalkitError(
            f"the baseline {args.base} holds no result rows, so nothing would be compared: "
            "point BASE at the baseline rows, or pass --allow-new to start one deliberately"
        )
    if not any(r["base"] is not None and r["new"] is not None for r in records):
        raise EvalkitError(
            f"no row of {args.new} matches a row of the baseline {args.base} (same task, "
            "backbone setup, settings, data and metric), so nothing would be compared: check "
            "both were run the same way, or pass --allow-new"
        )


def judged_paired(records: list[dict], args) -> list[dict]:
    from evalkit.core.results import on_shared_seeds
    from evalkit.publish.leaderboard import folder_rows, paired_compare

    if not 0 < args.level < 1:
        raise EvalkitError(f"--level {args.level}: expected a probability between 0 and 1")
    for given in (args.base, args.new):
        folder = given if given.is_dir() else given.parent  # a rows file's outputs sit beside it
        if not any(folder.rglob("predictions/*.parquet")):
            raise EvalkitError(
                f"{folder} holds no per-image outputs, so no change can be paired: rerun its "
                "jobs with evalkit run ... --save-predictions, or compare without --paired"
            )
    base, new, _ = on_shared_seeds(folder_rows([args.base]), folder_rows([args.new]))
    return paired_compare(records, base, new, level=args.level, one_sided=args.one_sided)


def paired_cell(record: dict) -> str:
    """What the paired test found (and, for accuracies, the images that flipped), what it
    could have found (its MDE), and the tolerance's own verdict beside it."""
    from evalkit.power import sight

    tolerance = f" (tolerance: {record.get('tolerance_status', record['status'])})"
    flips = record.get("flips")
    moved = (
        flips and f"; {flips['right_to_wrong']} right→wrong, {flips['wrong_to_right']} wrong→right"
    )
    if "p_holm" in record:
        seen = sight(record["mde"], record["level_holm"])
        return f"p = {record['p_holm']:.3g}, Holm{moved if flips else ''}; {seen}{tolerance}"
    return escape(record.get("paired", "–")) + tolerance


def blind_spot(records: list[dict], detect: float | None, console) -> list[dict]:
    """Print the smallest regression each tested metric could catch (``mde``: 80% power at
    its Holm level) — a green gate says nothing of a drop below it — and return the metrics
    whose MDE exceeds ``detect`` points (or cannot be sized): a gate too blind to pass."""
    from evalkit.power import points

    tested = [r for r in records if "mde" in r]
    if not tested:
        return []
    sized = sorted((r for r in tested if r["mde"] is not None), key=lambda r: r["mde"])
    if sized:
        sharp, blunt = sized[0], sized[-1]
        console.print(
            f"blind spot: of {len(tested)} tested metric(s), the smallest regression caught 80% "
            f"of the time is {points(sharp['mde'])} points ({_named(sharp)}), the largest "
            f"{points(blunt['mde'])} ({_named(blunt)}); an accuracy's at the larger of the "
            "observed churn and that of unrelated mistakes",
            highlight=False,
            markup=False,  # labels hold brackets: "fake [dim=16]"
            soft_wrap=True,
        )
    blind = [r for r in tested if detect is not None and (r["mde"] is None or r["mde"] > detect)]
    for record in blind:
        found = "unknown" if record["mde"] is None else points(record["mde"])
        console.print(
            f"cannot see a {detect:g}-point drop on {record['test'].images} images: its MDE is "
            f"{found} ({_named(record)})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    return blind


def _named(record: dict) -> str:
    return f"{record['task']} {record['metric']}, {record['backbone']}"


def with_equivalence(record: dict, margin: float) -> dict:
    """The record with its equivalence verdict at ±``margin`` (TOST on the paired outputs)."""
    from evalkit.significance import Paired, equivalence

    if margin <= 0:
        raise EvalkitError(f"--equivalent {margin}: expected a margin above 0, in metric points")
    test = record.get("test")
    if record["base"] is None or record["new"] is None:
        found = f"not shown equivalent: {record['status']}"
    elif not isinstance(test, Paired) or test.interval90 is None:
        found = f"not shown equivalent: untested ({test or 'no per-image outputs'})"
    else:
        low, high = test.interval90
        found = equivalence(test, margin, record["higher_is_better"])
        found += f" (90% interval of new − base: [{low:+.3g}, {high:+.3g}]); {shown_at(test)}"
    return record | {"equivalence": found}


def shown_at(test) -> str:
    """The smallest margin this equivalence test shows 80% of the time when nothing truly
    changed: the equivalence verdict's own minimum detectable effect."""
    from evalkit.power import equivalence_margin, points

    margin = equivalence_margin(test)
    if margin is None:
        return "smallest margin it can show unknown (no spread between the two sides)"
    return f"shows ±{points(margin)} 80% of the time when nothing changed"


def verdict(records: list[dict], one_sided: bool) -> str:
    """One line: how many metrics moved beyond their tolerances, how many are missing."""
    moved = sum(r["status"] in ("regression", "changed-up") for r in records)
    missing = sum(r["status"] == "missing" for r in records)
    parts = (
        [
            f"{moved} change(s) beyond their tolerances (up or down"
            f"{'; gains tolerated' if one_sided else ''})"
        ]
        if moved
        else []
    )
    parts += [f"{missing} baseline row(s) missing from the new rows"] if missing else []
    return "; ".join(parts) or "no changes beyond tolerance"


def unrecorded(rows: list[dict]) -> int:
    """Rows that do not say what data they were computed on (stand-in or real)."""
    return sum(not isinstance(row.get("dataset"), dict) for row in rows)


def write_report(path: Path, text: str):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise EvalkitError(f"cannot write the report {path}: {exc.strerror}") from None


def update_baselines(base: Path, new: Path):
    """BASE (a folder of rows files) becomes a copy of NEW's rows files: the one way baselines
    change, asked for by name."""
    import shutil

    if not base.is_dir():
        raise EvalkitError(f"--update-baselines needs BASE to be a folder of rows, got {base}")
    for old in base.rglob("*.jsonl"):  # rows only: BASE/tolerances.toml stays
        old.unlink()
    if not new.is_dir():
        shutil.copyfile(new, base / new.name)
        return
    for source in sorted(new.rglob("*.jsonl")):
        target = base / source.relative_to(new)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def cmd_errors(args, console) -> int:
    import pandas as pd
    from rich.table import Table

    outputs = named_outputs(args.run_dir, args.task)
    if args.backbone:  # a backbone (every setup of it) or one setup as the views print it
        outputs = [o for o in outputs if args.backbone in (o[1], o[2])]
    if not outputs:
        raise EvalkitError(no_outputs_message(args, named_outputs(args.run_dir, args.task)))
    for heading, _, _, path in outputs:
        frame = pd.read_parquet(path)
        tables = [(title, rows) for title, rows in error_tables(frame, args.top) if len(rows)]
        if not tables:
            console.print(
                f"{escape(heading)}: {len(frame)} images, nothing to show (no mistakes)",
                highlight=False,
            )
            continue
        console.print(f"[bold]{escape(heading)}[/bold]: {len(frame)} images", highlight=False)
        for title, rows in tables:
            table = Table(title=title)
            for column in rows.columns:  # folded, never cut: a path is only useful whole
                table.add_column(column, overflow="fold")
            for values in rows.itertuples(index=False):
                table.add_row(
                    *(escape(f"{v:.3f}" if isinstance(v, float) else str(v)) for v in values)
                )
            console.print(table)
    return 0


def named_outputs(run_dir: Path, task: str) -> list[tuple[str, str, str, Path]]:
    """(heading, backbone, setup label, file) of each per-image file of ``task`` under
    ``run_dir``, headed as the other views name the cell (``fake [dim=64] (random init) on
    imagenet (stand-in), seed 0``); a file no row speaks for keeps its own name."""
    from evalkit.core.results import (
        dataset_label,
        load_rows,
        predictions_file,
        rows_file,
        run_spec,
        spec_labels,
    )

    slug = task.replace("/", "_")
    files = sorted((run_dir / "predictions").glob(f"{slug}--*.parquet"))
    every = load_rows([run_dir]) if rows_file(run_dir, task).is_file() else []
    labels = spec_labels(every)  # chosen over the whole folder, as the table chooses them
    by_name = {
        predictions_file(
            run_dir, row["task"], row["backbone"], row.get("seed", 0), row.get("run_key")
        ).name: row
        for row in every
    }
    found = []
    for path in files:
        row = by_name.get(path.name)
        if row is None:
            found.append((path.name, "", "", path))
            continue
        label = labels[run_spec(row)]
        heading = f"{label} on {dataset_label(row)}, seed {row.get('seed', 0)}"
        found.append((heading, row["backbone"], label, path))
    return found


def no_outputs_message(args, every: list) -> str:
    if not every:
        return (
            f"no predictions of {args.task} under {args.run_dir}/predictions: rerun it with "
            "evalkit run ... --save-predictions"
        )
    setups = sorted({label for _, _, label, _ in every if label})
    return (
        f"no predictions of {args.task} by {args.backbone!r} under {args.run_dir}: expected a "
        f"backbone or one of the setups {', '.join(map(repr, setups))}"
    )


def error_tables(frame, top: int):
    """(title, DataFrame) pairs of what a task got most wrong, by what its per-image outputs
    hold: dense tasks their images of lowest mIoU or highest depth error; model-vs-human its
    confused categories and weakest sets; few-shot the images most seeds missed; fairness the
    subgroups and images of lowest expected accuracy; classification (probes, kNN, zero-shot,
    video, calibration) its confused classes and most confident mistakes."""
    from evalkit.metrics import DEPTH_METRICS

    if "miou" in frame:
        return [
            ("images of lowest mIoU", frame.nsmallest(top, "miou")[["image", "miou", "pixel_acc"]])
        ]
    if depth := [m for m in DEPTH_METRICS if m in frame]:
        return [(f"images of highest {depth[0]}", frame.nlargest(top, depth[0])[["image", *depth]])]
    if {"category", "decision"} <= set(frame.columns):
        return human_alignment_tables(frame, top)
    if "correct_share" in frame:
        return few_shot_tables(frame, top)
    if {"group", "score", "accuracy"} <= set(frame.columns):
        return fairness_tables(frame, top)
    return classification_tables(frame, top)


def human_alignment_tables(frame, top: int):
    wrong = frame[~frame["correct"]]
    pairs = wrong.groupby(["category", "decision"]).size().rename("images")
    sets = frame.groupby("set")["correct"].mean().rename("accuracy").nsmallest(top).reset_index()
    return [
        ("most confused categories", pairs.nlargest(top).reset_index()),
        ("sets of lowest accuracy", sets),
    ]


def few_shot_tables(frame, top: int):
    label = "label_name" if "label_name" in frame else "label"  # older files: class numbers
    missed = frame.nsmallest(top, "correct_share")[["image", label, "correct_share"]]
    classes = frame.groupby(label)["correct_share"].mean().nsmallest(top).reset_index()
    return [("images most draws got wrong", missed), ("classes of lowest share right", classes)]


def fairness_tables(frame, top: int):
    groups = frame.groupby(["group", "target"])["accuracy"].mean().rename("expected accuracy")
    worst = frame.nsmallest(top, "accuracy")[["image", "group", "target", "score", "accuracy"]]
    return [
        ("subgroups of lowest expected accuracy", groups.nsmallest(top).reset_index()),
        ("images of lowest expected accuracy", worst),
    ]


def classification_tables(frame, top: int):
    label_names = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    if "prediction_name" in frame:  # predictions and labels named in the space scored
        predicted = frame["prediction_name"]
    else:  # files without names (calibration; files written before they had names)
        names = dict(zip(frame["label"], label_names, strict=False))
        predicted = [names.get(p, str(p)) for p in frame["prediction"]]
    frame = frame.assign(label_name=list(label_names), predicted=list(predicted))
    wrong = frame[~frame["correct"]]
    pairs = (
        wrong.groupby(["label_name", "predicted"])
        .size()
        .rename("images")
        .nlargest(top)
        .reset_index()
    )
    columns = ["image", "label_name", "predicted"]
    if "top5_probabilities" in frame:
        wrong = wrong.assign(probability=[p[0] for p in wrong["top5_probabilities"]])
        kind = frame["score_kind"].iloc[0] if len(frame) else "probability"
        title, score = f"most confident mistakes (probability: {kind})", "probability"
    elif "confidence" in frame:
        title, score = "most confident mistakes (softmax confidence)", "confidence"
    else:  # files written before predictions carried probabilities: the task's raw score
        wrong = wrong.assign(top_score=[s[0] for s in wrong["top5_scores"]])
        title = "highest-scored mistakes (top_score: the task's raw score, not a probability)"
        score = "top_score"
    return [
        ("most confused classes", pairs),
        (title, wrong.nlargest(top, score)[[*columns, score]]),
    ]


def add_merge(sub) -> None:
    merge = sub.add_parser(
        "merge",
        help="bring result folders from several machines (a zoo's shards) into one; refuse "
        "rows that conflict; list the cells still missing",
    )
    merge.add_argument("out", type=Path, help="the folder to merge into (made if missing)")
    merge.add_argument("sources", nargs="+", type=Path, help="result folders (evalkit run's --out)")
    merge.add_argument(
        "--allow-missing",
        action="store_true",
        help="exit 0 even when cells are missing (a study merged part by part); they are "
        "still listed and written to missing-cells.json",
    )


def cmd_merge(args, console) -> int:
    from evalkit.core.merge import MISSING, merge

    if any(source.resolve() == args.out.resolve() for source in args.sources):
        raise EvalkitError(f"{args.out} is both the target and a source: merge into another folder")
    merged = merge(args.out, args.sources)
    console.print(
        f"merged into {args.out}: {merged.rows} row(s), {merged.outputs} per-image file(s), "
        f"{merged.failed} failed-cell record(s) new",
        highlight=False,
    )
    for cell in merged.missing:
        console.print(missing_line(cell), highlight=False, markup=False, soft_wrap=True)
    if merged.missing:
        console.print(
            f"{len(merged.missing)} cell(s) missing: {args.out / MISSING}"
            + ("" if args.allow_missing else " (--allow-missing accepts a partial merge)"),
            highlight=False,
        )
    return 1 if merged.missing and not args.allow_missing else 0


def missing_line(cell: dict) -> str:
    """One line per missing cell: a study's cell no merged share delivered (named by its
    share), or a task some setup ran and this one did not."""
    if "study" in cell:
        options = ", ".join(f"{k}={v}" for k, v in sorted((cell["options"] or {}).items()))
        weights = [f"weights {Path(cell['weights']).name}"] if cell.get("weights") else []
        setup = ", ".join([options, *weights] if options else weights)
        backbone = cell["backbone"] + (f" [{setup}]" if setup else "")
        return f"missing: {cell['task']} × {backbone} (seed {cell['seed']}): {cell['why']}"
    return f"missing: {cell['task']} · {cell['dataset']} × {cell['backbone']} (not run)"


def add_export(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write result rows where other tools read them: Every Eval Ever records (eee) "
        "or MTEB's results layout (mteb)",
    )
    export.add_argument("results", type=Path, help="a folder of rows (evalkit run's --out)")
    export.add_argument("--format", required=True, choices=("eee", "mteb"))
    export.add_argument("--out", type=Path, required=True, help="the folder to write into")
    export.add_argument(
        "--organization",
        default="unknown",
        help="eee: who ran the evaluation (source_organization_name)",
    )


def cmd_export(args, console) -> int:
    from evalkit.publish.export import export

    written = export(args.results, args.out, args.format, organization=args.organization)
    console.print(f"{len(written)} file(s) under {args.out} ({args.format})", highlight=False)
    return 0
