"""The ``evalkit`` command: parses arguments, calls the API, prints with rich. No evaluation
logic lives here."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from evalkit.data.prepare import add_prepare_command, cmd_prepare
from evalkit.errors import EvalkitError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalkit", description="Evaluate frozen vision backbones."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run tasks on backbones and write result rows")
    add_jobs_arguments(run)
    add_data_arguments(run)
    add_execution_arguments(run)
    add_results_commands(sub)
    add_model_commands(sub)
    add_cache_command(sub)
    add_pretrain_command(sub)
    add_errors_command(sub)
    add_sweep_command(sub)
    add_reproduce_command(sub)
    add_prepare_command(sub)
    return parser


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
        help="rerun even if the rows exist, and run even when `evalkit plan` says it does not fit",
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


def add_execution_arguments(run) -> None:
    """How to run: batches, device, precision, seeds, sharding."""
    run.add_argument("--batch-size", type=int, default=64)
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        help="data-loading processes (default: up to 8 on large data, none on small)",
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
        "weights is initialised from the first",
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
    run.add_argument(
        "--random-init",
        action="store_true",
        help="allow untrained weights for backbones that refuse them by default (vit22b/22b)",
    )


def add_results_commands(sub) -> None:
    """ls, table and compare."""
    ls = sub.add_parser("ls", help="list tasks or backbone families")
    ls.add_argument("what", nargs="?", choices=("tasks", "backbones"), default="tasks")

    table = sub.add_parser("table", help="render result rows as a paper-style table")
    table.add_argument("paths", nargs="+", type=Path)
    table.add_argument(
        "--pivot", default="backbone,task", help="ROWS,COLUMNS (backbone,task or task,backbone)"
    )
    table.add_argument("--format", choices=("md", "csv"), default="md")
    table.add_argument("--output", "-o", type=Path, help="write to a file instead of stdout")

    compare = sub.add_parser(
        "compare", help="compare two sets of rows; exit 1 on any change beyond the tolerance"
    )
    compare.add_argument("base", type=Path)
    compare.add_argument("new", type=Path)
    compare.add_argument(
        "--tolerance", type=float, default=0.5, help="allowed change, in metric units"
    )
    compare.add_argument(
        "--tolerances", type=Path,
        help="per-metric tolerances (TOML; default: BASE/tolerances.toml when BASE has one)",
    )  # fmt: skip
    compare.add_argument(
        "--one-sided", action="store_true", help="tolerate gains: fail on drops only"
    )
    compare.add_argument(
        "--junit", type=Path, metavar="FILE",
        help="also write a JUnit XML report: one test case per metric",
    )  # fmt: skip
    compare.add_argument(
        "--format", choices=("table", "github"), default="table",
        help="github: print GitHub Actions ::error annotations after the table",
    )  # fmt: skip
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


def add_model_commands(sub) -> None:
    """backbones (list, plan) and convert."""
    backbones = sub.add_parser("backbones", help="list backbone families or plan a model")
    backbones.add_argument("action", choices=("ls", "info"))
    backbones.add_argument("spec", nargs="?", default="vit22b", help="e.g. vit22b, vit22b/l")
    backbones.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to plan for")
    backbones.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")

    convert = sub.add_parser("convert", help="convert a checkpoint to the vit22b layout")
    convert.add_argument(
        "source",
        type=Path,
        help="timm vit_*_xp_* state dict, big_vision .npz, or (with --to big_vision) an evalkit "
        "checkpoint",
    )
    convert.add_argument("out", type=Path, help="output folder (evalkit) or .npz file")
    convert.add_argument("--from", dest="kind", choices=("timm", "big_vision"))
    convert.add_argument(
        "--to",
        dest="target",
        choices=("evalkit", "big_vision"),
        default="evalkit",
        help="big_vision: export an evalkit checkpoint as a big_vision .npz",
    )
    convert.add_argument(
        "--norm",
        choices=("layer", "rms"),
        help="big_vision source: its norms centre (layer) or not (rms); a tree does not say",
    )
    convert.add_argument(
        "--pool-include-prefix",
        choices=("yes", "no"),
        help="timm source with a class token and a MAP or average pool: the model's "
        "pool_include_prefix (its state dict does not say; timm's default is no)",
    )
    convert.add_argument("--shard-size", default="5GB", help="split files beyond this size")


def add_reproduce_command(sub) -> None:
    rep = sub.add_parser("reproduce", help="measure the paper's effect table")
    rep.add_argument("--scale", default="tiny",
                     help="tiny (CPU-sized, embedded data), smoke (a few steps) or paper (the "
                          "paper's models on real data, as a sweep)")  # fmt: skip
    rep.add_argument("--rows", help="comma-separated row numbers (default: all 12)")
    rep.add_argument("--out", type=Path, default=Path("results/paper"))
    rep.add_argument("--cache-dir", type=Path, help="features, stand-in data and the ladder")
    rep.add_argument("--quiet", action="store_true", help="no progress bars")
    paper = rep.add_argument_group("scale paper")
    paper.add_argument("--data-dir", type=Path, help="the real data sets")
    paper.add_argument("--weights", action="append", default=[], metavar="MODEL=PATH",
                       help="a paper model's checkpoint, e.g. ViT-22B=/ckpt/vit22b")  # fmt: skip
    paper.add_argument("--backbone", action="append", default=[], metavar="MODEL=SPEC",
                       help="the backbone standing for a paper model (defaults: "
                            "ViT-L/32=timm/vit_large_patch32_384, ViT-G=vit22b/g, ViT-e=vit22b/e, "
                            "ViT-22B=vit22b)")  # fmt: skip
    paper.add_argument("--peak-tflops", type=float, default=312.0,
                       help="the GPU's dense bf16 peak, for GPU-hours (default: A100)")  # fmt: skip
    paper.add_argument("--mfu", type=float, default=0.4, help="utilisation assumed for GPU-hours")
    paper.add_argument("--target", help="a node type (as evalkit plan's --target): per row, the "
                       "GPUs, nodes and hours it needs there")  # fmt: skip
    paper.add_argument("--executor", choices=("local", "slurm", "submitit-local"), default="local")
    paper.add_argument("--dry-run", action="store_true",
                       help="estimate compute and print the jobs (slurm: the batch script)")  # fmt: skip
    add_resource_arguments(paper)


def add_resource_arguments(parser) -> None:
    """What each job of a sweep gets on a cluster (evalkit sweep, reproduce --scale paper)."""
    parser.add_argument("--gpus-per-job", type=int, default=0, help="> 1: torchrun inside the job")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of each job")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--partition")
    parser.add_argument("--timeout-min", type=int, default=240)
    parser.add_argument("--cpus-per-task", type=int, default=8)
    parser.add_argument("--mem-gb", type=int)
    parser.add_argument("--array-parallelism", type=int, default=32, help="jobs running at once")


def resources_from(args):
    from evalkit.sweep import Resources

    return Resources(gpus=args.gpus_per_job, nodes=args.nodes, tp=args.tp, fsdp=args.fsdp,
                     partition=args.partition, timeout_min=args.timeout_min,
                     cpus_per_task=args.cpus_per_task, mem_gb=args.mem_gb,
                     array_parallelism=args.array_parallelism)  # fmt: skip


def cmd_reproduce(args, console) -> int:
    from evalkit.reproduce import reproduce

    try:
        only = {int(r) for r in args.rows.split(",")} if args.rows else None
    except ValueError:
        raise EvalkitError(
            f"--rows expects comma-separated row numbers, got {args.rows!r}"
        ) from None
    if args.scale == "paper":
        return reproduce_paper(args, only, console)
    given = [flag for flag, value in (("--data-dir", args.data_dir), ("--weights", args.weights),
             ("--backbone", args.backbone), ("--dry-run", args.dry_run),
             ("--executor", args.executor != "local"), ("--target", args.target)) if value]  # fmt: skip
    if given:
        raise EvalkitError(f"{', '.join(given)}: for --scale paper only; --scale {args.scale} runs "
                           "on embedded data with the pretraining ladder")  # fmt: skip
    records = reproduce(args.scale, only=only, out=args.out, cache=args.cache_dir,
                        progress=not args.quiet and sys.stderr.isatty(), echo=console.print)  # fmt: skip
    show_effects(records, args, console)
    return 0


def reproduce_paper(args, only, console) -> int:
    """Estimate, run (or submit) the jobs that are not done, and write the table once they are."""
    import time

    from evalkit import paper_scale, sweep
    from evalkit.plan import parse_target
    from evalkit.reproduce import tabulate

    run = paper_scale.PaperRun(args.data_dir, args.out, pairs(args.weights, "--weights"),
                               pairs(args.backbone, "--backbone"), only)  # fmt: skip
    job, effects = run.reproduction(resources_from(args))
    sweep.check(job.plan)
    gpu = paper_scale.Accelerator(peak_tflops=args.peak_tflops, utilisation=args.mfu,
                                  name="A100" if args.peak_tflops == 312.0 else "GPU")  # fmt: skip
    target = parse_target(args.target) if args.target else None
    estimates = paper_scale.estimate(job, effects, args.data_dir, target)
    table = paper_scale.compute_table(estimates, gpu)
    if target is not None:
        table += "\n" + paper_scale.placement_table(estimates, target, args.mfu)
    pending = sweep.pending(job.plan)
    console.print(f"{len(job.plan.jobs)} job(s), {len(pending)} to run")
    if args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"compute-{args.scale}.md").write_text(table)
        print(table)
        return dry_run(job.plan, pending, args.executor)
    if pending:
        missing = run.missing_weights(job, effects)
        if missing:
            raise EvalkitError(f"scale paper needs weights for {', '.join(missing)}: pass "
                               f"--weights MODEL=PATH for each (or --dry-run to plan)")  # fmt: skip
        code = execute(job.plan, pending, args.executor, console)
        if code or args.executor == "slurm":
            if not code:
                console.print("rerun this command when the jobs have finished: it writes the table")
            return code
    start = time.perf_counter()
    show_effects(tabulate(job, effects, 0.0, start, console.print), args, console)
    return 0


def pairs(items: list[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise EvalkitError(f"{option} expects MODEL=VALUE (e.g. ViT-22B=/ckpt), got {item!r}")
        found[name] = value
    return found


def show_effects(records, args, console) -> None:
    from rich.table import Table

    table = Table("#", "where", "paper effect", "ours", "effect", "agrees?")
    for r in records:
        effect = "–" if r["our_effect"] is None else f"{r['our_effect']:+.3g}"
        if r.get("interval"):
            effect += " [{:+.3g}, {:+.3g}]".format(*r["interval"])
        table.add_row(str(r["row"]), r["where"], r["paper_effect"], r["ours"], effect,
                      {True: "yes", False: "no", None: "n/a"}[r["agrees"]])  # fmt: skip
    console.print(table)
    console.print(f"table: {args.out}/effects-{args.scale}.md")


def add_sweep_command(sub) -> None:
    sweep = sub.add_parser("sweep", help="run a plan of (task, backbone, settings, seed) jobs")
    sweep.add_argument(
        "--plan", type=Path, help="a TOML plan of [[jobs]] (instead of --task/--backbone)"
    )
    sweep.add_argument("--task", action="append", default=[])
    sweep.add_argument("--backbone", action="append", default=[])
    sweep.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sweep.add_argument("--weights", help="a checkpoint every job's backbone loads")
    sweep.add_argument("--data", default="auto", help="passed to every job's evalkit run")
    sweep.add_argument("--data-dir", type=Path)
    sweep.add_argument("--out", type=Path, default=Path("results/sweep"))
    sweep.add_argument("--executor", choices=("local", "slurm", "submitit-local"), default="local")
    sweep.add_argument(
        "--dry-run", action="store_true", help="print what would run (slurm: the batch script)"
    )
    add_resource_arguments(sweep)


def cmd_sweep(args, console) -> int:
    from evalkit import sweep

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s)
    except ValueError:
        raise EvalkitError(
            f"--seeds expects comma-separated integers, got {args.seeds!r}"
        ) from None
    run_args = ("--data", args.data, *(("--data-dir", str(args.data_dir)) if args.data_dir else ()))
    common = {"out": args.out, "run_args": run_args, "resources": resources_from(args)}
    plan = (sweep.plan_from_toml(args.plan, **common) if args.plan else
            sweep.plan_from_args(args.task, args.backbone, seeds, args.overrides, args.weights, **common))  # fmt: skip
    sweep.check(plan)
    jobs = sweep.pending(plan)
    console.print(
        f"{len(plan.jobs)} job(s), {len(plan.jobs) - len(jobs)} already done, {len(jobs)} to run"
    )
    if not jobs:
        return 0
    if args.dry_run:
        return dry_run(plan, jobs, args.executor)
    return execute(plan, jobs, args.executor, console)


def dry_run(plan, jobs, executor: str) -> int:
    """Print what would run: the Slurm batch script, or each job's command."""
    from evalkit import sweep

    if executor == "slurm" and jobs:
        print(sweep.batch_script(plan, jobs))
    else:
        for job in jobs:
            print(shlex.join(plan.command(job)))
    return 0


