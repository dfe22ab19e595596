"""``evalkit explore``: a static site of the images behind a folder's numbers — per task and
pair of setups the images that flipped each way, each setup's surest mistakes and most
confused classes — written under ``--out`` to open from disk (``evalkit.publish.explore``;
docs/results.md, "Looking at the images")."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from evalkit.errors import EvalkitError


def add_explore(sub) -> None:
    explore = sub.add_parser(
        "explore",
        help="a static HTML site of the images each pair of setups disagrees on, and each "
        "setup's mistakes (--save-predictions outputs)",
    )
    explore.add_argument("results", type=Path, help="rows with --save-predictions outputs")
    explore.add_argument("--task", help="only this task (default: every task with outputs)")
    explore.add_argument("--a", help="setup A as the views label it (with --b)")
    explore.add_argument(
        "--b", help="setup B (default: every pair of up to 4 setups, else the top two)"
    )
    explore.add_argument(
        "--data-root",
        type=Path,
        help="where the images of relative ids lie, when the rows do not record it",
    )
    explore.add_argument("--out", type=Path, required=True, help="the site's folder")


def cmd_explore(args, console) -> int:
    from evalkit.publish.explore import write_site

    if (args.a is None) != (args.b is None):
        raise EvalkitError("--a and --b name a pair: give both, or neither")
    index = write_site(
        [args.results], args.out, task=args.task, pair=(args.a, args.b), data_root=args.data_root
    )
    console.print(f"wrote {escape(str(index))} (open it in a browser; nothing is fetched)")
    return 0
