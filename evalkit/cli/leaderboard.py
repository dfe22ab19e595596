"""``evalkit leaderboard RESULTS``: ranks, intervals and paired tests of a zoo's rows, as a
terminal table, Markdown, JSON or one self-contained HTML page with a ranks figure."""

from __future__ import annotations

from pathlib import Path

FORMATS = ("terminal", "markdown", "json", "html")


def add_leaderboard(sub) -> None:
    board = sub.add_parser(
        "leaderboard",
        help="rank backbones per task and over a suite, with paired tests between every two",
    )
    board.add_argument("results", nargs="+", type=Path, help="rows folders or files")
    board.add_argument(
        "--format",
        choices=FORMATS,
        help="of standard output (default: terminal), or of an --output whose suffix names no "
        "format",
    )
    board.add_argument(
        "--output",
        type=Path,
        action="append",
        help="write here (default: standard output), in the format its suffix names (.md, "
        ".json, .html); repeat it to write several formats from one computation",
    )
    board.add_argument(
        "--level", type=float, default=0.05, help="significance level after Holm's correction"
    )
    board.add_argument("--seed", type=int, default=0, help="of the paired bootstrap's resamples")
    board.add_argument(
        "--cd",
        choices=("wilcoxon-holm", "nemenyi"),
        default="wilcoxon-holm",
        help="the test across tasks behind the tiers and the critical-difference diagram: "
        "Wilcoxon signed-rank on per-task ranks with Holm (default), or Nemenyi's critical "
        "difference of mean ranks (Demšar 2006)",
    )
    board.add_argument(
        "--allow-mixed",
        action="store_true",
        help="rank cells of one task measured differently (another task version, settings or "
        "data files) together; refused by default",
    )
    board.add_argument(
        "--explore",
        type=Path,
        metavar="DIR",
        help="also write the site of the images behind the pairs (evalkit explore) into DIR, "
        "linked from the HTML page",
    )
    board.add_argument(
        "--snapshot",
        type=Path,
        metavar="DIR",
        help="also keep a dated, self-contained copy (HTML and JSON) under DIR, and an index "
        "page of every snapshot there",
    )


def cmd_leaderboard(args, console) -> int:
    from evalkit.core.results import file_rows, rows_files
    from evalkit.errors import EvalkitError

    if not 0 < args.level < 1:
        raise EvalkitError(f"--level {args.level}: expected a probability between 0 and 1")
    if not any(file_rows(file) for file in rows_files(args.results)):  # before the heavy imports
        raise EvalkitError(
            f"no result rows under {', '.join(map(str, args.results))} (expected *.jsonl "
            "from evalkit run)"
        )
    from evalkit.publish.leaderboard import leaderboard
    from evalkit.publish.rendering import FORMATTERS, snapshot

    outputs = output_formats(args.output or [], args.format)  # a bad suffix fails first
    board = leaderboard(
        args.results, level=args.level, seed=args.seed, mixed=args.allow_mixed, cd=args.cd
    )
    if args.snapshot is not None:  # a dated copy stands alone: no link out of its folder
        kept = snapshot(board, args.snapshot)
        console.print(f"snapshot: {kept} (index: {args.snapshot / 'index.html'})", highlight=False)
    if args.explore is not None:
        board["explore"] = explored(args, outputs, console)
    if not outputs and args.format in (None, "terminal"):
        print_terminal(console, board)
    elif not outputs:
        print(FORMATTERS[args.format](board))
    for path, kind in outputs:
        write_board(console, board, path, kind)
    return 0


SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".json": "json", ".html": "html"}


def output_formats(paths: list[Path], asked: str | None) -> list[tuple[Path, str]]:
    """Each ``--output`` with the format it is written in: the one its suffix names, so that
    ``one.json`` never holds Markdown. ``--format`` names it only for a single output whose
    suffix names none, and is refused where it contradicts the suffix."""
    if len(paths) == 1 and asked not in (None, "terminal"):
        return [(paths[0], single_format(paths[0], asked))]
    unknown = [str(path) for path in paths if path.suffix.lower() not in SUFFIXES]
    if unknown:
        from evalkit.errors import EvalkitError

        raise EvalkitError(
            f"--output {', '.join(unknown)}: the format is named by the suffix; expected one "
            f"of {', '.join(SUFFIXES)} (or --format with a single --output)"
        )
    return [(path, SUFFIXES[path.suffix.lower()]) for path in paths]


def single_format(path: Path, asked: str) -> str:
    from evalkit.errors import EvalkitError

    named = SUFFIXES.get(path.suffix.lower())
    if named is not None and named != asked:
        raise EvalkitError(f"--output {path} names {named} but --format asks for {asked}")
    return asked


def write_board(console, board: dict, path: Path, kind: str):
    """The board written to ``path`` in format ``kind`` (an HTML page with its critical-
    difference diagram beside it as PNG)."""
    from evalkit.publish.rendering import FORMATTERS
    from evalkit.storage.writes import replacing

    with replacing(path) as tmp:
        tmp.write_text(FORMATTERS[kind](board), encoding="utf-8")
    console.print(f"leaderboard: {path}", highlight=False)
    if kind == "html" and board.get("across_tasks"):
        from evalkit.plots import critical_difference_plot

        across = board["across_tasks"]
        picture = path.with_suffix(".cd.png")
        critical_difference_plot(across["mean_ranks"], across["cliques"], picture)
        console.print(f"critical-difference diagram: {picture}", highlight=False)


def print_terminal(console, board: dict):
    from rich.markup import escape as plain  # labels such as "timm/x [pool=mean]" are text
    from rich.table import Table

    from evalkit.publish.rendering import (
        OVERALL_HEADER,
        notes,
        overall_rows,
        point,
        task_header,
        task_rows,
    )

    for task in board["tasks"]:
        table = Table(*task_header(task), title=plain(task["task"]))
        for row in task_rows(task):
            table.add_row(*map(plain, row))
        console.print(table)
        for pair in task["pairs"]:
            line = f"  {pair['a']} vs {pair['b']}: {pair['verdict']}"
            console.print(plain(line), highlight=False, soft_wrap=True)
    table = Table(*OVERALL_HEADER, title="over all tasks")
    for row in overall_rows(board):
        table.add_row(*map(plain, row))
    console.print(table)
    for task, lines in board["curves"].items():
        levels = sorted({level for by in lines.values() for level in by})
        table = Table("backbone", *(f"ε={lv:g}" for lv in levels), title=plain(f"{task}: accuracy"))
        bands = board.get("curve_intervals", {}).get(task, {})
        for backbone, by in lines.items():
            band = bands.get(backbone, {})
            table.add_row(plain(backbone), *(point(by.get(lv), band.get(lv)) for lv in levels))
        console.print(table)
    for note in notes(board):
        console.print(plain(note), highlight=False, soft_wrap=True)


def explored(args, outputs: list, console) -> str:
    """The images' site written into ``--explore``; the link to it from the HTML page (relative
    to the first HTML output, so the two can be published together)."""
    import os

    from evalkit.publish.explore import write_site

    index = write_site(list(args.results), args.explore)
    console.print(f"images: {index}", highlight=False)
    pages = [path for path, kind in outputs if kind == "html"]
    start = pages[0].parent if pages else Path.cwd()
    return Path(os.path.relpath(index.resolve(), start.resolve())).as_posix()
