"""The options of ``evalkit run`` and the ``RunSpec`` they ask for: the one parser of a run's
command line, plain argparse. ``evalkit run`` builds its parser from these, and a sweep reads
its jobs' request keys off each job's own command line with ``parse_run`` (no second copy of
the options, so an option that reaches the key is never missed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from evalkit.data import DECODERS, PIXELS, DataOptions
from evalkit.errors import EvalkitError


def add_run_arguments(run) -> None:
    """Every option of ``evalkit run``, on ``run`` (a parser or subparser)."""
    add_jobs_arguments(run)
    add_data_arguments(run)
    add_execution_arguments(run)


class _RunParser(argparse.ArgumentParser):
    """A run's parser that raises instead of exiting: a bad command line of a sweep's job is
    the sweep's error to report, not a reason to end the process."""

    def error(self, message):
        raise EvalkitError(f"evalkit run: {message}")


def parse_run(argv: list[str]) -> argparse.Namespace:
    """The arguments of an ``evalkit run`` command line (what follows ``run``)."""
    parser = _RunParser(prog="evalkit run", add_help=False)
    add_run_arguments(parser)
    return parser.parse_args(argv)


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
        "--data",
        default=DataOptions.source,
        help="auto | folder | hf | embedded (built-in stand-in data)",
    )
    run.add_argument("--data-dir", type=data_root, help="dataset root (default: $EVALKIT_DATA)")
    run.add_argument(
        "--verify-data",
        action="store_true",
        help="hash every data file again, even those whose memoised stamp is unchanged (slower)",
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
        default=DataOptions.pixels,
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
        default=DataOptions.decoder,
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


def run_spec(args):
    """The command line as a ``RunSpec``: argument names are its flat option names."""
    from evalkit.backbones.options import parse_model_args
    from evalkit.core.spec import RunSpec

    given = {name: getattr(args, name) for name in RunSpec.option_names() if hasattr(args, name)}
    given["model_args"] = parse_model_args(args.model_args)
    given["seeds"] = tuple(args.seed or (0,))
    given["progress"] = not args.quiet
    given["zoo"] = False  # a zoo file's specs are made by zoo_specs
    return RunSpec.of(**given)


def data_root(text: str) -> Path:
    """``--data-dir``'s value: a folder; an empty one is refused, since it most often is an
    unset variable (``--data-dir "$EVALKIT_DATA"``) and would read the data from the current
    folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "empty (an unset variable, such as $EVALKIT_DATA?): pass the folder that holds the "
            "data sets, e.g. --data-dir /data, or export EVALKIT_DATA=/data"
        )
    return Path(text)
