"""``evalkit reproduce`` and ``evalkit sweep``: the paper's effect table, and plans of jobs run locally or on Slurm."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from evalkit.cli.run import log_run_args
from evalkit.core.run_options import add_log_argument, data_root
from evalkit.errors import EvalkitError


def add_reproduce_command(sub) -> None:
    rep = sub.add_parser("reproduce", help="measure the paper's effect table")
    rep.add_argument(
        "--scale",
        default="tiny",
        help="tiny (CPU-sized, embedded data), smoke (a few steps) or paper (the "
        "paper's models on real data, as a sweep)",
    )
    rep.add_argument("--rows", help="comma-separated row numbers (default: all 12)")
    rep.add_argument("--out", type=Path, default=Path("results/paper"))
    rep.add_argument("--cache-dir", type=Path, help="features, stand-in data and the ladder")
    rep.add_argument("--quiet", action="store_true", help="no progress bars")
    rep.add_argument(
        "--resolve",
        type=budget_seconds,
        metavar="SECONDS",
        help="measure the rows within noise again with more seeds (doubled per look, each look "
        "held to its share of the 5%% level) until decided or SECONDS of compute are spent",
    )
    add_log_argument(rep)
    paper = rep.add_argument_group("scale paper")
    paper.add_argument("--data-dir", type=data_root, help="the real data sets")
    paper.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="MODEL=PATH",
        help="a paper model's checkpoint, e.g. ViT-22B=/ckpt/vit22b",
    )
    paper.add_argument(
        "--backbone",
        action="append",
        default=[],
        metavar="MODEL=SPEC",
        help="the backbone standing for a paper model (defaults: "
        "ViT-L/32=timm/vit_large_patch32_384, ViT-G=vit22b/g, ViT-e=vit22b/e, "
        "ViT-22B=vit22b)",
    )
    paper.add_argument(
        "--peak-tflops",
        type=float,
        default=312.0,
        help="the GPU's dense bf16 peak, for GPU-hours (default: A100)",
    )
    paper.add_argument("--mfu", type=float, default=0.4, help="utilisation assumed for GPU-hours")
    paper.add_argument(
        "--target",
        help="a node type (as evalkit plan's --target): per row, the "
        "GPUs, nodes and hours it needs there",
    )
    paper.add_argument("--executor", choices=("local", "slurm", "submitit-local"), default="local")
    paper.add_argument(
        "--dry-run",
        action="store_true",
        help="estimate compute and print the jobs (slurm: the batch script)",
    )
    add_resource_arguments(paper)


def reproduce_command(args) -> str:
    """The command line that measured the rows, as the table's header names it."""
    words = ["evalkit reproduce --scale", args.scale]
    words += ["--rows", args.rows] if args.rows else []
    words += ["--resolve", f"{args.resolve:g}"] if args.resolve is not None else []
    return " ".join(words)


def budget_seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expects seconds of compute (> 0), got {text!r}")
    return value


def add_resource_arguments(parser) -> None:
    """What each job of a sweep gets on a cluster (evalkit sweep, reproduce --scale paper)."""
    parser.add_argument("--gpus-per-job", type=int, default=0, help="> 1: torchrun inside the job")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of each job")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--partition")
    parser.add_argument("--timeout-min", type=int, default=240)
    parser.add_argument(
        "--cpus-per-task",
        type=int,
        default=None,
        help="CPUs per job (default: 12 per GPU, 8 without one)",
    )
    parser.add_argument("--mem-gb", type=int)
    parser.add_argument("--array-parallelism", type=int, default=32, help="jobs running at once")


def resources_from(args):
    from evalkit.reproduction.sweep import Resources

    return Resources(
        gpus=args.gpus_per_job,
        nodes=args.nodes,
        tp=args.tp,
        fsdp=args.fsdp,
        partition=args.partition,
        timeout_min=args.timeout_min,
        cpus_per_task=args.cpus_per_task,
        mem_gb=args.mem_gb,
        array_parallelism=args.array_parallelism,
    )


