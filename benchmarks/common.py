"""Helpers shared by the benchmarks: best-of-N wall time and a JSON + text report."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

OUT = Path("results/bench")


def peak_rss_mb() -> float:
    """This process's own peak resident memory. Linux's ``ru_maxrss`` survives an exec, so a
    process started by a larger one would report its parent's peak; ``VmHWM`` does not."""
    status = Path("/proc/self/status")
    if status.exists():
        found = re.search(r"VmHWM:\s+(\d+) kB", status.read_text())
        if found:
            return int(found[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def best_time(fn, *, repeats: int = 3) -> float:
    """Minimum wall time over ``repeats`` calls: the least noisy estimate on a shared CPU."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` processes spinning on a core each for the block: the other work of a shared
    machine, the same for every contender measured inside it."""
    import multiprocessing

    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()


def timed(fn, *args):
    """(result, wall seconds, CPU seconds of this process) of ``fn(*args)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def report(name: str, record: dict):
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(record, indent=2))
    print(f"[{name}] " + "  ".join(f"{k}={v}" for k, v in record.items()))
