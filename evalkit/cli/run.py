"""``evalkit run``: tasks on backbones, result rows written; its parser and handler."""

from __future__ import annotations

import os
from pathlib import Path

from evalkit.core.run_options import add_run_arguments, run_spec
from evalkit.errors import EvalkitError


def add_run(sub) -> None:
    run = sub.add_parser("run", help="run tasks on backbones and write result rows")
    add_run_arguments(run)


def log_run_args(log: list[str]) -> tuple[str, ...]:
    """``--log`` values as options of each job's ``evalkit run`` (checked here, before any job)."""
    from evalkit.tracking import LogTarget

    for value in log:
        LogTarget.parse(value)
    return tuple(arg for value in log for arg in ("--log", value))


def cmd_run(args, console) -> int:
    from evalkit.core.preflight import check_run_args

    check_run_args(args)  # a typo is refused before torch and timm are imported
    from evalkit.core import runner
    from evalkit.core.catalog import alias_note

    specs = zoo_specs(run_spec(args), args.zoo) if args.zoo else [run_spec(args)]
    if not is_main_process():
        console = quiet_console()
    specs = shared_out(specs, args, console)
    if not specs:
        return 0
    for name in specs[0].tasks:
        if note := alias_note(name):
            console.print(f"[yellow]note:[/] {note}")

    def show_data(line: str):
        console.print(f"data: {line}", highlight=False, soft_wrap=True)

    total, results = sum(cell_count(spec) for spec in specs), []
    for spec in specs:
        jobs = runner.run(
            spec, on_backbone=lambda b: warn_random_init(b, console), on_data=show_data
        )
        for job in jobs:
            results.append((job, spec))
            if total > 1:
                line = cell_line(job, len(results), total, spec)
                console.print(line, highlight=False, soft_wrap=True, markup=False)
    print_rows(console, results)
    console.print(f"rows: {specs[0].out}/")
    return report_failures(console, results, specs[0].out)


def cell_count(spec) -> int:
    if spec.cells is not None:
        return len(spec.cells)
    return max(len(spec.backbones), 1) * len(spec.tasks) * len(spec.seeds)


def shared_out(specs: list, args, console) -> list:
    """The specs cut to this process's share of the cells (``--shard``, or a Slurm array
    task's or Kubernetes Indexed Job pod's index), with one line saying what it runs. A
    command of one cell is never split (evalkit sweep's array tasks each run one)."""
    from evalkit.core import cells

    if args.shard is None and sum(map(cell_count, specs)) < 2:
        return specs  # (an array task of evalkit sweep: its own index says nothing here)
    shard = cells.shard_asked(args.shard, dict(os.environ))
    if shard is None:
        return specs
    kept, counts, record = cells.share(specs, shard)
    if is_main_process():
        keep_study_record(record, specs[0].out)
    console.print(
        f"shard {shard[0]}/{shard[1]}: {counts['mine']} cell(s) to run of its "
        f"{counts['share']} ({counts['cells']} in all; the others are another shard's, or done)",
        highlight=False,
    )
    return kept


def keep_study_record(record: dict, out: Path):
    """The share's record of its study (``cells.study_record``) under ``<out>/shares/``,
    for ``evalkit merge`` to account for every cell."""
    from evalkit.storage.identity import write_json

    # written whole or not at all, its folder made, a full disk one line (storage.writes)
    write_json(
        out / "shares" / f"{record['study']}-{record['share']}-of-{record['of']}.json", record
    )


def cell_line(job, index: int, total: int, spec) -> str:
    """One line per finished cell of a zoo: its place, what it is (the backbone's setup, named
    as tables name it: its options and weights, which tell two entries of a zoo file apart)
    and how it ended."""
    why = f": {job.error or job.note}" if job.error or job.note else ""
    return f"[{index}/{total}] {cell_name(job, spec)}: {job.status}{why}"


def cell_name(job, spec) -> str:
    """``task × setup (seed N)``: the backbone named as tables name its setup, with its
    options and weights, so two entries of a zoo file are told apart in every line."""
    return f"{job.task} × {cell_setup(job, spec)} (seed {job.seed})"


def cell_setup(job, spec) -> str:
    from evalkit.core.labels import setup_label

    parts = [f"{k}={v}" for k, v in sorted(spec.model_args.items())]
    parts += [f"weights {Path(spec.weights).name}"] if spec.weights else []
    return setup_label(job.backbone, parts, not (spec.weights or spec.pretrained))