def execute(plan, jobs, executor: str, console) -> int:
    """Run the jobs here one after another, or submit them through submitit (Slurm returns at
    once); 1 when a job failed."""
    from evalkit import sweep

    if executor == "local":
        failed = [job for job, code in sweep.run_local(plan, jobs, console.print) if code]
    else:
        cluster = "slurm" if executor == "slurm" else "local"
        submitted = sweep.submit(plan, jobs, cluster=cluster)
        console.print(
            f"submitted {len(submitted)} job(s): {', '.join(j.job_id for j in submitted)}"
        )
        if cluster == "slurm":
            return 0
        failed = [job for job, sub in zip(jobs, submitted, strict=True) if not _succeeded(sub)]
    for job in failed:
        console.print(f"[red]failed[/red]: {job.label()}")
    return 1 if failed else 0


def _succeeded(submitted) -> bool:
    try:
        submitted.result()
    except Exception:  # noqa: BLE001 - submitit raises its own types for failed jobs
        return False
    return True


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

    slug = args.task.replace("/", "_")
    files = sorted((args.run_dir / "predictions").glob(f"{slug}--*.parquet"))
    if args.backbone:
        files = [
            f for f in files if f.name.startswith(f"{slug}--{args.backbone.replace('/', '_')}--")
        ]
    if not files:
        raise EvalkitError(
            f"no predictions of {args.task} under {args.run_dir}/predictions: rerun it with "
            "evalkit run ... --save-predictions"
        )
    for path in files:
        frame = pd.read_parquet(path)
        console.print(f"[bold]{path.name}[/bold]: {len(frame)} images")
        for title, rows in error_tables(frame, args.top):
            table = Table(*rows.columns, title=title)
            for values in rows.itertuples(index=False):
                table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values))
            console.print(table)
    return 0


