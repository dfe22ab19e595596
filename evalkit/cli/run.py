"""``evalkit run``: tasks on backbones, result rows written; its parser and handler."""

from __future__ import annotations

import os
from pathlib import Path

from evalkit.data import DECODERS, PIXELS
from evalkit.errors import EvalkitError


def add_run(sub) -> None:
    run = sub.add_parser("run", help="run tasks on backbones and write result rows")
    add_jobs_arguments(run)
    add_data_arguments(run)
    add_execution_arguments(run)


def add_jobs_arguments(run) -> None:
    """What to run: tasks, backbones, weights, settings."""
    run.add_argument(
        "--task",
        dest="tasks",
        metavar="TASK",
        action="append",
        required=True,
        help="task name (repeatable)",
    )
    run.add_argument(
        "--backbone",
        dest="backbones",
        metavar="BACKBONE",
        action="append",
        default=[],
        help="e.g. timm/vit_tiny_patch16_224 (repeatable); tasks that train their own models "
        "(the ablations) need none",
    )
    run.add_argument(
        "--zoo",
        type=Path,
        help="a TOML file of backbones to compare ([[backbone]] tables: name, and optionally "
        "weights, pretrained, model_args), in place of --backbone",
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run the I-th (from 0) of N shares of the cells, after leaving out those already "
        "done (default: from SLURM_ARRAY_TASK_ID, or JOB_COMPLETION_INDEX with EVALKIT_SHARDS)",
    )
    run.add_argument("--weights", help="local checkpoint (.safetensors, .pt, .pth)")
    run.add_argument(
        "--pretrained",
        action="store_true",
        help="published weights of timm/<model>.<tag> or open_clip/<arch>:<tag>, from the "
        "Hugging Face cache (HF_HUB_OFFLINE=1: the cache only)",
    )


def add_data_arguments(run) -> None:
    """Where data comes from and where rows and features go."""
    run.add_argument(
        "--data", default="auto", help="auto | folder | hf | embedded (built-in stand-in data)"
    )
    run.add_argument("--data-dir", type=Path, help="dataset root (default: $EVALKIT_DATA)")
    run.add_argument(
        "--verify-data",
        action="store_true",
        help="identify data files by their bytes, not size and modification time (slower)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a task setting (repeatable)",
    )
    run.add_argument("--out", type=Path, default=Path("results/runs"), help="where result rows go")
    run.add_argument(
        "--force",
        action="store_true",
        help="run even when `evalkit plan` says it does not fit this machine",
    )
    run.add_argument(
        "--rerun",
        action="store_true",
        help="recompute jobs whose rows are already on disk (they are skipped otherwise)",
    )
    run.add_argument(
        "--save-predictions",
        action="store_true",
        help="also write each image's predictions as Parquet under <out>/predictions/",
    )
    run.add_argument(
        "--no-cache", action="store_true", help="do not read or write the feature cache"
    )
    run.add_argument(
        "--cache-dir",
        type=Path,
        help="feature/data cache (default: $EVALKIT_CACHE or ~/.cache/evalkit)",
    )
    run.add_argument(
        "--pixels",
        choices=PIXELS,
        default="auto",
        help="keep each split's decoded, cropped images in the cache for the next backbone of "
        "the same geometry: auto (where they take at most a quarter of the free disk), cache, "
        "decode (never); also --set pixels=…",
    )
    run.add_argument(
        "--verify-cache",
        action="store_true",
        help="re-read every cached shard this run uses against its checksum, even when its "
        "file looks untouched (after a disk scare or a copy between machines)",
    )


def add_execution_arguments(run) -> None:
    """How to run: batches, device, precision, seeds, sharding."""
    run.add_argument(
        "--batch-size",
        type=batch_size_value,
        default=64,
        help="images per forward (default 64), or auto: the largest that fits the device by "
        "the planner's estimate; a batch that runs out of memory is halved and retried",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        help="data-loading processes (default: on a GPU every core of the rank but one, on a "
        "CPU one per 8 cores; none for three batches or fewer)",
    )
    run.add_argument(
        "--decoder",
        choices=DECODERS,
        default="auto",
        help="how image files are decoded and resized: tensor (JPEGs by torchvision on uint8, "
        "within 2 levels of PIL per pixel; other files by PIL), pil, or auto (tensor where the "
        "resize is bicubic or bilinear); also --set decoder=…",
    )
    run.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)"
    )
    run.add_argument(
        "--dtype", choices=("fp32", "bf16"), default=None, help="default: bf16 on cuda, fp32 on cpu"
    )
    run.add_argument(
        "--cache-dtype",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="how cached features are stored (default: the --dtype of the run)",
    )
    run.add_argument(
        "--seed",
        type=int,
        action="append",
        help="seed of a run (repeatable: one run per seed; default 0); a backbone without "
        "weights is initialised from each run's own seed",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument(
        "--tp", type=int, default=1, help="tensor-parallel ranks for vit22b (under torchrun)"
    )
    run.add_argument(
        "--fsdp", action="store_true", help="vit22b: also shard weights over data-parallel ranks"
    )
    run.add_argument(
        "--model-arg",
        dest="model_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backbone option, e.g. qk_norm=false or parallel=false (vit22b), img_size=384 (timm)",
    )
    add_log_argument(run)
    run.add_argument(
        "--random-init",
        action="store_true",
        help="allow untrained weights for backbones that refuse them by default (vit22b/22b)",
    )


def batch_size_value(text: str) -> int | str:
    return text if text == "auto" else int(text)


def add_log_argument(parser) -> None:
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="TRACKER[:KEY=VALUE,...]",
        help="also send each job's rows and training curves to wandb, mlflow or tensorboard "
        "(repeatable), e.g. wandb:project=vit-evals,mode=offline; see docs/ecosystem.md",
    )


