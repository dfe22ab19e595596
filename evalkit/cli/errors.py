"""``evalkit errors``: the eval items a setup got wrong, from its per-image outputs, as the
tables its task declares (``evalkit.protocols.error_tables``): classification, few-shot,
fairness, model-vs-human, segmentation, depth."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from evalkit.errors import EvalkitError


def add_errors_command(sub) -> None:
    errors = sub.add_parser(
        "errors", help="a run's most confused classes and worst images (--save-predictions)"
    )
    errors.add_argument("run_dir", type=Path, help="the --out folder of the run")
    errors.add_argument("--task", required=True)
    errors.add_argument("--backbone", help="only this backbone's predictions")
    errors.add_argument("--top", type=int, default=10, help="rows per table (default 10)")


def cmd_errors(args, console) -> int:
    import pandas as pd
    from rich.table import Table

    outputs = named_outputs(args.run_dir, args.task)
    if args.backbone:  # a backbone (every setup of it) or one setup as the views print it
        outputs = [o for o in outputs if args.backbone in (o[1], o[2])]
    if not outputs:
        raise EvalkitError(no_outputs_message(args, named_outputs(args.run_dir, args.task)))
    tables_of = declared_tables(args.task)
    for heading, _, _, path in outputs:
        frame = pd.read_parquet(path)
        tables = [(title, rows) for title, rows in tables_of(frame, args.top) if len(rows)]
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
    from evalkit.core.labels import dataset_label, repeat_key, repeat_labels
    from evalkit.core.results import load_rows, predictions_file, rows_file

    slug = task.replace("/", "_")
    files = sorted((run_dir / "predictions").glob(f"{slug}--*.parquet"))
    every = load_rows([run_dir]) if rows_file(run_dir, task).is_file() else []
    labels = repeat_labels(every)  # chosen over the whole folder, as the table chooses them
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
        label = labels[repeat_key(row)]
        heading = f"{label} on {dataset_label(row)}, seed {row.get('seed', 0)}"
        found.append((heading, row["backbone"], label, path))
    from evalkit.core.tables import natural_order

    # by heading, numbers read as numbers: the file names' run keys would order them by hash
    return sorted(found, key=lambda item: natural_order(item[0]))


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


def declared_tables(task: str):
    """The tables ``task`` declares for its per-image outputs, read without importing a
    built-in task; for a task declaring none (a plugin), the tables its outputs' columns
    suggest (``error_tables.by_columns``)."""
    from evalkit.core.catalog import declared_by
    from evalkit.protocols.error_tables import DECLARED, by_columns

    return declared_by(task, DECLARED, "error_tables", by_columns)
