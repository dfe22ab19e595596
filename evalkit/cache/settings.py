"""What a feature extraction is asked for: which features (``FeatureRequest``: layers, pooling,
dense grids, frames per clip) and how they are computed and kept (``ExtractSettings``: cache,
batch, workers, device, compute and storage dtypes, shard size).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evalkit.batching import BatchLimit

STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class FeatureRequest:
    layers: tuple[int, ...] = (-1,)
    pool: str = "cls"
    dense: bool = False
    frames: int | None = None  # frames per clip for video datasets; None for images

    def key_material(self) -> dict:
        """What enters the cache key (``frames`` only when set, so image keys stay stable)."""
        material = asdict(self)
        if self.frames is None:
            del material["frames"]
        return material


@dataclass(frozen=True)
class ExtractSettings:
    cache_dir: Path | None = None  # None: no cache (--no-cache)
    batch_size: int = 64
    workers: int | None = None  # None: worker processes only when the data is large
    device: str = "cpu"
    dtype: str = "fp32"  # fp32 | bf16 (autocast)
    cache_dtype: str = "fp32"  # what features are stored and returned in: fp32 | bf16 | fp16
    shard_size: int = 1024
    progress: bool = True
    verify_cache: bool = False  # re-read every cached shard, whatever its stamp
    read_only: bool = False  # the cache is read, never written: what it lacks stays in memory
    # the batch that fits: halved on an out-of-memory error, kept for the run's later batches
    limit: BatchLimit = field(default_factory=BatchLimit, compare=False, repr=False)

    @property
    def writable_cache(self) -> Path | None:
        """Where a task may keep what it computes (checkpoints, classifiers); None when the
        cache is off or read-only."""
        return None if self.read_only else self.cache_dir
