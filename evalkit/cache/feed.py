"""Where an extraction's images come from: ``Feed`` reads the shards whose decoded views the
pixel cache holds, decodes the others (by the loader's worker processes, several threads, or in
turn), and keeps what it decoded for the next backbone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from evalkit import distributed
from evalkit.cache.pixels import PixelStore
from evalkit.cache.settings import ExtractSettings
from evalkit.data.feeding import (
    decoded_ahead,
    independent_reads,
    loader_options,
    loader_workers,
    read_in_threads,
    read_threads,
)
from evalkit.storage import shards as files


@dataclass
class Feed:
    """Where a split's images come from: decoded by the loader, or read from the pixel cache
    for the shards it holds (``cached``)."""

    dataset: object
    shards: list[list[int]]
    settings: ExtractSettings
    pixels: PixelStore | None = None
    cached: set[int] = field(default_factory=set)

    def order(self, todo: list[int]) -> list[int]:
        """Shards whose views are cached first, then those to decode (looked for only when
        there is something to compute; each is checked as it is read)."""
        if todo and self.pixels is not None:
            self.cached = self.pixels.ready()
        return [i for i in todo if i in self.cached] + [i for i in todo if i not in self.cached]

    def batches(self, todo: list[int]) -> list[list[int]]:
        size = self.settings.batch_size
        return [
            self.shards[i][j : j + size] for i in todo for j in range(0, len(self.shards[i]), size)
        ]

    def images(self, todo: list[int]):
        """(images, labels) of the ``todo`` shards' batches, in that order: without worker
        processes, read and decoded by a thread a few batches ahead of the forward."""
        decode = self.batches([i for i in todo if i not in self.cached])
        workers = loader_workers(self.settings.workers, self.settings.device, len(decode))
        batches = self._batches(todo, decode, workers)
        return batches if workers else decoded_ahead(batches)

    def _batches(self, todo: list[int], decode: list[list[int]], workers: int):
        size = self.settings.batch_size
        for index in (i for i in todo if i in self.cached):
            shard = self.pixels.read(index)
            if shard is None:  # damaged (reported and removed): its images are decoded
                self.cached.discard(index)
                yield from self._decoded(self.batches([index]), workers=0)
                continue
            for start in range(0, len(shard["labels"]), size):
                yield shard["images"][start : start + size], shard["labels"][start : start + size]
        if decode:
            yield from self._decoded(decode, workers)

    def _decoded(self, batches: list[list[int]], workers: int):
        """The batches decoded by worker processes, or in this process: by several threads
        where the reader allows it, else in turn."""
        options = loader_options(self.settings.device, workers)
        if workers or not independent_reads(self.dataset):
            return torch.utils.data.DataLoader(self.dataset, batch_sampler=batches, **options)
        decoded = read_in_threads(self.dataset, batches, read_threads())
        return map(_pinned, decoded) if options["pin_memory"] else decoded

    def source(self, index: int) -> str | None:
        """The cached shard the views of shard ``index`` were read from (None: decoded from
        the image files, whose identity is in the entry's key)."""
        if index not in self.cached:
            return None
        folder = self.pixels.folder
        return f"{folder.parent.name}/{folder.name}/{files.shard_path(folder, index).name}"

    def keep(self, index: int, images: list[torch.Tensor], labels: torch.Tensor):
        """Keep a decoded shard's views for the next backbone (on the rank that writes)."""
        if self.pixels is not None and index not in self.cached and distributed.current().writer:
            self.pixels.save(index, torch.cat(images), labels)


def _pinned(batch: list) -> list:
    """A collated batch with its tensors in pinned memory, as the loader pins them."""
    return [item.pin_memory() if isinstance(item, torch.Tensor) else item for item in batch]
