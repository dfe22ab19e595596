"""What the dense tasks share (segmentation.py, depth.py): frozen multi-layer patch grids from
the feature cache (4 evenly spaced layers, e.g. [2, 5, 8, 11] of 12 — DPT's taps — extracted
once and shared by every head, read a batch at a time), seeded hashed training subsets, a
head trained by ``evalkit.heads.train``, and a PNG picture grid (input / prediction / ground truth)
of a few validation images written next to the rows."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from evalkit.cache.feature_set import FeatureSet
from evalkit.cache.settings import FeatureRequest
from evalkit.core.task import BYTES, NON_NEGATIVE, POSITIVE, Stage, Task, setting
from evalkit.errors import EvalkitError
from evalkit.heads.train import train
from evalkit.schedule import Schedule, declared_schedule, head_warmup
from evalkit.seeds import seeded_build


@dataclass(frozen=True)
class DenseSettings(Task):
    """Settings every dense task has; defaults fit a CPU (see the task modules for the
    paper's scale)."""

    image_size: int = setting(224, POSITIVE)  # and at least the patch size (checked at run)
    steps: int = setting(300, POSITIVE)
    batch_size: int = setting(8, POSITIVE)
    lr: float = setting(1e-3, POSITIVE)
    weight_decay: float = setting(1e-4, NON_NEGATIVE)
    channels: int = setting(64, POSITIVE)  # UperNet decoder / DPT fusion width
    cache_budget_gb: float = setting(8.0, NON_NEGATIVE)

    trains_in_loop: ClassVar[bool] = False  # over the budget: the backbone in the head's loop

    def build_head(self, dims: list[int]) -> torch.nn.Module:
        raise NotImplementedError

    def train_images(self, available: int) -> int:
        return available

    def fits_cache(self, images: int, embed_dim: int, patch: int) -> bool:
        """Whether the 4 tapped layers' float32 grids of ``images`` fit ``cache_budget_gb``."""
        grid = self.image_size // patch
        return images * 4 * embed_dim * grid * grid * 4 / 1e9 <= self.cache_budget_gb

    def plan(self, inputs) -> list[Stage]:
        """Grids of 4 layers per image: cached and read a batch at a time when they fit
        ``cache_budget_gb``, else computed per batch with the backbone in the head's loop."""
        grid = self.image_size // inputs.shape.patch
        per_image = 4 * inputs.shape.embed_dim * grid * grid
        n_train, n_val = self.train_images(inputs.sizes["train"]), inputs.sizes["val"]
        cached = self.fits_cache(n_train + n_val, inputs.shape.embed_dim, inputs.shape.patch)
        tokens_ratio = (grid * inputs.shape.patch / inputs.shape.image) ** 2
        extract = Stage(
            "extract grids",
            "cached" if cached else "in memory (over cache_budget_gb)",
            forward_passes=n_train + n_val,
            cache_bytes=(n_train + n_val) * per_image * BYTES[inputs.storage] if cached else 0,
            device_bytes=int(
                inputs.batch_size * inputs.shape.activation_bytes_per_image * tokens_ratio
            ),
        )
        targets = n_train * (4 * grid) ** 2 * 8
        name = f"train {getattr(self, 'head', '')} head"
        if not cached and self.trains_in_loop:
            batch = self.batch_size * (per_image * 4 + (4 * grid) ** 2 * 8)
            loop = Stage(
                name,
                "backbone in the loop",
                forward_passes=self.steps * self.batch_size + n_val,
                host_bytes=2 * batch,
                device_bytes=3 * batch + extract.device_bytes,
            )
            return [loop]
        if cached:  # read a batch at a time, one shard of at most SHARD_BYTES held
            head = Stage(
                name,
                "grids read per batch",
                host_bytes=SHARD_BYTES + 2 * self.batch_size * per_image * 4,
                device_bytes=3 * self.batch_size * per_image * 4,
            )
            return [extract, head]
        head = Stage(
            name,
            "grids held in RAM",
            host_bytes=(n_train + n_val) * per_image * BYTES[inputs.storage] + targets,
            device_bytes=3 * self.batch_size * per_image * 4,
        )
        return [extract, head]

    def new_head(self, feats: CachedGrids, ctx) -> torch.nn.Module:
        """This task's head for these grids, initialised from the seed alone."""
        dims = [g.shape[1] for g in feats.take([0])]
        return seeded_build(lambda: self.build_head(dims), ctx.seed, "head-weights").to(ctx.device)

    def head_schedule(self, seed: int) -> Schedule:
        """The head's schedule, for the head trainer and for the backbone-in-the-loop mode
        alike: the task's steps, batch, LR and decay, the dense recipes' β2 and clipping."""
        return declared_schedule(
            self, seed, warmup=head_warmup(self.steps), b2=0.999, clip=35.0, checkpoint_every=10**9
        )

    def train_head(self, head, step_loss, n: int, ctx) -> torch.nn.Module:
        config = self.head_schedule(ctx.seed)
        train(head, step_loss, n, config, device=ctx.device, progress=ctx.extract.progress)
        return head


def tap_layers(depth: int, taps: int = 4) -> tuple[int, ...]:
    """Evenly spaced block indices ending at the last: 12 → (2, 5, 8, 11), 24 → (5, 11, 17, 23)."""
    return tuple(depth * (i + 1) // taps - 1 for i in range(taps))


def hashed_subset(names: list[str], fraction: float, seed: int) -> list[int] | None:
    """The first ⌈n·fraction⌉ images in the order of sha256(seed:name): the same images for
    every backbone, nested across fractions (1/16 ⊂ 1/8 ⊂ …). None for the full set."""
    if fraction >= 1:
        return None
    order = sorted(
        range(len(names)), key=lambda i: hashlib.sha256(f"{seed}:{names[i]}".encode()).hexdigest()
    )
    return sorted(order[: max(1, math.ceil(len(names) * fraction))])


SHARD_BYTES = 64 * 2**20


@dataclass
class CachedGrids:
    """A split's patch grids, one (D, h, w) map per tapped layer and image, read a batch at a
    time from the feature cache's shards (the cache holds one shard in memory), never
    concatenated for the whole split."""

    feats: FeatureSet

    def layers(self) -> list[str]:
        names = self.feats.keys()
        return sorted((k for k in names if k.startswith("grid.")), key=lambda k: int(k[5:]))

    def take(self, indices, device: str = "cpu") -> list[torch.Tensor]:
        """The grids of images ``indices``, one (B, D, h, w) float tensor per tapped layer."""
        return [self.feats.take(indices, key).to(device).float() for key in self.layers()]

    def __len__(self) -> int:
        return len(self.feats)


def dense_features(
    task, backbone, ctx, dataset, *, split: str, subset=None
) -> tuple[CachedGrids, bool]:
    """Grids of the tapped layers, cached when they fit ``task.cache_budget_gb``."""
    if task.image_size < backbone.info.patch_size:
        raise EvalkitError(
            f"task {task.name}: image_size={task.image_size} is smaller than the patch size of "
            f"{backbone.info.name} ({backbone.info.patch_size})"
        )
    layers = tap_layers(backbone.info.depth)
    request = FeatureRequest(layers=layers, pool="mean", dense=True)
    n = len(dataset) if subset is None else len(subset)
    cached = task.fits_cache(n, backbone.info.embed_dim, backbone.info.patch_size)
    if not cached:  # too big for the disk budget: extract into memory only
        ctx = replace(ctx, extract=replace(ctx.extract, cache_dir=None))
    # Shards of at most SHARD_BYTES: a batch read holds one shard, whatever the split's size.
    grid = task.image_size // backbone.info.patch_size
    per_image = len(layers) * backbone.info.embed_dim * grid * grid * 4
    rows = max(1, min(ctx.extract.shard_size, SHARD_BYTES // per_image))
    ctx = replace(ctx, extract=replace(ctx.extract, shard_size=rows))
    feats = ctx.features(backbone, dataset, split=split, request=request, subset=subset)
    return CachedGrids(feats), cached


def resize_to(x: torch.Tensor, size) -> torch.Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


# --- pictures -----------------------------------------------------------------------------------

PALETTE = np.random.default_rng(7).integers(40, 255, size=(256, 3)).astype(np.uint8)
PALETTE[255] = 0  # ignored pixels are black


def colour_labels(labels: np.ndarray) -> np.ndarray:
    return PALETTE[np.clip(labels, 0, 255)]


RAMP = np.array(
    [[48, 18, 59], [70, 134, 251], [27, 229, 181], [164, 252, 60], [251, 185, 56], [122, 4, 3]],
    float,
)


def colour_depth(depth: np.ndarray, valid: np.ndarray, max_depth: float) -> np.ndarray:
    """Near = dark blue … far = dark red (a turbo-like ramp); invalid pixels black."""
    position = np.clip(depth / max_depth, 0, 1) * (len(RAMP) - 1)
    low = np.floor(position).astype(int).clip(0, len(RAMP) - 2)
    frac = (position - low)[..., None]
    rgb = RAMP[low] * (1 - frac) + RAMP[low + 1] * frac
    return np.where(valid[..., None], rgb, 0).astype(np.uint8)


COLUMNS = ("input", "prediction", "ground truth")
TITLE_HEIGHT = 16


def save_picture_grid(rows: list[list[np.ndarray]], path: Path, titles=COLUMNS) -> Path:
    """Rows of equally sized RGB arrays (input, prediction, ground truth) → one PNG, each
    column named above its first tile."""
    from PIL import ImageDraw

    height, width = rows[0][0].shape[:2]
    top = TITLE_HEIGHT
    canvas = np.zeros((top + len(rows) * (height + 4), len(rows[0]) * (width + 4), 3), np.uint8)
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            tile = np.asarray(Image.fromarray(tile).resize((width, height), Image.NEAREST))
            y, x = top + r * (height + 4), c * (width + 4)
            canvas[y : y + height, x : x + width] = tile
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    for c, title in enumerate(titles[: len(rows[0])]):
        draw.text((c * (width + 4) + 2, 2), title, fill=(255, 255, 255))
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


def picture_path(ctx, task_name: str, backbone_name: str, head: str) -> Path | None:
    if ctx.artifacts is None:
        return None
    slug = f"{task_name}--{backbone_name}--{head}".replace("/", "_")
    return Path(ctx.artifacts) / f"{slug}.png"