def error_tables(frame, top: int):
    """(title, DataFrame) pairs: for classification the most confused (label, prediction)
    pairs and the most confident mistakes; for dense tasks the images of lowest mIoU."""
    if "miou" in frame:
        worst = frame.nsmallest(top, "miou")[["image", "miou", "pixel_acc"]]
        return [("images of lowest mIoU", worst)]
    names = dict(zip(frame["label"], frame["label_name"], strict=False))
    wrong = frame[~frame["correct"]].assign(
        predicted=lambda f: [names.get(p, str(p)) for p in f["prediction"]],
        confidence=lambda f: [scores[0] for scores in f["top5_scores"]],
    )
    pairs = (wrong.groupby(["label_name", "predicted"]).size().rename("images")
             .nlargest(top).reset_index())  # fmt: skip
    confident = wrong.nlargest(top, "confidence")[
        ["image", "label_name", "predicted", "confidence"]
    ]
    return [("most confused classes", pairs), ("most confident mistakes", confident)]


def add_pretrain_command(sub) -> None:
    pre = sub.add_parser("pretrain", help="train sizes of the built-in ViT family from scratch")
    pre.add_argument("--model", default="vit22b/ti", help="vit22b/<size> (default vit22b/ti)")
    pre.add_argument("--ladder", help="several sizes sharing data and schedule, e.g. test,ti,s")
    pre.add_argument(
        "--data", default="auto", help="embedded: the JFT stand-in; else jft/ or imagenet/"
    )
    pre.add_argument("--data-dir", type=Path, help="dataset root (default: $EVALKIT_DATA)")
    pre.add_argument("--cache-dir", type=Path, help="where embedded stand-ins are written")
    pre.add_argument("--out", type=Path, default=Path("checkpoints/pretrain"))
    pre.add_argument("--image", type=int, default=32, help="training resolution (default 32)")
    pre.add_argument("--patch", type=int, default=8, help="patch size (default 8)")
    pre.add_argument("--steps", type=int, default=200)
    pre.add_argument("--batch-size", type=int, default=64)
    pre.add_argument("--lr", type=float, default=1e-3)
    pre.add_argument("--warmup", type=int, default=20)
    pre.add_argument("--weight-decay", type=float, default=1e-4)
    pre.add_argument("--optimizer", choices=("adamw", "adafactor"), default="adamw")
    pre.add_argument("--z-loss", type=float, default=0.0)
    pre.add_argument("--checkpoint-every", type=int, default=50)
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--device", default="cpu")
    pre.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (under torchrun)")
    pre.add_argument(
        "--fsdp", action="store_true", help="shard parameters over data-parallel ranks (FSDP2)"
    )
    pre.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_pretrain(args, console) -> int:
    from rich.table import Table

    from evalkit import distributed
    from evalkit.data import DataConfig
    from evalkit.identity import cache_root
    from evalkit.training.loop import Schedule
    from evalkit.training.pretrain import PretrainSpec, pretrain

    family, _, size = args.model.partition("/")
    if family != "vit22b":
        raise EvalkitError(
            f"pretrain trains the built-in family: --model vit22b/<size>, not {args.model!r}"
        )
    sizes = tuple(s.strip() for s in args.ladder.split(",")) if args.ladder else (size or "ti",)
    for name, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--lr", args.lr),
                        ("--checkpoint-every", args.checkpoint_every)):  # fmt: skip
        if value <= 0:
            raise EvalkitError(f"{name} must be positive, got {value}")
    schedule = Schedule(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                        weight_decay=args.weight_decay, optimizer=args.optimizer, z_loss=args.z_loss,
                        checkpoint_every=args.checkpoint_every, seed=args.seed)  # fmt: skip
    layout = distributed.setup(args.tp, device=args.device)
    spec = PretrainSpec(sizes=sizes, image=args.image, patch=args.patch, schedule=schedule, out=args.out,
                        device=args.device, fsdp=args.fsdp,
                        progress=not args.quiet and sys.stderr.isatty() and layout.main)  # fmt: skip
    data = DataConfig(source=args.data, root=args.data_dir, cache=args.cache_dir or cache_root())
    table = Table("size", "params", "loss", "first", "final", "steps", "seconds", "weights")
    try:
        for s in pretrain(spec, data):
            table.add_row(s["size"], f"{s['params']:,}", s["loss"], f"{s['first_loss']:.4f}",
                          f"{s['final_loss']:.4f}", str(s["steps"]), str(s["seconds"]), s["weights"])  # fmt: skip
    finally:
        distributed.teardown()
    if layout.main:
        console.print(table)
    return 0