def cmd_reproduce(args, console) -> int:
    from evalkit.reproduction.reproduce import reproduce

    try:
        only = {int(r) for r in args.rows.split(",")} if args.rows else None
    except ValueError:
        raise EvalkitError(
            f"--rows expects comma-separated row numbers, got {args.rows!r}"
        ) from None
    if args.scale == "paper":
        if args.resolve is not None:
            raise EvalkitError(
                "--resolve adds seeds on the embedded stand-ins (scales tiny, smoke); at scale "
                "paper add seeds to the sweep's plan"
            )
        return reproduce_paper(args, only, console)
    given = [
        flag
        for flag, value in (
            ("--data-dir", args.data_dir),
            ("--weights", args.weights),
            ("--backbone", args.backbone),
            ("--dry-run", args.dry_run),
            ("--executor", args.executor != "local"),
            ("--target", args.target),
        )
        if value
    ]
    if given:
        raise EvalkitError(
            f"{', '.join(given)}: for --scale paper only; --scale {args.scale} runs "
            "on embedded data with the pretraining ladder"
        )
    records = reproduce(
        args.scale,
        only=only,
        out=args.out,
        cache=args.cache_dir,
        progress=not args.quiet,
        echo=console.print,
        log=log_run_args(args.log)[1::2],
        resolve_budget=args.resolve,
        command=reproduce_command(args),
    )
    show_effects(records, args, console)
    return 0


def reproduce_paper(args, only, console) -> int:
    """Estimate, run (or submit) the jobs that are not done, and write the table once they are."""
    import time

    from evalkit.core.budget import parse_target
    from evalkit.reproduction import paper_scale, sweep
    from evalkit.reproduction.reproduce import tabulate

    run = paper_scale.PaperRun(
        args.data_dir,
        args.out,
        pairs(args.weights, "--weights"),
        pairs(args.backbone, "--backbone"),
        only,
    )
    job, effects = run.reproduction(resources_from(args))
    job.plan = replace(job.plan, run_args=(*job.plan.run_args, *log_run_args(args.log)))
    sweep.check(job.plan)
    gpu = paper_scale.Accelerator(
        peak_tflops=args.peak_tflops,
        utilisation=args.mfu,
        name="A100" if args.peak_tflops == 312.0 else "GPU",
    )
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
            raise EvalkitError(
                f"scale paper needs weights for {', '.join(missing)}: pass "
                f"--weights MODEL=PATH for each (or --dry-run to plan)"
            )
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

    from evalkit.reproduction.resolve import resolution_text

    table = Table("#", "where", "paper effect", "ours", "effect", "verdict")
    for r in records:
        effect = "–" if r["our_effect"] is None else f"{r['our_effect']:+.3g}"
        if r.get("interval"):
            effect += " [{:+.3g}, {:+.3g}]".format(*r["interval"])
        table.add_row(
            str(r["row"]),
            r["where"],
            r["paper_effect"],
            r["ours"],
            effect,
            resolution_text(r),
        )
    console.print(table)
    console.print(f"table: {args.out}/effects-{args.scale}.md")


def add_sweep_command(sub) -> None:
    sweep = sub.add_parser("sweep", help="run a plan of (task, backbone, settings, seed) jobs")
    sweep.add_argument(
        "--plan", type=Path, help="a TOML plan of [[jobs]] (instead of --task/--backbone)"
    )
    sweep.add_argument("--task", action="append", default=[], help="a task or suite:<name>")
    sweep.add_argument("--backbone", action="append", default=[])
    sweep.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sweep.add_argument("--weights", help="a checkpoint every job's backbone loads")
    sweep.add_argument("--data", default="auto", help="passed to every job's evalkit run")
    sweep.add_argument("--data-dir", type=data_root)
    sweep.add_argument("--out", type=Path, default=Path("results/sweep"))
    sweep.add_argument("--executor", choices=("local", "slurm", "submitit-local"), default="local")
    sweep.add_argument(
        "--dry-run", action="store_true", help="print what would run (slurm: the batch script)"
    )
    add_resource_arguments(sweep)
    add_log_argument(sweep)


def cmd_sweep(args, console) -> int:
    from evalkit.core.suites import expand
    from evalkit.reproduction import sweep

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s)
    except ValueError:
        raise EvalkitError(
            f"--seeds expects comma-separated integers, got {args.seeds!r}"
        ) from None
    run_args = (
        "--data",
        args.data,
        *(("--data-dir", str(args.data_dir)) if args.data_dir else ()),
        *log_run_args(args.log),
    )
    common = {"out": args.out, "run_args": run_args, "resources": resources_from(args)}
    plan = (
        sweep.plan_from_toml(args.plan, **common)
        if args.plan
        else sweep.plan_from_args(
            expand(args.task), args.backbone, seeds, args.overrides, args.weights, **common
        )
    )
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
    from evalkit.reproduction import sweep

    if executor == "slurm" and jobs:
        print(sweep.batch_script(plan, jobs))
    else:
        for job in jobs:
            print(shlex.join(plan.command(job)))
    return 0


def execute(plan, jobs, executor: str, console) -> int:
    """Run the jobs here one after another, or submit them through submitit (Slurm returns at
    once); 1 when a job failed."""
    from evalkit.reproduction import sweep

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
