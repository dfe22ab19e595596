"""``evalkit plan``: what a run will cost before it starts — forward passes, feature-cache disk,
host RAM, device memory per rank, and the mode of each stage — against what this machine has,
or a named target (``budget``); and the runner's check that a job fits this machine.

Nothing heavy runs: backbones are sized on the meta device or from one forward pass of one image
(``shapes``); split sizes come from the data when it is there, else from the dataset's
published size (``DATASET_CARDS``). Each task states its stages in ``Task.plan``; the numbers
are estimates of the largest buffers each stage holds, not measurements.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from evalkit.cache.entries import cached_bytes, list_cache
from evalkit.cache.keys import backbone_key
from evalkit.core.budget import Budget, Target
from evalkit.core.rates import ASSUMED_MFU, assumed, measured_forward, measured_matmul
from evalkit.core.shapes import backbone_shape, measured_shape, planning_backbone
from evalkit.core.task import PlanInputs, Shape, Stage
from evalkit.device import default_device, default_dtype
from evalkit.errors import EvalkitError

# Published split sizes, used when the data is not on this machine.
DATASET_CARDS = {
    "imagenet": {"train": 1_281_167, "val": 50_000, "classes": 1000},
    "ade20k": {"train": 20_210, "val": 2_000, "classes": 150},
    "kitti": {"train": 23_158, "val": 652},  # Eigen split
    "nyu": {"train": 24_231, "val": 654},  # the raw-frame training set most depth probes use
    "imagenet-v2": {"test": 10_000, "classes": 1000},
    "imagenet-r": {"test": 30_000, "classes": 200},
    "imagenet-a": {"test": 7_500, "classes": 200},
    "imagenet-real": {"val": 50_000, "classes": 1000},  # an upper bound: unlabelled ones dropped
    "objectnet": {"test": 18_514, "classes": 113},
    "imagenet-c": {"val": 50_000, "classes": 1000},  # per corruption and severity
    # Waymo Open v1 front-camera frames (798 training, 202 validation segments)
    "waymo": {"train": 158_081, "val": 39_987},
    # LiT's image-text pairs: the paper's set is not public; sized as CC12M
    "captions": {"train": 12_423_374},
    # Video: about these sizes; downloaded copies differ as clips leave YouTube.
    "kinetics400": {"train": 240_000, "val": 20_000, "classes": 400},
    "kinetics600": {"train": 390_000, "val": 30_000, "classes": 600},
    "kinetics700": {"train": 545_000, "val": 35_000, "classes": 700},
    "moments": {
        "training": 802_264,
        "validation": 33_900,
        "classes": 339,
    },  # the images of the classes mapped to ImageNet
}


def rate_of(spec: str, shape: Shape, target: Target | None, device: str, dtype: str):
    """The FLOP/s a run of ``spec`` is expected to reach: measured on this machine (the
    backbone's forward; the built-in family's block product), assumed on a named target."""
    if target is not None:
        if not target.peak_tflops:
            return None
        return assumed(target.peak_tflops, max(target.gpus, 1), target.name)
    backbone = None if spec.partition("/")[0] == "vit22b" else planning_backbone(spec)
    if backbone is None or not backbone.info.pools:  # too large to build, or no forward
        return measured_matmul(shape, device, dtype)
    return measured_forward(backbone, shape, device, dtype)


def split_sizes(
    name: str, splits: tuple[str, ...], config, *, card: bool = True
) -> tuple[dict[str, int], int, str]:
    """(sizes, classes, where they came from): the data on disk when it opens, else (with
    ``card``) the dataset card."""
    from evalkit.data.check import open_split_for_check

    try:
        opened = {split: open_split_for_check(name, split, config, None) for split in splits}
    except EvalkitError:
        card = DATASET_CARDS.get(name) if card else None
        if card is None:
            raise EvalkitError(
                f"no data for {name!r} here and no published size known: pass --data-dir"
            ) from None
        sizes = {split: card.get(split, card.get("val", 0)) for split in splits}
        return sizes, card.get("classes", 0), "dataset card"
    classes = len(getattr(opened[splits[0]], "classes", []))
    return {split: len(ds) for split, ds in opened.items()}, classes, "data on disk"


class RunPlan(NamedTuple):
    stages: list[Stage]
    budget: Budget  # checked against the stages
    sources: str  # where the split sizes came from
    shape: Shape  # the backbone's
    images: int  # in the splits the task reads


def plan_run(task, backbone: str, config, options: dict) -> RunPlan:
    """The stages of ``task`` on ``backbone`` (less what the cache holds already), this
    machine's budget (checked), where the split sizes came from, the backbone's shape and the
    images of the splits."""
    target, tp = options.get("target"), options.get("tp") or 1
    ranks = planned_ranks(target, tp)
    device = options.get("device") or ("cuda" if target and target.gpus else default_device())
    dtype = options.get("dtype") or default_dtype(device)
    options = options | {"dtype": dtype, "dp": ranks // tp}
    inputs, sources = plan_inputs(task, backbone, config, options)
    budget = Budget.of(target, ranks) if target else Budget.here(device, config.cache, ranks)
    inputs = replace(inputs, device_bytes=budget.device or 0)
    stages, held = on_disk(
        task.plan(inputs), inputs.sizes, config.cache, setup_key(backbone, dtype)
    )
    budget.check(stages, inputs.shape, cached=held)
    weights = Stage(
        "backbone weights",
        f"{dtype}, tp={options.get('tp', 1)}",
        device_bytes=inputs.shape.weight_bytes_per_rank,
    )
    images = sum(inputs.sizes.values())
    return RunPlan([weights, *stages], budget, sources, inputs.shape, images)


def setup_key(spec: str, dtype: str) -> str | None:
    """The cache's key of the backbone setup a default run of ``spec`` extracts with (seed 0's
    random weights, as the planning backbone has them); None for the built-in family, which a
    plan never builds."""
    if spec.partition("/")[0] == "vit22b":
        return None
    return backbone_key(planning_backbone(spec).info, dtype)


def on_disk(stages: list[Stage], sizes: dict, root: Path, key: str | None):
    """``stages`` less the forward passes whose features are in the cache already, and the
    cache bytes those take: a stage that fills the cache recomputes nothing that a complete
    entry of this backbone setup holds (same split, same row count, pooled or grids alike), so
    neither its passes nor their time are counted."""
    held = held_splits(root, key) if key else set()
    out, kept = [], 0
    for stage in stages:
        dense = "grids" in stage.name  # the two stages that fill the cache: pooled or grids
        rows = sum(n for split, n in sizes.items() if (split, n, dense) in held)
        rows = min(rows, stage.forward_passes) if stage.cache_bytes else 0
        if rows:
            kept += stage.cache_bytes * rows // stage.forward_passes
            left = stage.forward_passes - rows
            mode = "on disk" if not left else f"{rows:,} of {stage.forward_passes:,} on disk"
            stage = replace(stage, mode=f"cached ({mode})", forward_passes=left)
        out.append(stage)
    return out, kept


def held_splits(root: Path, key: str) -> set[tuple[str, int, bool]]:
    """(split, rows, grids) of each complete feature entry of the setup ``key`` under ``root``."""
    return {
        (entry["split"], entry["n"], bool(entry.get("request", {}).get("dense")))
        for entry in list_cache(root)
        if entry["area"] == "features" and entry.get("backbone_key") == key and entry["complete"]
    }


def planned_ranks(target: Target | None, tp: int) -> int:
    """The ranks a run is planned on: on a named target, one per GPU it has (``tp`` ranks per
    model copy, the rest data-parallel: the rate it is timed at assumes every GPU); here,
    ``tp``."""
    if target is None or not target.gpus:
        return tp
    return max(target.gpus // tp, 1) * tp


def plan_inputs(task, backbone: str, config, options: dict) -> tuple[PlanInputs, str]:
    """What ``task.plan`` sees for ``backbone``: split sizes from the data under ``config``
    or the dataset cards, and where they came from."""
    dtype = options.get("dtype") or "bf16"
    shape = backbone_shape(backbone, tp=options.get("tp", 1), dtype=dtype)
    sizes, classes, sources = {}, 0, []
    for name, splits in task.reads().items():
        found, count, source = split_sizes(name, tuple(splits.values()), config)
        sizes |= {key: found[split] for key, split in splits.items()}
        classes = classes or count
        sources.append(f"{name}: {', '.join(f'{s} {n:,}' for s, n in found.items())} ({source})")
    inputs = PlanInputs(
        shape,
        sizes,
        classes,
        options.get("cache_dtype") or dtype,
        options.get("batch_size", 64),
        dp=options.get("dp", 1),
    )
    return inputs, "; ".join(sources)


def stage_flops(stage: Stage, shape: Shape) -> float:
    """FLOPs of a stage: its passes through the backbone at the stage's image size (cost taken
    as proportional to the tokens), three times over when they train it, plus the work of
    models the task trains itself."""
    ratio = (stage.image / shape.image) ** 2 if stage.image and shape.image else 1.0
    per_pass = shape.flops_per_image * ratio * (3 if stage.backward else 1)
    return stage.forward_passes * per_pass + stage.flops


def unfit(task, backbone, ctx, *, tp: int = 1) -> list[str]:
    """What this job would need beyond this machine (empty when it fits, or when its data
    cannot be sized here: the task's own reader then says what is missing)."""
    shape = measured_shape(backbone, dtype=ctx.extract.dtype, tp=tp, flops=False)
    sizes, classes = {}, 0
    try:
        for name, splits in task.reads().items():
            found, count = _sizes_of(name, tuple(splits.values()), ctx)
            sizes |= {key: found[split] for key, split in splits.items()}
            classes = classes or count
    except EvalkitError:
        return []
    # Every rank torchrun started on this host holds its own buffers.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    budget = Budget.here(ctx.device, ctx.data.cache, local_ranks)
    inputs = PlanInputs(
        shape,
        sizes,
        classes or 2,
        ctx.extract.cache_dtype,
        ctx.extract.batch_size,
        ctx.extract.shard_size,
        device_bytes=budget.device or 0,
    )
    stages = task.plan(inputs)
    budget.check(stages, shape)
    if any(p.startswith("feature cache needs") for p in budget.problems) and ctx.extract.cache_dir:
        budget.problems.clear()  # the check counts only what is not cached yet
        key = backbone_key(backbone.info, ctx.extract.dtype)
        budget.check(stages, shape, cached=cached_bytes(ctx.extract.cache_dir, key))
    return budget.problems


# Split sizes by dataset identity: the same files have the same sizes, so each dataset is
# opened once per process however many jobs read it (its identity is walked once per run).
_SIZES: dict[tuple, tuple[dict[str, int], int]] = {}


def _sizes_of(name: str, splits: tuple[str, ...], ctx) -> tuple[dict[str, int], int]:
    key = (name, splits, ctx.data.source, ctx.data_identity(name))
    if key not in _SIZES:
        sizes, classes, _ = split_sizes(name, splits, ctx.data, card=False)
        _SIZES[key] = (sizes, classes)
    return _SIZES[key]


TP_SIZES = (1, 2, 4, 8, 16, 32, 64)


def placement(task, backbone: str, inputs_of, target: Target) -> tuple[int, list[str]]:
    """The fewest ranks (one per GPU) at which ``task`` on ``backbone`` fits ``target``, as
    tensor-parallel × data-parallel ranks, and what does not fit at the largest size tried
    (empty when one fits). ``inputs_of(tp, dp)`` gives the task's plan inputs for that layout
    (None: the model cannot be split so); only the built-in family shards over tensor-parallel
    ranks, and only training stages use data-parallel ones."""
    sharded = backbone.partition("/")[0] == "vit22b"
    problems: list[str] = [f"no layout of {backbone} could be planned"]
    for ranks in TP_SIZES:
        for tp in [t for t in TP_SIZES if t <= ranks and (sharded or t == 1)]:
            inputs = inputs_of(tp, ranks // tp)
            if inputs is None:
                continue
            budget = Budget.of(target, ranks)
            budget.check(task.plan(inputs), inputs.shape)
            if not budget.problems:
                return ranks, []
            problems = budget.problems
    return TP_SIZES[-1], problems


def feeding_rates(shape: Shape, target: Target | None, device: str, per_core: float) -> dict:
    """Images per second a rank's decoding workers are expected to deliver at ``per_core``
    images a second each (``rates.measured_decoding``), beside what the device's forward is
    expected to take (None where the device's peak is unknown): where the first is lower, the
    device waits for data. ``benchmarks.gpu_check`` measures both on a GPU."""
    from evalkit.device import CPUS_PER_GPU, cpus_per_rank, decode_workers

    if target is not None:
        workers = max((CPUS_PER_GPU if target.gpus else cpus_per_rank()) - 1, 1)
        peak = target.peak_tflops
    else:
        workers = decode_workers(device)
        peak = 0.0
    forward = peak * 1e12 * ASSUMED_MFU / shape.flops_per_image if peak else None
    return {"workers": workers, "decode": workers * per_core, "forward": forward}
