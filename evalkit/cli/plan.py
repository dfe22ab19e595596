"""``evalkit plan`` and ``evalkit check-data``: what a run will cost, and whether its data is sound, before it runs."""

from __future__ import annotations

from pathlib import Path

from evalkit.core.run_options import data_root
from evalkit.data import DECODERS, DataConfig


def add_check_data(sub) -> None:
    """check the data a task would read"""
    check = sub.add_parser(
        "check-data",
        help="check the data a task would read, without a backbone; exit 2 on problems",
    )
    check.add_argument("--task", required=True)
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the run's task settings, e.g. dataset=folder:PATH or dataset=hf:ORG/NAME",
    )
    check.add_argument("--data", default="auto", help="auto | folder | hf | embedded")
    check.add_argument("--data-dir", type=data_root, help="dataset root (default: $EVALKIT_DATA)")
    check.add_argument("--cache-dir", type=Path, help="where embedded stand-ins are written")
    check.add_argument("--quiet", action="store_true", help="no progress bars")


def add_plan(sub) -> None:
    """what a run will cost"""
    plan = sub.add_parser(
        "plan", help="what a run will cost (passes, disk, RAM, device memory), before it runs"
    )
    plan.add_argument("--task", required=True)
    plan.add_argument("--backbone", required=True)
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--data", default="auto")
    plan.add_argument("--data-dir", type=data_root)
    plan.add_argument("--cache-dir", type=Path)
    plan.add_argument("--device", default=None)
    plan.add_argument("--dtype", choices=("fp32", "bf16"))
    plan.add_argument("--cache-dtype", choices=("fp32", "bf16", "fp16"))
    plan.add_argument("--batch-size", type=int, default=64)
    plan.add_argument("--tp", type=int, default=1)
    plan.add_argument("--decoder", choices=DECODERS, default=DataConfig.decoder)
    plan.add_argument(
        "--target",
        default="this",
        help="where the run goes: this (this machine), 1xA100-80GB, 8xA100-80GB, 8xH100-80GB, "
        "1xH200, or gpus=N,gpu_gb=G,host_gb=H[,disk_gb=D]; memory is checked per rank and host",
    )


def cmd_check_data(args, console) -> int:
    from evalkit.core.runner import resolve_task
    from evalkit.data import DataConfig
    from evalkit.data.check import check_dataset
    from evalkit.storage.identity import cache_root

    task = resolve_task(args.task, args.overrides)
    config = DataConfig(source=args.data, root=args.data_dir, cache=args.cache_dir or cache_root())
    progress = not args.quiet
    reports = [
        check_dataset(name, tuple(splits.values()), config, progress=progress)
        for name, splits in task.reads().items()
    ]
    for report in reports:
        print_data_report(report, console)
    return 2 if any(r.problems for r in reports) else 0


def print_data_report(report, console):
    from rich.table import Table

    table = Table("split", "images", "classes", "smallest", "largest", title=report.dataset)
    for split in report.splits:
        size = lambda s: f"{s[0]}×{s[1]}" if s else "–"  # noqa: E731
        classes = (
            f"{len(split.classes)} ({min(split.classes.values(), default=0)}–"
            f"{max(split.classes.values(), default=0)} images each)"
            if split.classes
            else "–"
        )
        table.add_row(
            split.split, str(split.images), classes, size(split.smallest), size(split.largest)
        )
    console.print(table)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for problem in report.problems:
        console.print(f"[bold red]problem:[/] {problem}", highlight=False, soft_wrap=True)
    verdict = f"{len(report.problems)} problem(s)" if report.problems else "no problems"
    console.print(f"{report.dataset}: {verdict}")


