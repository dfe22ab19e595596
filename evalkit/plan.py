"""``evalkit plan``: what a run will cost before it starts — forward passes, feature-cache disk,
host RAM, device memory per rank, and the mode of each stage — against what this machine has.

Nothing heavy runs: the built-in ViT-22B family is sized on the meta device (no weights), other
backbones are built as for a run; split sizes come from the data when it is there, else from the
dataset's published size (``DATASET_CARDS``). Each task states its stages in ``Task.plan``;
the numbers are estimates of the largest buffers each stage holds, not measurements.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.task import BYTES, PlanInputs, Shape, Stage

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


@dataclass
class Budget:
    """What this machine has: host RAM, device memory per rank, free disk at the cache."""

    host: int
    device: int | None
    disk: int
    problems: list[str] = field(default_factory=list)

    @classmethod
    def here(cls, device: str, cache: Path) -> Budget:
        from evalkit.backbones.vit22b import available_bytes

        disk_root = next(p for p in [Path(cache), *Path(cache).parents] if p.exists())
        device_bytes = available_bytes(device) if device.startswith("cuda") else None
        return cls(available_bytes("cpu") or 0, device_bytes, shutil.disk_usage(disk_root).free)

    def check(self, stages: list[Stage], shape: Shape):
        disk = sum(s.cache_bytes for s in stages)
        if disk > self.disk:
            self.problems.append(f"feature cache needs {human(disk)}, {human(self.disk)} free")
        weights = shape.weight_bytes_per_rank  # loaded for the whole run
        for stage in stages:
            # Without an accelerator the weights and the "device" buffers are in RAM too.
            host = stage.host_bytes + (
                0 if self.device is not None else weights + stage.device_bytes
            )
            if host > 0.9 * self.host:
                self.problems.append(
                    f"{stage.name} holds {human(host)} in RAM with the weights, "
                    f"{human(self.host)} available"
                )
            on_device = stage.device_bytes + weights
            if self.device is not None and on_device > 0.9 * self.device:
                self.problems.append(
                    f"{stage.name} needs {human(on_device)} per device, {human(self.device)} free"
                )


def human(n: float) -> str:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def backbone_shape(spec: str, *, tp: int, dtype: str) -> Shape:
    """vit22b sizes from the planner on the meta device; other backbones built once."""
    family, _, variant = spec.partition("/")
    if family == "vit22b":
        from evalkit.models import vit22b
        from evalkit.parallel.planner import plan

        size = variant or "22b"
        if size not in vit22b.SIZES:
            raise EvalkitError(f"unknown vit22b size {size!r}")
        cfg = vit22b.config(size)
        p = plan(cfg, tp=tp, dtype=dtype)
        return Shape(spec, cfg.width, cfg.depth, cfg.patch, cfg.image, p.bytes_per_rank,
                     p.activation_bytes_per_image, p.flops_per_image)  # fmt: skip
    from evalkit.backbones import BackboneOptions, load_backbone

    return shape_of(load_backbone(spec, BackboneOptions(random_init=True)).info, dtype=dtype)


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


def plan_run(task, backbone: str, config, options: dict) -> tuple[list[Stage], Budget, str, Shape]:
    """The stages of ``task`` on ``backbone``, this machine's budget (checked), where the
    split sizes came from, and the backbone's shape."""
    device = options.get("device") or env_device()
    dtype = options.get("dtype") or ("bf16" if device.startswith("cuda") else "fp32")
    inputs, sources = plan_inputs(task, backbone, config, options | {"dtype": dtype})
    stages = task.plan(inputs)
    budget = Budget.here(device, config.cache)
    budget.check(stages, inputs.shape)
    weights = Stage("backbone weights", f"{dtype}, tp={options.get('tp', 1)}",
                    device_bytes=inputs.shape.weight_bytes_per_rank)  # fmt: skip
    return [weights, *stages], budget, sources, inputs.shape


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
    inputs = PlanInputs(shape, sizes, classes, options.get("cache_dtype") or dtype,
                        options.get("batch_size", 64))  # fmt: skip
    return inputs, "; ".join(sources)


def shape_of(info, *, dtype: str, tp: int = 1) -> Shape:
    """The shape of a loaded backbone (its weights split over ``tp`` ranks)."""
    tokens = (info.preprocess.size // max(info.patch_size, 1)) ** 2 + info.num_prefix_tokens
    activation = 16 * tokens * info.embed_dim * BYTES[dtype]  # a block's live tensors, roughly
    # Two FLOPs per weight per token: attention scores are left out, a few percent at ViT sizes
    return Shape(info.name, info.embed_dim, info.depth, info.patch_size, info.preprocess.size,
                 info.params * BYTES[dtype] // tp, activation, 2 * info.params * tokens)  # fmt: skip


def stage_flops(stage: Stage, shape: Shape) -> float:
    """FLOPs of a stage: its passes through the backbone at the stage's image size (cost taken
    as proportional to the tokens), three times over when they train it, plus the work of
    models the task trains itself."""
    ratio = (stage.image / shape.image) ** 2 if stage.image and shape.image else 1.0
    per_pass = shape.flops_per_image * ratio * (3 if stage.backward else 1)
    return stage.forward_passes * per_pass + stage.flops


def unfit(task, info, ctx, *, tp: int = 1) -> list[str]:
    """What this job would need beyond this machine (empty when it fits, or when its data
    cannot be sized here: the task's own reader then says what is missing)."""
    shape = shape_of(info, dtype=ctx.extract.dtype, tp=tp)
    sizes, classes = {}, 0
    try:
        for name, splits in task.reads().items():
            found, count = _sizes_of(name, tuple(splits.values()), ctx)
            sizes |= {key: found[split] for key, split in splits.items()}
            classes = classes or count
    except EvalkitError:
        return []
    inputs = PlanInputs(shape, sizes, classes or 2, ctx.extract.cache_dtype,
                        ctx.extract.batch_size, ctx.extract.shard_size)  # fmt: skip
    stages = task.plan(inputs)
    budget = Budget.here(ctx.extract.device, ctx.data.cache)
    budget.check(stages, shape)
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


def env_device() -> str:
    import torch

    return os.environ.get("EVALKIT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
