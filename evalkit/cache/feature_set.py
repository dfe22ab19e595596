"""The features of one split as a task reads them: ``FeatureSet``, a view over the shards of a
cache entry (or over shards held in memory when nothing is cached) that reads one shard at a
time.
"""

from __future__ import annotations

import torch

from evalkit.storage import shards as files


class FeatureSet:
    """The features of one split: a view over its shards — dicts in memory when nothing is
    cached, else verified shard files read one at a time when asked for.

    Features come in the dtype they are stored in (``ExtractSettings.cache_dtype``); tasks
    compute in float32 or wider. ``labels`` (N,) is always in memory. ``take(indices)`` and ``chunks()`` hold at most one
    shard beyond what they return; ``pooled`` ((N, D), or (N, T, D) for clips of T frames) and
    ``grids`` (per layer (N, D, h, w), dense only) concatenate the whole split, for tasks whose
    split fits in memory."""

    def __init__(self, parts: list, *, from_cache=False, dataset_id=""):
        self.parts = parts  # per shard: a dict of tensors, or the Path of a verified file
        part_labels = [files.read_labels(p) for p in parts]
        self.labels = torch.cat(part_labels).long() if parts else torch.empty(0, dtype=torch.long)
        sizes = [len(labels) for labels in part_labels]
        self.starts = torch.tensor([0, *sizes]).cumsum(0)[:-1] if parts else torch.zeros(0)
        self.from_cache, self.dataset_id = from_cache, dataset_id
        self.extracted = 0  # rows computed for this call rather than read from the cache
        self._held: tuple[int, dict] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def keys(self) -> list[str]:
        return _part_keys(self.parts[0]) if self.parts else ["pooled"]

    def shard(self, index: int) -> dict:
        part = self.parts[index]
        if isinstance(part, dict):
            return part
        if self._held is None or self._held[0] != index:
            self._held = (index, files.read_shard(part))
        return self._held[1]

    def chunks(self, key: str = "pooled"):
        """Each shard's ``key`` tensor in order: the split without holding it whole."""
        for index in range(len(self.parts)):
            yield self.shard(index)[key]

    def take(self, indices, key: str = "pooled", read=None) -> torch.Tensor:
        """Rows ``indices`` (in that order), reading only the shards that hold them; ``read``
        (a shard's index → its ``key`` tensor) stands in for reading a shard, e.g. a cache."""
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if not len(idx):
            return torch.empty(0, 0)
        read = read or (lambda index: self.shard(index)[key])
        shard_of = self._shard_of(idx)
        out = None
        for index in shard_of.unique().tolist():
            mask = shard_of == index
            rows = read(index)[idx[mask] - self.starts[index]]
            if out is None:
                out = rows.new_empty((len(idx), *rows.shape[1:]))
            out[mask] = rows
        return out

    def by_shard(self, indices, key: str = "pooled"):
        """(rows, indices) per shard for sorted ``indices``: each shard read once, in order."""
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        shard_of = self._shard_of(idx)
        for index in shard_of.unique().tolist():
            mine = idx[shard_of == index]
            yield self.shard(index)[key][mine - self.starts[index]], mine

    def _shard_of(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.starts, idx, right=True) - 1

    @property
    def pooled(self) -> torch.Tensor:
        return torch.cat(list(self.chunks("pooled"))) if self.parts else torch.empty(0, 0)

    @property
    def grids(self) -> list[torch.Tensor]:
        layers = sorted(k for k in self.keys() if k.startswith("grid."))
        return [torch.cat(list(self.chunks(k))) for k in layers]


def _part_keys(part) -> list[str]:
    if isinstance(part, dict):
        return list(part)
    from safetensors import safe_open

    with safe_open(str(part), framework="pt") as f:
        return list(f.keys())