def cmd_plan(args, console) -> int:
    from rich.table import Table

    from evalkit.core.budget import human, parse_target
    from evalkit.core.costs import feeding_rates, plan_run, rate_of, stage_flops
    from evalkit.core.rates import expected_time, measured_decoding
    from evalkit.core.runner import resolve_task
    from evalkit.data import DataConfig
    from evalkit.device import default_device, default_dtype
    from evalkit.parallel.sizing import human as flops
    from evalkit.storage.identity import cache_root

    task = resolve_task(args.task, args.overrides)
    config = DataConfig(
        source=args.data,
        root=args.data_dir,
        cache=args.cache_dir or cache_root(),
        decoder=args.decoder,
    )
    options = {k: getattr(args, k) for k in ("device", "dtype", "cache_dtype", "batch_size", "tp")}
    target = None if args.target == "this" else parse_target(args.target)
    stages, budget, sizes, shape, images = plan_run(
        task, args.backbone, config, options | {"target": target}
    )
    run_device = args.device or default_device()
    dtype = args.dtype or default_dtype(run_device)
    table = Table(
        "stage",
        "mode",
        "forward passes",
        "FLOPs",
        "cache disk",
        "host RAM",
        "device / rank",
        title=f"{task.name} on {args.backbone}",
    )
    for s in stages:
        table.add_row(
            s.name,
            s.mode,
            f"{s.forward_passes:,}",
            flops(stage_flops(s, shape)),
            human(s.cache_bytes),
            human(s.host_bytes),
            human(s.device_bytes),
        )
    console.print(table)
    total = sum(stage_flops(s, shape) for s in stages)
    console.print(f"compute: {flops(total, 'FLOP')} in all", highlight=False)
    rate = rate_of(args.backbone, shape, target, run_device, dtype)
    console.print(expected_time(total, rate), highlight=False, soft_wrap=True)
    console.print(f"splits: {sizes}", highlight=False, soft_wrap=True)
    device = human(budget.device) if budget.device is not None else "no accelerator"
    console.print(
        f"{budget.name}: RAM {human(budget.host)} per host, device {device}, "
        f"cache disk free {human(budget.disk)}",
        highlight=False,
    )
    console.print(
        f"ranks: {budget.ranks} on {budget.nodes} host(s), {budget.ranks_per_host} per host "
        f"(tp={args.tp} × {budget.ranks // args.tp} data-parallel)",
        highlight=False,
    )
    device = args.device or ("cuda" if target is None and budget.device is not None else "cpu")
    decoding = measured_decoding(config.decoder, shape.image or 224)
    rates = feeding_rates(shape, target, device, decoding.per_core)
    print_feeding(console, rates, decoding, budget.ranks // args.tp)
    print_pixels(console, images, shape.image or 224, budget.disk)
    for problem in budget.problems:
        console.print(f"[bold red]does not fit:[/] {problem}", highlight=False, soft_wrap=True)
    console.print(f"{'does not fit' if budget.problems else 'fits'} {budget.name}")
    return 0


def print_feeding(console, rates: dict, decoding, copies: int):
    """The decode rate the loader is expected to reach per rank, beside the forward's, per
    rank and over the ``copies`` data-parallel copies of the model (the rate the expected time
    assumes)."""
    line = (
        f"feeding: {rates['workers']} decoding workers per rank × {decoding.per_core:,.0f} img/s "
        f"({decoding.decoder} decoder, one core, measured here on ImageNet-sized JPEGs), about "
        f"{rates['decode']:,.0f} img/s"
    )
    if rates["forward"]:
        verdict = (
            "keeps up"
            if rates["decode"] >= rates["forward"]
            else (
                f"the device waits about {1 - rates['decode'] / rates['forward']:.0%} of the time"
            )
        )
        line += f"; the forward takes about {rates['forward']:,.0f} img/s per rank ({verdict})"
        if copies > 1:
            line += f", {rates['forward'] * copies:,.0f} img/s over {copies} data-parallel ranks"
    console.print(
        line + " (estimates; benchmarks.gpu_check measures both)", highlight=False, soft_wrap=True
    )


def print_pixels(console, images: int, size: int, free: int | None):
    """The disk the pixel cache of the splits' evaluation views takes, and whether ``--pixels
    auto`` keeps it."""
    from evalkit.cache.pixels import FREE_SHARE
    from evalkit.core.budget import human

    needed = images * 3 * size * size
    kept = free is not None and needed <= FREE_SHARE * free
    verdict = (
        f"--pixels auto keeps it: at most {FREE_SHARE:.0%} of the free disk"
        if kept
        else f"--pixels auto does not keep it: over {FREE_SHARE:.0%} of the free disk; "
        "--pixels cache does"
    )
    console.print(
        f"pixel cache: {human(needed)} for {images:,} views at {size}² px, read by the next "
        f"backbone of the same geometry ({verdict})",
        highlight=False,
        soft_wrap=True,
    )