def log_run_args(log: list[str]) -> tuple[str, ...]:
    """``--log`` values as options of each job's ``evalkit run`` (checked here, before any job)."""
    from evalkit.tracking import LogTarget

    for value in log:
        LogTarget.parse(value)
    return tuple(arg for value in log for arg in ("--log", value))


def cmd_run(args, console) -> int:
    from evalkit.core import runner

    specs = zoo_specs(run_spec(args), args.zoo) if args.zoo else [run_spec(args)]
    if not is_main_process():
        console = quiet_console()
    specs = shared_out(specs, args, console)
    if not specs:
        return 0
    for name in specs[0].tasks:
        if note := runner.alias_note(name):
            console.print(f"[yellow]note:[/] {note}")

    def show_data(line: str):
        console.print(f"data: {line}", highlight=False, soft_wrap=True)

    total, results = sum(cell_count(spec) for spec in specs), []
    for spec in specs:
        jobs = runner.run(
            spec, on_backbone=lambda b: warn_random_init(b, console), on_data=show_data
        )
        for job in jobs:
            results.append(job)
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
    from evalkit.core import runner

    shard = runner.shard_asked(args.shard, dict(os.environ))
    if shard is None or (args.shard is None and sum(map(cell_count, specs)) < 2):
        return specs
    kept, counts = runner.share(specs, shard)
    console.print(
        f"shard {shard[0]}/{shard[1]}: {counts['mine']} cell(s) to run of its "
        f"{counts['share']} ({counts['cells']} in all; the others are another shard's, or done)",
        highlight=False,
    )
    return kept


def cell_line(job, index: int, total: int, spec) -> str:
    """One line per finished cell of a zoo: its place, what it is (the backbone's setup, named
    as tables name it: its options and weights, which tell two entries of a zoo file apart)
    and how it ended."""
    from evalkit.core.results import setup_label

    why = f": {job.error or job.note}" if job.error or job.note else ""
    parts = [f"{k}={v}" for k, v in sorted(spec.model_args.items())]
    parts += [f"weights {Path(spec.weights).name}"] if spec.weights else []
    backbone = setup_label(job.backbone, parts, not (spec.weights or spec.pretrained))
    return f"[{index}/{total}] {job.task} × {backbone} (seed {job.seed}): {job.status}{why}"


def print_rows(console, results):
    from rich.table import Table

    cells = [summary_cells(row, skipped=job.skipped) for job in results for row in job.rows]
    noted = any(line[-1] for line in cells)  # a note column only when a row has a note
    table = Table("task", "backbone", "metric", "value", "n", *(["note"] if noted else []))
    for line in cells:
        table.add_row(*(line if noted else line[:-1]))
    console.print(table)


def report_failures(console, results, out: Path) -> int:
    """The zoo's failed cells, listed at the end (exit status 1 when there are any)."""
    from evalkit.core.results import FAILED

    failed = [job for job in results if job.error]
    if not failed:
        return 0
    console.print(
        f"[bold red]{len(failed)} of {len(results)} cells failed[/] (recorded in {out / FAILED}; "
        "a rerun of the same command redoes only these and the ones never run):",
        highlight=False,
        soft_wrap=True,
    )
    for job in failed:
        line = f"  {job.task} × {job.backbone} (seed {job.seed}): {job.error}"
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


def run_spec(args):
    """The command line as a ``RunSpec``: argument names are its field names."""
    from dataclasses import fields

    from evalkit.backbones.options import parse_model_args
    from evalkit.core.runner import RunSpec

    given = {f.name: getattr(args, f.name) for f in fields(RunSpec) if hasattr(args, f.name)}
    given["model_args"] = parse_model_args(args.model_args)
    given["seeds"] = tuple(args.seed or (0,))
    given["progress"] = not args.quiet
    given["zoo"] = False  # a zoo file's specs are made by zoo_specs
    return RunSpec(**given)


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


def summary_cells(row, *, skipped: bool) -> list[str]:
    from evalkit.core.results import number, own_spread

    spread = f" ± {number(own_spread(row))}" if own_spread(row) is not None else ""
    return [
        row["task"],
        row["backbone"],
        row["metric"],
        f"{number(row['value'])}{spread}",
        str(row.get("n") or ""),
        "skipped: same task, settings, backbone, weights, data and seed on disk (--rerun recomputes)"
        if skipped
        else "",
    ]
