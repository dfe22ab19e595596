"""What a feature extraction is asked for: which features (``FeatureRequest``: layers, pooling,
dense grids, frames per clip) and how they are computed and kept (``ExtractSettings``: cache,
batch, workers, device, compute and storage dtypes, shard size), as a command asks for the
latter before its device, dtypes and batch size are known (``ExtractOptions``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evalkit.batching import BatchLimit
from evalkit.storage.identity import cache_root

STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BATCH_SIZE = 64


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
    batch_size: int = BATCH_SIZE
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


@dataclass(frozen=True)
class ExtractOptions:
    """How a command asks its features to be computed and kept; ``settings`` gives one job's
    ``ExtractSettings`` once its device, dtype and batch size are known."""

    cache_dir: Path | None = None  # None: $EVALKIT_CACHE or ~/.cache/evalkit
    no_cache: bool = False
    verify_cache: bool = False  # re-read every cached shard the run uses, whatever its stamp
    batch_size: int | str = BATCH_SIZE  # or "auto": the planner's estimate for the free memory
    workers: int | None = None
    cache_dtype: str | None = None  # how features are stored: None, the run's dtype
    progress: bool = True
    read_only: bool = False  # set by the runner when the cache cannot be written

    @property
    def root(self) -> Path:
        """The cache folder: features, and the data's embedded stand-ins."""
        return Path(self.cache_dir or cache_root())

    def settings(self, device: str, dtype: str, batch_size: int = 0) -> ExtractSettings:
        """One job's settings; ``batch_size`` is the resolved ``--batch-size auto``."""
        return ExtractSettings(
            cache_dir=None if self.no_cache else self.root,
            batch_size=batch_size or self.batch_size,
            workers=self.workers,
            device=device,
            dtype=dtype,
            cache_dtype=self.cache_dtype or dtype,
            progress=self.progress,
            verify_cache=self.verify_cache,
            read_only=self.read_only,
        )
