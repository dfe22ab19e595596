"""What evalkit asks of the machine, in one place: the device a run uses when none is named
(``EVALKIT_DEVICE``, else ``cuda`` where there is one, else ``cpu``; the same rule for
``evalkit run``, ``evalkit plan`` and ``evalkit.run()``) and its dtype (bf16 on a GPU, fp32
on a CPU), whether a named device exists, the free memory of a device, whether bf16 products
are fast on it, how many decoding workers may feed it, and how the process's allocator keeps
freed batch buffers. No task, head or planner asks the
machine anything itself."""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from evalkit.errors import EvalkitError, warn_once


def default_device() -> str:
    """``EVALKIT_DEVICE`` when set, else ``cuda`` where a GPU is visible, else ``cpu``."""
    return os.environ.get("EVALKIT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: str) -> str:
    """bf16 on a GPU, where its products are fast and its memory scarce; fp32 elsewhere."""
    return "bf16" if torch.device(device).type == "cuda" else "fp32"


def check_device(device: str):
    """A device torch knows and this machine has."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise EvalkitError(
            f"unknown --device {device!r}: expected cpu, cuda or cuda:<index>"
        ) from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise EvalkitError(f"--device {device}: this machine has no CUDA device (use --device cpu)")
    if kind not in ("cpu", "cuda"):
        raise EvalkitError(f"--device {device}: evalkit runs on cpu or cuda")


def free_bytes(device: str) -> int | None:
    """Free memory of ``device``: a GPU's (None where CUDA is missing), or the host's available
    RAM for ``cpu``."""
    if torch.device(device).type == "cuda":
        return (
            torch.cuda.mem_get_info(torch.device(device))[0] if torch.cuda.is_available() else None
        )
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gpu_free_bytes(device: torch.device | str) -> int:
    """The free memory of a GPU; 0 for any other device (budgets that only a GPU enlarges)."""
    return (free_bytes(str(device)) or 0) if torch.device(device).type == "cuda" else 0


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 products outrun fp32 ones here: on a GPU, or a CPU with bf16 instructions
    (AVX-512 BF16 or AMX); elsewhere bf16 is emulated and slower."""
    return device.type == "cuda" or _cpu_has_bf16()


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


CPUS_PER_GPU = 12  # what a Slurm job asks per GPU: ~11 decoding workers and the driver


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by Slurm's per-task count."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit():
        cpus = min(cpus or 1, int(slurm))
    return max(cpus or 1, 1)


def free_cpus() -> int:
    """Threads worth running now: torch's thread count, less the CPUs other work keeps busy at
    this moment (runnable threads of other processes, from the kernel's count in
    ``/proc/loadavg`` less this process's own). On a shared machine a thread per core would
    wait at every barrier for a core another process holds; one per free core does not. The
    fewest of ``BUSY_SAMPLES`` readings a millisecond apart: a thread runnable for an instant
    (a kernel worker, a pool going to sleep) would otherwise halve a search of seconds, while
    a busy process is runnable at every reading."""
    wanted = min(torch.get_num_threads(), available_cpus())
    try:
        busy = min(_busy_elsewhere(sample) for sample in range(BUSY_SAMPLES))
    except (OSError, ValueError, IndexError):
        return wanted
    return max(1, min(wanted, available_cpus() - busy))


BUSY_SAMPLES = 3


def _busy_elsewhere(sample: int) -> int:
    """Runnable threads of other processes at one reading (after a millisecond's pause, but
    the first). This process's own are read before and after the kernel's count, so a pool
    that stops spinning in between (another library's OpenMP) still counts as its own."""
    if sample:
        time.sleep(0.001)
    own_before = _own_running()
    running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    return max(0, running - max(own_before, _own_running()))


def _own_running() -> int:
    return sum(_task_state(task) == "R" for task in Path("/proc/self/task").iterdir())


MKL_CBWR_ALL, MKL_CBWR_STRICT = -1, 0x10000  # from MKL's mkl_service.h


@functools.cache
def mkl_strict() -> bool | None:
    """Whether torch's MKL runs in its strict reproducible mode (set by ``import evalkit``
    before MKL's first call); None where torch has no MKL to ask."""
    import ctypes

    libraries = sorted((Path(torch.__file__).parent / "lib").glob("*torch_cpu*"))
    for library in [None, *libraries]:
        try:
            cbwr_get = ctypes.CDLL(library).mkl_serv_cbwr_get
        except (OSError, AttributeError):
            continue
        return bool(cbwr_get(MKL_CBWR_ALL) & MKL_CBWR_STRICT)
    return None


def reproducible_cpus() -> int:
    """Threads for arithmetic whose numbers must not depend on the thread count (the linear
    probe's fits): the free cores (``free_cpus``), or one where MKL is not in its strict mode
    (it was started before evalkit was imported, so its products' sums follow the thread
    count)."""
    if mkl_strict() is False:
        warn_once(
            "mkl-not-strict",
            "MKL started before evalkit was imported, outside its strict reproducible mode: "
            "linear fits run on one thread so that their numbers do not depend on the thread "
            "count (import evalkit first, or set MKL_CBWR=AUTO,STRICT, to use every core)",
        )
        return 1
    return free_cpus()


def _on_cores(count):
    """A decorator: ``fn`` run with torch's threads set to ``count()`` when it is called (the
    count is looked up then, so the cores free at that moment)."""

    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with threads(count()):
                return fn(*args, **kwargs)

        return run

    return decorate


on_reproducible_cores = _on_cores(lambda: reproducible_cpus())  # the fits (their numbers)
on_free_cores = _on_cores(lambda: free_cpus())  # kNN's search (exact whatever the count)


def _task_state(task: Path) -> str:
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def cpus_per_rank() -> int:
    """This rank's share of the node's CPUs (torchrun starts ``LOCAL_WORLD_SIZE`` ranks)."""
    return max(available_cpus() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


def decode_workers(device: str) -> int:
    """Worker processes for a loader feeding ``device``. On a GPU every core of this rank but
    one. On a CPU the forward's threads keep the cores and one worker per 8 decodes: a core
    prepares several hundred images a second, a CPU forward of a ViT a few per core."""
    if torch.device(device).type == "cuda":
        return max(cpus_per_rank() - 1, 1)
    return max(cpus_per_rank() // 8, 1)


PEAK_TFLOPS = {  # dense bf16 TFLOP/s from the data sheets, by a part of the card's name
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}


def peak_tflops(device: str) -> float | None:
    """The data-sheet dense bf16 peak of this GPU (None on a CPU or an unknown card)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


FREED_KEPT_BYTES = 256 * 2**20  # buffers up to this size are reused, not unmapped


@functools.cache
def keep_freed_buffers() -> bool:
    """Let glibc's allocator keep a freed batch-sized buffer for the next batch.

    By default glibc maps every buffer of 32 MiB or more fresh from the kernel and unmaps it
    when freed. A batch of 64 images at 224² in float32 is 38 MB, so each batch's tensors would
    fault in every page again. Measured on a 2-core Xeon, that made normalising a batch 4× slower
    than the arithmetic itself. Buffers up to ``FREED_KEPT_BYTES`` are taken from the heap
    instead, and a freed top of the heap is returned only above twice that.

    This changes speed only: the bytes computed are the same. It is done once per process and
    does nothing where the C library is not glibc. Returns whether it applied."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mmap_threshold, trim_threshold = -3, -1  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD in malloc.h
    return bool(
        mallopt(mmap_threshold, FREED_KEPT_BYTES) and mallopt(trim_threshold, 2 * FREED_KEPT_BYTES)
    )


@contextmanager
def threads(count: int):
    """Torch's intra-op threads set to ``count`` inside the block. A CPU's threaded BLAS and
    LAPACK routines split their sums by the thread count, and their last bits change with it:
    the fits run such sums on one thread, and their passes over the rows on every thread
    (on a GPU the setting touches only the host's threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