def add_cache_command(sub) -> None:
    """cache ls / clear."""
    check = sub.add_parser(
        "check-data",
        help="check the data a task would read, without a backbone; exit 2 on problems",
    )
    check.add_argument("--task", required=True)
    check.add_argument("--data", default="auto", help="auto | folder | hf | embedded")
    check.add_argument("--data-dir", type=Path, help="dataset root (default: $EVALKIT_DATA)")
    check.add_argument("--cache-dir", type=Path, help="where embedded stand-ins are written")
    check.add_argument("--quiet", action="store_true", help="no progress bars")

    plan = sub.add_parser(
        "plan", help="what a run will cost (passes, disk, RAM, device memory), before it runs"
    )
    plan.add_argument("--task", required=True)
    plan.add_argument("--backbone", required=True)
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--data", default="auto")
    plan.add_argument("--data-dir", type=Path)
    plan.add_argument("--cache-dir", type=Path)
    plan.add_argument("--device", default=None)
    plan.add_argument("--dtype", choices=("fp32", "bf16"))
    plan.add_argument("--cache-dtype", choices=("fp32", "bf16", "fp16"))
    plan.add_argument("--batch-size", type=int, default=64)
    plan.add_argument("--tp", type=int, default=1)
    plan.add_argument(
        "--target", default="this",
        help="where the run goes: this (this machine), 1xA100-80GB, 8xA100-80GB, 8xH100-80GB, "
        "1xH200, or gpus=N,gpu_gb=G,host_gb=H[,disk_gb=D]; memory is checked per rank and host",
    )  # fmt: skip

    cache = sub.add_parser("cache", help="inspect or clear the feature cache")
    cache.add_argument("action", choices=("ls", "clear"))
    cache.add_argument("--backbone", help="clear only this backbone's entries")
    cache.add_argument("--cache-dir", type=Path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    console = Console(stderr=False)
    try:
        return COMMANDS[args.command](args, console)
    except EvalkitError as exc:
        if args.debug:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted: finished rows and cached features are kept")
        return 130


def cmd_run(args, console) -> int:
    from rich.table import Table

    from evalkit import runner

    spec = run_spec(args)
    if not is_main_process():
        console = quiet_console()
    for name in spec.tasks:
        if note := runner.alias_note(name):
            console.print(f"[yellow]note:[/] {note}")
    table = Table("task", "backbone", "metric", "value", "n", "")
    for job in runner.run(spec, on_backbone=lambda b: warn_random_init(b, console)):
        for row in job.rows:
            table.add_row(*summary_cells(row, skipped=job.skipped))
    console.print(table)
    console.print(f"rows: {spec.out}/")
    return 0


def run_spec(args):
    """The command line as a ``RunSpec``: argument names are its field names."""
    from dataclasses import fields

    from evalkit.backbones.options import parse_model_args
    from evalkit.runner import RunSpec

    given = {f.name: getattr(args, f.name) for f in fields(RunSpec) if hasattr(args, f.name)}
    given["model_args"] = parse_model_args(args.model_args)
    given["seeds"] = tuple(args.seed or (0,))
    given["progress"] = not args.quiet and sys.stderr.isatty()
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
    from evalkit.results import number, own_spread

    spread = f" ± {number(own_spread(row))}" if own_spread(row) is not None else ""
    return [
        row["task"],
        row["backbone"],
        row["metric"],
        f"{number(row['value'])}{spread}",
        str(row.get("n") or ""),
        "skipped: same task, settings, backbone, weights, data and seed on disk (--force reruns)"
        if skipped
        else "",
    ]


def cmd_backbones(args, console) -> int:
    if args.action == "ls":
        args.what = "backbones"
        return cmd_ls(args, console)
    from rich.table import Table

    from evalkit.models import vit22b
    from evalkit.parallel.planner import plan, report

    family, _, size = args.spec.partition("/")
    size = size or "22b"
    if family != "vit22b" or size not in vit22b.SIZES:
        raise EvalkitError(
            f"backbones info plans the built-in family: vit22b[/<size>] with size one of "
            f"{', '.join(vit22b.SIZES)}; got {args.spec!r}"
        )
    cfg = vit22b.config(size)
    table = Table(show_header=False, box=None)
    for label, value in report(f"vit22b/{size}", cfg, plan(cfg, tp=args.tp, dtype=args.dtype)):
        table.add_row(label, value)
    console.print(table)
    return 0


def cmd_convert(args, console) -> int:
    from evalkit.models import convert

    if args.target == "big_vision":
        return export_big_vision(args, console)
    if args.kind is None:
        raise EvalkitError("convert needs --from timm or --from big_vision (or --to big_vision)")
    from evalkit.checkpoints import parse_size, read_state_dict, save_checkpoint

    if args.kind == "timm":
        if args.norm not in (None, "rms"):
            raise EvalkitError("timm xp models use RMS norms: drop --norm")
        prefix = None if args.pool_include_prefix is None else args.pool_include_prefix == "yes"
        result = convert.from_timm_xp(read_state_dict(args.source), pool_include_prefix=prefix)
    else:
        result = convert.from_big_vision(convert.read_npz(args.source), norm=args.norm)
    state, cfg = result.state, result.config
    path = save_checkpoint(state, args.out, cfg.as_dict(), shard_bytes=parse_size(args.shard_size))
    params = sum(t.numel() for t in state.values())
    console.print(f"wrote {path} ({params:,} parameters; width {cfg.width}, depth {cfg.depth})")
    print_dropped(result.dropped, console)
    console.print(f"use: evalkit run --backbone vit22b/<size> --weights {path} ...")
    return 0


def export_big_vision(args, console) -> int:
    from evalkit.checkpoints import SafetensorsSource
    from evalkit.models import convert
    from evalkit.models.vit22b import ViTConfig

    if args.kind is not None:
        raise EvalkitError("--to big_vision reads an evalkit checkpoint: drop --from")
    source = SafetensorsSource(args.source)
    if not source.config():
        raise EvalkitError(f"{args.source} carries no model config: convert it with evalkit first")
    cfg = ViTConfig(**source.config())
    state = {k: source.tensor(k) for k in source.weight_map}
    path = convert.write_npz(convert.to_big_vision(state, cfg), args.out)
    console.print(f"wrote {path} (big_vision tree; norm kind in {convert.CONFIG_ENTRY!r})")
    return 0


def print_dropped(keys: list[str], console):
    if keys:
        console.print(f"dropped on purpose (the classifier): {', '.join(keys)}")


def cmd_ls(args, console) -> int:
    from rich.table import Table

    if args.what == "tasks":
        from evalkit.catalog import TASKS as registry

        examples = {}
    else:
        from evalkit.backbones import BACKBONES as registry
        from evalkit.backbones import EXAMPLES as examples
    table = Table("name", "what", "examples" if examples else "")
    for entry in registry.entries():
        table.add_row(entry.name, entry.summary, examples.get(entry.name, ""))
    console.print(table)
    return 0


def cmd_table(args, console) -> int:
    from evalkit.results import load_rows, pivot_table

    rows = load_rows(args.paths)
    if not rows:
        raise EvalkitError(
            f"no result rows in {', '.join(map(str, args.paths))} (expected *.jsonl from evalkit run)"
        )
    index, _, columns = args.pivot.partition(",")
    if {index, columns} != {"backbone", "task"}:
        raise EvalkitError(f"--pivot expects backbone,task or task,backbone, got {args.pivot!r}")
    rows = [{**row, "task": table_task(row)} for row in rows]
    frame = pivot_table(rows, index=index, columns=columns, references=references_for(rows))
    text = frame.to_csv() if args.format == "csv" else markdown(frame, index)
    if args.output:
        args.output.write_text(text)
        console.print(f"wrote {args.output}")
    else:
        print(text)
    return 0


FINETUNED = " (fine-tuned)"


def table_task(row) -> str:
    """A row's task as tables name it: fine-tuned runs apart from frozen ones."""
    return row["task"] + (FINETUNED if row.get("config", {}).get("finetune") else "")


def references_for(rows) -> dict:
    """The paper's numbers for the tasks present, as each was run: frozen numbers beside
    frozen runs, fine-tuned ones beside fine-tuned runs (tasks unknown here have none)."""
    from evalkit.runner import resolve_task

    refs = {}
    for label in {r["task"] for r in rows}:
        name = label.removesuffix(FINETUNED)
        overrides = ["finetune=true"] if label.endswith(FINETUNED) else []
        try:
            refs[label] = resolve_task(name, overrides).reference
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

    from evalkit.results import (
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
    records = compare(load_rows([args.base]), load_rows([args.new]), tolerance=tolerance,
                      one_sided=args.one_sided)  # fmt: skip
    table = Table("task", "backbone", "metric", "base", "new", "delta", "status")
    colours = {"regression": "red", "missing": "red", "changed-up": "red", "improved": "green"}

    def fmt(v):
        return "–" if v is None else f"{v:.2f}"

    for rec in records:
        status = rec["status"]
        table.add_row(
            rec["task"],
            rec["backbone"],
            rec["metric"],
            fmt(rec["base"]),
            fmt(rec["new"]),
            "–" if rec["delta"] is None else f"{rec['delta']:+.2f}",
            f"[{colours.get(status, 'white')}]{status}[/]",
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
    console.print(
        f"{len(bad)} change(s) beyond their tolerances (up or down"
        f"{'; gains tolerated' if args.one_sided else ''})"
        if bad
        else "no changes beyond tolerance"
    )
    return 1 if bad and args.fail_on_regression else 0


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


def cmd_check_data(args, console) -> int:
    from evalkit.data import DataConfig
    from evalkit.data.check import check_dataset
    from evalkit.identity import cache_root
    from evalkit.runner import resolve_task

    task = resolve_task(args.task)
    config = DataConfig(source=args.data, root=args.data_dir, cache=args.cache_dir or cache_root())
    progress = not args.quiet and sys.stderr.isatty()
    reports = [check_dataset(name, tuple(splits.values()), config, progress=progress)
               for name, splits in task.reads().items()]  # fmt: skip
    for report in reports:
        print_data_report(report, console)
    return 2 if any(r.problems for r in reports) else 0


def print_data_report(report, console):
    from rich.table import Table

    table = Table("split", "images", "classes", "smallest", "largest", title=report.dataset)
    for split in report.splits:
        size = lambda s: f"{s[0]}×{s[1]}" if s else "–"  # noqa: E731
        classes = f"{len(split.classes)} ({min(split.classes.values(), default=0)}–" \
            f"{max(split.classes.values(), default=0)} images each)" if split.classes else "–"  # fmt: skip
        table.add_row(split.split, str(split.images), classes, size(split.smallest),
                      size(split.largest))  # fmt: skip
    console.print(table)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for problem in report.problems:
        console.print(f"[bold red]problem:[/] {problem}", highlight=False, soft_wrap=True)
    verdict = f"{len(report.problems)} problem(s)" if report.problems else "no problems"
    console.print(f"{report.dataset}: {verdict}")


def cmd_plan(args, console) -> int:
    from rich.table import Table

    from evalkit.data import DataConfig
    from evalkit.identity import cache_root
    from evalkit.parallel.planner import human as flops
    from evalkit.plan import human, parse_target, plan_run, stage_flops
    from evalkit.runner import resolve_task

    task = resolve_task(args.task, args.overrides)
    config = DataConfig(source=args.data, root=args.data_dir, cache=args.cache_dir or cache_root())
    options = {k: getattr(args, k) for k in ("device", "dtype", "cache_dtype", "batch_size", "tp")}
    target = None if args.target == "this" else parse_target(args.target)
    stages, budget, sizes, shape = plan_run(
        task, args.backbone, config, options | {"target": target}
    )
    table = Table("stage", "mode", "forward passes", "FLOPs", "cache disk", "host RAM",
                  "device / rank", title=f"{task.name} on {args.backbone}")  # fmt: skip
    for s in stages:
        table.add_row(s.name, s.mode, f"{s.forward_passes:,}", flops(stage_flops(s, shape)),
                      human(s.cache_bytes), human(s.host_bytes), human(s.device_bytes))  # fmt: skip
    console.print(table)
    total = sum(stage_flops(s, shape) for s in stages)
    console.print(f"compute: {flops(total, 'FLOP')} in all", highlight=False)
    console.print(f"splits: {sizes}", highlight=False, soft_wrap=True)
    device = human(budget.device) if budget.device is not None else "no accelerator"
    console.print(f"{budget.name}: RAM {human(budget.host)} per host, device {device}, "
                  f"cache disk free {human(budget.disk)}", highlight=False)  # fmt: skip
    console.print(f"ranks: {budget.ranks} on {budget.nodes} host(s), {budget.ranks_per_host} "
                  "per host", highlight=False)  # fmt: skip
    for problem in budget.problems:
        console.print(f"[bold red]does not fit:[/] {problem}", highlight=False, soft_wrap=True)
    console.print(f"{'does not fit' if budget.problems else 'fits'} {budget.name}")
    return 0


def cmd_cache(args, console) -> int:
    from rich.table import Table

    from evalkit.features import clear_cache, list_cache
    from evalkit.identity import cache_root

    root = args.cache_dir or cache_root()
    if args.action == "clear":
        console.print(
            f"removed {clear_cache(root, backbone=args.backbone)} cache entries from {root}"
        )
        return 0
    table = Table("key", "backbone", "split", "pool", "layers", "n", "shards", "complete", "MB")
    for e in list_cache(root):
        table.add_row(
            e["key"],
            e["backbone"],
            e["split"],
            e["request"]["pool"],
            str(e["request"]["layers"]),
            str(e["n"]),
            str(e["shards"]),
            "yes" if e["complete"] else "partial",
            f"{e['bytes'] / 2**20:.1f}",
        )
    console.print(table)
    console.print(f"cache: {root}")
    return 0


COMMANDS = {
    "run": cmd_run,
    "ls": cmd_ls,
    "table": cmd_table,
    "compare": cmd_compare,
    "cache": cmd_cache,
    "backbones": cmd_backbones,
    "convert": cmd_convert,
    "check-data": cmd_check_data,
    "plan": cmd_plan,
    "pretrain": cmd_pretrain,
    "errors": cmd_errors,
    "sweep": cmd_sweep,
    "reproduce": cmd_reproduce,
    "prepare": cmd_prepare,
}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
