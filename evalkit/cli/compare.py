"""``evalkit compare``: the regression gate between two sets of rows (docs/regression.md):
changes beyond tolerance, the paired test each task declares (``--paired``), equivalence
(``--equivalent``), the smallest regression it could catch (``--detect``), and baselines
updated on request."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from evalkit.errors import EvalkitError


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


def cmd_compare(args, console) -> int:
    from rich.table import Table

    from evalkit.core.gate import FAILING, Tolerances, compare, github_annotations, junit_xml
    from evalkit.core.results import load_rows

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
    from evalkit.core.gate import on_shared_seeds
    from evalkit.publish.board_pairs import paired_compare
    from evalkit.publish.board_reading import folder_rows

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
