"""``evalkit errors``: the eval items a setup got wrong, from its per-image outputs, as tables
per family (classification, few-shot, fairness, model-vs-human, depth)."""

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
    from evalkit.core.labels import dataset_label, run_spec, spec_labels
    from evalkit.core.results import load_rows, predictions_file, rows_file

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
