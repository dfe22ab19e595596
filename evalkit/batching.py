"""Batches that back off: on an out-of-memory error a batch is split in halves and the part
that failed is retried, down to a floor, and later batches start at the size that fitted (as
timm's ``check_batch_size_retry``/``decay_batch_step`` and lm-eval's ``--batch_size auto`` do).
Errors that are not about memory are raised as they are.

Frozen work (feature extraction, prediction) gives the same numbers at any batch size: each
image's forward does not depend on its neighbours in the batch (tests/test_batching.py shows
the features of a backed-off extraction equal those of one that fitted). The size that was used
is recorded in each row's provenance (``batch_size``).

A training step that runs out of memory is done again from the start in pieces whose gradients
are accumulated (each piece's loss weighted by its share of the batch), so the step still sees
the whole batch: the same step for losses that are means over images, a different one for a
contrastive loss (LiT's softmax then contrasts within each piece). The piece size is recorded
in the row's provenance (``training_batch_piece``) whenever a step had to be split.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Callable, Iterator
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

    def whole(self, run: Callable[[int], float], count: int, what: str) -> float:
        """``run(size)`` does all ``count`` items of one step in pieces of ``size``; after an
        out-of-memory error the whole step is done again in smaller pieces (a backward pass
        stopped halfway leaves gradients that cannot be trusted)."""
        while True:
            size = self.used(count)
            try:
                return run(size)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self._halve(size, what)

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


_JOB_LIMITS: contextvars.ContextVar[dict[str, BatchLimit] | None] = contextvars.ContextVar(
    "job_limits", default=None
)


@contextlib.contextmanager
def job_limits() -> Iterator[dict[str, BatchLimit]]:
    """The batch limits of one job (``limit_for``), read back into its rows' provenance."""
    limits: dict[str, BatchLimit] = {}
    token = _JOB_LIMITS.set(limits)
    try:
        yield limits
    finally:
        _JOB_LIMITS.reset(token)


def limit_for(what: str) -> BatchLimit:
    """The current job's limit for ``what`` (a fresh one outside a job)."""
    limits = _JOB_LIMITS.get()
    return BatchLimit() if limits is None else limits.setdefault(what, BatchLimit())