def print_rows(console, results):
    from rich.markup import escape
    from rich.table import Table

    cells = [
        summary_cells(row, cell_setup(job, spec), skipped=job.skipped)
        for job, spec in results
        for row in job.rows
    ]
    noted = any(line[-1] for line in cells)  # a note column only when a row has a note
    table = Table("task", "backbone", "metric", "value", "n", *(["note"] if noted else []))
    for line in cells:  # labels are text: "fake [dim=64]" is no markup
        table.add_row(*(escape(cell) for cell in (line if noted else line[:-1])))
    console.print(table)


def report_failures(console, results, out: Path) -> int:
    """The zoo's failed cells, listed at the end (exit status 1 when there are any)."""
    from evalkit.core.results import FAILED

    failed = [(job, spec) for job, spec in results if job.error]
    if not failed:
        return 0
    console.print(
        f"[bold red]{len(failed)} of {len(results)} cells failed[/] (recorded in {out / FAILED}; "
        "a rerun of the same command redoes only these and the ones never run):",
        highlight=False,
        soft_wrap=True,
    )
    for job, spec in failed:
        line = f"  {cell_name(job, spec)}: {job.error}"
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    return 1


def zoo_specs(spec, path: Path) -> list:
    """One spec per backbone of a zoo file, each with its own weights and options."""
    import dataclasses

    from evalkit.backbones.options import parse_model_args

    if spec.backbones:
        raise EvalkitError("--zoo lists the backbones: drop --backbone, or add them to the file")
    return [
        dataclasses.replace(
            spec,
            backbones=(entry["name"],),
            weights=entry.get("weights"),
            pretrained=bool(entry.get("pretrained", False)),
            model_args=parse_model_args(
                [f"{k}={v}" for k, v in entry.get("model_args", {}).items()]
            ),
            zoo=True,
        )
        for entry in read_zoo(path)
    ]


ZOO_KEYS = {"name", "weights", "pretrained", "model_args"}


def read_zoo(path: Path) -> list[dict]:
    """The ``[[backbone]]`` tables of a zoo file, checked: a name each, known keys only."""
    import tomllib

    try:
        entries = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("backbone", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EvalkitError(f"--zoo {path}: cannot read it as TOML ({exc})") from None
    if not entries:
        raise EvalkitError(
            f'--zoo {path}: no backbones (expected [[backbone]] tables with name = "...")'
        )
    for number, entry in enumerate(entries, 1):
        unknown = set(entry) - ZOO_KEYS
        if "name" not in entry or unknown:
            what = f"unknown keys {sorted(unknown)}" if unknown else "no name"
            raise EvalkitError(
                f"--zoo {path}: backbone {number} has {what} (each takes {', '.join(sorted(ZOO_KEYS))})"
            )
        for key, value in entry.items():
            if not isinstance(value, ZOO_TYPES[key][0]):
                raise EvalkitError(
                    f"--zoo {path}: backbone {number} has {key} = {value!r}; expected "
                    f"{ZOO_TYPES[key][1]}"
                )
    return entries


ZOO_TYPES = {
    "name": (str, 'text, e.g. name = "timm/vit_tiny_patch16_224"'),
    "weights": (str, 'a checkpoint path as text, e.g. weights = "ckpt.safetensors"'),
    "pretrained": (bool, "true or false"),
    "model_args": (dict, "a table, e.g. model_args = { img_size = 64 }"),
}


def is_main_process() -> bool:
    """Rank 0 prints (torchrun sets RANK before the process group exists)."""
    return os.environ.get("RANK", "0") == "0"


def quiet_console():
    from rich.console import Console

    return Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the run


def warn_random_init(backbone, console):
    if backbone.info.random_init:
        console.print(
            f"[bold yellow]warning:[/] {backbone.info.name} has random weights (no --weights "
            "given); its numbers say nothing about a trained model"
        )


def summary_cells(row, setup: str, *, skipped: bool) -> list[str]:
    from evalkit.core.tables import number, own_spread

    spread = f" ± {number(own_spread(row))}" if own_spread(row) is not None else ""
    return [
        row["task"],
        setup,
        row["metric"],
        f"{number(row['value'])}{spread}",
        str(row.get("n") or ""),
        "skipped: same task, settings, backbone, weights, data and seed on disk (--rerun recomputes)"
        if skipped
        else "",
    ]
