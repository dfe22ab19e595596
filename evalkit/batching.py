"""Batches that back off: on an out-of-memory error a batch is split in halves and the part
that failed is retried, down to a floor, and later batches start at the size that fitted (as
timm's ``check_batch_size_retry``/``decay_batch_step`` and lm-eval's ``--batch_size auto`` do).
Errors that are not about memory are raised as they are.

Frozen work (feature extraction, prediction) gives the same numbers at any batch size: each
image's forward does not depend on its neighbours in the batch (tests/test_batching.py shows
the features of a backed-off extraction equal those of one that fitted). The size that was used
is recorded in each row's provenance (``batch_size``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evalkit.errors import EvalkitError, warn

MEMORY_ERRORS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "can't allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError``, and the RuntimeErrors cuBLAS and the CPU allocator raise."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in MEMORY_ERRORS)


@dataclass
class BatchLimit:
    """The largest batch known to fit this run (None until one did not), never below ``floor``."""

    size: int | None = None
    floor: int = 1

    def used(self, asked: int) -> int:
        return min(asked, self.size) if self.size else asked

    def pieces(self, work: Callable[[int, int], object], count: int, what: str) -> list:
        """``work(start, stop)`` over ``count`` items, in pieces that fit: the results in order."""
        results, start = [], 0
        while start < count:
            stop = min(count, start + self.used(count))
            try:
                results.append(work(start, stop))
                start = stop
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self._halve(stop - start, what)
        return results

    def _halve(self, failed: int, what: str) -> None:
        if failed <= self.floor:
            raise EvalkitError(
                f"{what}: out of memory even at a batch of {failed}: use a device with more "
                "memory, --dtype bf16, or a smaller model"
            ) from None
        self.size = max(self.floor, failed // 2)
        release_memory()
        warn(f"{what}: out of memory at a batch of {failed}; going on in batches of {self.size}")


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
