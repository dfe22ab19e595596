"""``evalkit merge``: the shards of a study gathered into one results folder, with every cell
not delivered listed (docs/cluster.md)."""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError


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
