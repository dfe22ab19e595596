"""How a run's arithmetic is set and what it used: full-fp32 products and deterministic
algorithms for the run (``run_numerics``, recorded as ``provenance.tf32`` and
``provenance.deterministic``), and each job's peak memory on its own device."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable

import torch


def run_numerics() -> Callable[[], None]:
    """Set, for the run, how its arithmetic is done; returns what puts the caller's back.

    - fp32 matrix products and convolutions in full fp32: TF32 (on by default for cuDNN)
      rounds them to ~1e-3.
    - Deterministic algorithms: cuDNN picks no kernel by timing, cuBLAS gets a fixed
      workspace, and an op with no deterministic CUDA kernel (bilinear-upsample backward)
      warns rather than varying silently; the ADE20k and depth gates compare to 0.001.
    - Without the fill of new tensors that deterministic mode adds by default
      (``torch.utils.deterministic.fill_uninitialized_memory``): it writes NaN over every
      tensor torch allocates before the op that produces it writes it again, a second pass
      over each output: about a fifth of a small backbone's batch time on the CPU, 8% of a
      ViT-S/16's. The fill only makes a read of memory that no op wrote repeatable, and
      evalkit's ops write every element they allocate: the numbers are the same bits without
      it (tests compare both).

    Every row records the first two (``provenance.tf32``, ``provenance.deterministic``)."""
    deterministic = torch.utils.deterministic
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        deterministic.fill_uninitialized_memory,
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = False

    def restore():
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:4]
        deterministic_algorithms(saved[4], warn_only=saved[5])
        deterministic.fill_uninitialized_memory = saved[6]

    return restore


def deterministic_algorithms(mode: bool, *, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without loading torch's compiler for it: that
    function imports ``torch._inductor`` (and dynamo with it, 1–2 CPU-seconds) only to set the
    compiler's own flag. evalkit compiles nothing; where the compiler is already loaded its
    flag is set as torch sets it."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def numerics() -> dict:
    """How this run's arithmetic was set (``run_numerics``)."""
    return {
        "tf32": torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def peak_memory_mb(device: str) -> float:
    """The job's peak on the run's own device (``cuda:1`` is not GPU 0); the process's peak
    resident memory on the CPU."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak_memory(device: str):
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
