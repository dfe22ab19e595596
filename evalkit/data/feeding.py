"""How images reach the device: decoding workers sized from the CPUs this process may use,
pinned host memory so a copy to a GPU overlaps the next batch's decoding, and training batches
decoded ahead of the step that needs them.

A ViT-B/16 forward in bf16 on one recent GPU takes several thousand images a second and one
PIL worker decodes and resizes one to two hundred, so a GPU job wants every core it has: the
CPUs of the process's affinity mask (what a Slurm allocation or ``taskset`` grants), capped by
``SLURM_CPUS_PER_TASK`` and shared by the ranks of one node, with one core left for the process
that drives the device. On a CPU-only job the decoding competes with the forward for the same
cores, so fewer workers are used there (see ``decode_workers``); but even a small split is
decoded in a worker, since per-image work in the main process contends with the forward's
threads (``loader_workers``). Without worker processes (``--workers 0``) a thread of the
process runs a few batches ahead of the forward (``decoded_ahead``), so the two overlap rather
than take turns; where a reader's items are independent of each other (``independent_reads``),
the images of those batches are read by a few threads at once (``read_in_threads``), so the
first batch is ready sooner and the cores the forward leaves idle decode.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from evalkit.device import cpus_per_rank, decode_workers, threads

FEW_BATCHES = 3  # a loader of this many batches or fewer decodes in the process itself
AHEAD = 2  # batches a decoding thread may hold ready beyond the one being computed
MOST_READ_THREADS = 8  # beyond this the interpreter's share of a read stops them scaling
_DONE = object()


def loader_workers(requested: int | None, device: str, batches: int) -> int:
    """``--workers`` when given; else ``decode_workers``, so that per-image work leaves the
    process that runs the forward (its threads would contend with it), except for a few
    batches, where starting a worker costs more than it saves."""
    if requested is not None:
        return requested
    return decode_workers(device) if batches > FEW_BATCHES else 0


def loader_options(device: str, workers: int) -> dict:
    """``DataLoader`` arguments: pinned batches when they go to a GPU (what makes
    ``non_blocking`` copies asynchronous), and each worker a few batches ahead."""
    pin = torch.device(device).type == "cuda" and torch.accelerator.is_available()
    options = {"num_workers": workers, "pin_memory": pin}
    if workers:
        options["prefetch_factor"] = 4
    return options


class _Steps(torch.utils.data.Dataset):
    """The (step, micro) keys of a training run, from ``start``: item i is key i's batch."""

    def __init__(self, batch: Callable, keys: list[tuple[int, int]]):
        self.batch, self.keys = batch, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int):
        return self.keys[index], self.batch(*self.keys[index])


def prefetched(batch: Callable, keys: list[tuple[int, int]], device: str) -> Callable:
    """``batch`` (a pure function of (step, micro), as ``sampled_batches`` makes) answered by
    worker processes that decode ahead, in the order of ``keys``; ``batch`` itself when the
    run is on the CPU or the batch is not marked as safe to decode elsewhere (``decodes``)."""
    if not getattr(batch, "decodes", False) or torch.device(device).type != "cuda" or len(keys) < 3:
        return batch
    loader = torch.utils.data.DataLoader(
        _Steps(batch, keys), batch_size=None, **loader_options(device, decode_workers(device))
    )
    ahead: Iterator = iter(loader)

    def next_batch(step: int, micro: int):
        key, value = next(ahead)
        if tuple(key) != (step, micro):  # a caller that skips a step would train on another
            raise RuntimeError(f"prefetched batch {tuple(key)} asked for as {(step, micro)}")
        return value

    return next_batch


def on_device(batches: Iterable, device: str) -> Iterator[tuple]:
    """(host images, device images, labels) of each (images, labels) batch. On a GPU each
    batch is copied on a side stream while the previous one computes (from pinned memory, so
    the copy runs beside the forward), and the compute stream waits for that copy alone."""
    target = torch.device(device)
    if target.type != "cuda":
        for images, labels in batches:
            yield images, images, labels
        return
    side, ahead = torch.cuda.Stream(target), None
    for images, labels in batches:
        if images.is_cuda:  # broadcast to this rank by its tensor-parallel group: already there
            yield images, images, labels
            continue
        with torch.cuda.stream(side):
            pinned = images if images.is_pinned() else images.pin_memory()
            moved = pinned.to(target, non_blocking=True)
        if ahead is not None:
            yield ahead
        compute = torch.cuda.current_stream(target)
        compute.wait_stream(side)
        moved.record_stream(compute)  # its memory is the compute stream's once the copy is done
        ahead = (images, moved, labels)
    if ahead is not None:
        yield ahead


def decoded_ahead(batches: Iterable, depth: int = AHEAD) -> Iterator:
    """The items of ``batches`` in their order, produced by one thread that runs up to
    ``depth`` items ahead of the caller. Decoding (JPEG, resize, video frames) releases the
    interpreter, so it proceeds beside the forward on another core. An error raised while
    producing an item is raised here, as it was raised; a caller that stops early stops the
    thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in batches:
                if not hand_over((item, None)):
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            hand_over((None, exc))
            return
        hand_over((_DONE, None))

    thread = threading.Thread(target=produce, name="evalkit-decode", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()


def independent_reads(dataset) -> bool:
    """Whether ``dataset`` says its items may be read by several threads at once: each item a
    pure function of its index, read from its own file (no shared handle, no shared random
    state). A reader says so with the class attribute ``independent_reads = True``."""
    return bool(getattr(dataset, "independent_reads", False))


def read_threads() -> int:
    """Threads that read images when there are no worker processes: this rank's cores (a
    bounded window keeps them from running far ahead of a forward that needs the cores)."""
    return max(1, min(cpus_per_rank(), MOST_READ_THREADS))


def read_in_threads(
    dataset, batches: Iterable[list[int]], count: int, depth: int = AHEAD
) -> Iterator:
    """The collated items of each batch of indices, in order, as ``DataLoader`` collates them;
    the items themselves read by ``count`` threads, each on one torch thread, at most
    ``depth + 1`` batches ahead of the caller. Which thread reads an item changes when it is
    ready, never its bytes. An error raised reading an item is raised here, as it was raised,
    after every batch before it; a caller that stops early cancels what is left."""
    from torch.utils.data import default_collate

    upcoming = iter(batches)
    pending: deque[list[Future]] = deque()
    pool = ThreadPoolExecutor(count, thread_name_prefix="evalkit-read")

    def submit_next():
        batch = next(upcoming, None)
        if batch is not None:
            pending.append([pool.submit(_read_item, dataset, index) for index in batch])

    try:
        for _ in range(depth + 1):
            submit_next()
        while pending:
            items = [future.result() for future in pending[0]]  # an error leaves it pending
            pending.popleft()
            submit_next()
            yield default_collate(items)
    finally:
        for future in (f for futures in pending for f in futures):
            future.cancel()
        pool.shutdown(wait=True)


def _read_item(dataset, index: int):
    with threads(1):  # several readers at once: each on its own core, not splitting one
        return dataset[index]
