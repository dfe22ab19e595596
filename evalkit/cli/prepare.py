"""``evalkit prepare``: the dataset owners' official files → the layouts evalkit's tasks read
(docs/data.md), by the preparers in ``evalkit.data.prepare``. Each resumes (finished files are
kept), shows a progress bar and prints what it wrote and what it skipped, and why."""

from __future__ import annotations

import os
from pathlib import Path

from evalkit.errors import EvalkitError

KINDS = ("waymo", "imagenet", "imagenet-c", "model-vs-human", "celeba")


def add_prepare_command(sub) -> None:
    prepare = sub.add_parser("prepare", help="turn official dataset files into evalkit's layouts")
    kinds = prepare.add_subparsers(dest="kind", required=True)
    waymo = kinds.add_parser(
        "waymo", help="Waymo Open v2 parquet → waymo_depth/ (image, depth, mask)"
    )
    waymo.add_argument(
        "source", type=Path, help="the v2 root: <split>/<component>/<segment>.parquet"
    )
    waymo.add_argument("dest", type=Path, help="data root to write waymo_depth/ under")
    waymo.add_argument(
        "--cameras", default="FRONT", help="comma-separated camera names (default FRONT)"
    )
    waymo.add_argument("--max-depth", type=float, default=80.0, help="drop returns beyond (metres)")
    waymo.add_argument(
        "--splits", default="training,validation", help="v2 split folders (also: testing)"
    )
    waymo.add_argument(
        "--depth",
        choices=("range", "forward"),
        default="range",
        help="range: distance from the camera centre (the dataset's own tools; default); "
        "forward: along the camera's axis (KITTI's convention)",
    )
    waymo.add_argument(
        "--allow-skips", action="store_true", help="exit 0 even when frames were skipped"
    )
    imagenet = kinds.add_parser(
        "imagenet", help="official ImageNet val (flat + devkit) and train → class folders"
    )
    imagenet.add_argument(
        "source", type=Path, help="folder holding ILSVRC2012_img_val/, the devkit, train"
    )
    imagenet.add_argument("dest", type=Path, help="data root to write imagenet/ under")
    imagenet.add_argument("--copy", action="store_true", help="copy images instead of linking them")
    imagenet.add_argument(
        "--val-only", action="store_true", help="prepare the validation split alone"
    )
    corrupted = kinds.add_parser(
        "imagenet-c", help="write the 15 × 5 ImageNet-C sets of an ImageNet val"
    )
    corrupted.add_argument(
        "--from",
        dest="source",
        type=Path,
        required=True,
        help="ImageNet val in class folders (<wnid>/<image>)",
    )
    corrupted.add_argument(
        "dest", type=Path, help="folder to write <corruption>/<severity>/<wnid>/ under"
    )
    corrupted.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    corrupted.add_argument("--seed", type=int, default=0)
    corrupted.add_argument("--corruptions", help="comma-separated subset (default: all 15)")
    released = {
        "model-vs-human": "the benchmark's folder (datasets/<set>/, raw-data/<set>/*.csv), "
        "checked and linked",
        "celeba": "CelebA's release (list_attr_celeba.txt, list_eval_partition.txt, "
        "img_align_celeba/), checked and linked",
    }
    parsers = [waymo, imagenet, corrupted]
    for kind, about in released.items():
        parser = kinds.add_parser(kind, help=about)
        parser.add_argument("source", type=Path, help=about.split(",")[0])
        parser.add_argument("dest", type=Path, help=f"data root to write {kind}/ under")
        parser.add_argument("--copy", action="store_true", help="copy instead of linking")
        parsers.append(parser)
    for parser in parsers:
        parser.add_argument("--quiet", action="store_true", help="no progress bar")


def tracker(enabled: bool):
    """``track(items, description, total=None)``: the items, advancing a progress bar."""
    from evalkit.progress import ProgressBar

    def track(items, description: str, total: int | None = None):
        items = items if total is not None else list(items)
        with ProgressBar(
            enabled, total if total is not None else len(items), description, unit="item"
        ) as advance:
            for item in items:
                yield item
                advance()

    return track


def cmd_prepare(args, console) -> int:
    track = tracker(not args.quiet)
    if args.kind == "waymo":
        report = _waymo(args, track)
    elif args.kind in ("model-vs-human", "celeba"):
        from evalkit.data.prepare import released

        prepare = {
            "model-vs-human": released.prepare_model_vs_human,
            "celeba": released.prepare_celeba,
        }[args.kind]
        report = prepare(args.source, args.dest, copy=args.copy, progress=track)
    elif args.kind == "imagenet":
        from evalkit.data.prepare.imagenet import prepare_imagenet

        report = prepare_imagenet(
            args.source, args.dest, copy=args.copy, progress=track, val_only=args.val_only
        )
    else:
        from evalkit.data.corruptions import NAMES
        from evalkit.data.prepare.imagenet_c import prepare_imagenet_c

        chosen = tuple(args.corruptions.split(",")) if args.corruptions else NAMES
        report = prepare_imagenet_c(
            args.source,
            args.dest,
            workers=args.workers,
            seed=args.seed,
            progress=track,
            corruptions=chosen,
        )
    for key, value in report.items():
        if key != "options":
            console.print(f"{key}: {value}")
    if args.kind == "waymo" and report["skipped"] and not args.allow_skips:
        console.print(
            f"{sum(report['skipped'].values())} skipped (reasons above): exit 1; pass "
            "--allow-skips to accept them"
        )
        return 1
    return 0


def _waymo(args, track) -> dict:
    from evalkit.data.prepare.waymo import CAMERAS, WaymoOptions, prepare_waymo

    by_name = {name: number for number, name in CAMERAS.items()}
    wanted = [c.strip().upper() for c in args.cameras.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in by_name]
    if unknown or not wanted:
        raise EvalkitError(
            f"unknown Waymo cameras {unknown or wanted}: choose from {', '.join(by_name)}"
        )
    if args.max_depth <= 0:
        raise EvalkitError(f"--max-depth must be positive, got {args.max_depth}")
    splits = tuple(s.strip() for s in args.splits.split(",") if s.strip())
    if not splits:
        raise EvalkitError("--splits names no split (e.g. training,validation,testing)")
    options = WaymoOptions(tuple(by_name[c] for c in wanted), args.max_depth, splits, args.depth)
    return prepare_waymo(args.source, args.dest, options, track)
