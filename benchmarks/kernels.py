"""Kernel paths: environments under which this one CPU computes as other machines do, so
that every machine of the project's kind runs the same determinism checks whatever its own
instructions (AVX-512 BF16, AMX or neither).

Each path sets what chooses the arithmetic: the thread count (how a BLAS or a reduction
splits its sums), MKL's code branch (``MKL_CBWR``: AVX-512, AVX2 or its compatible code,
whose GEMM picks other kernels for small matrices), oneDNN's instruction cap
(``ONEDNN_MAX_CPU_ISA``: its bf16 products without AVX-512 BF16/AMX) and ATen's own vector
width (``ATEN_CPU_CAPABILITY``: sums and softmax in 16, 8 or 1 lanes). Measured on a 2-core
AMD EPYC with AVX-512 BF16 and no AMX: each path below changes the last bits of some products
or sums that the default path computes (tests/test_kernels.py checks the promises under all; ``python -m benchmarks.repeatability``
measures how far each task family's numbers move across them).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path


@functools.cache
def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def kernel_paths() -> dict[str, dict[str, str]]:
    """Name → environment of every path this CPU can take."""
    paths = {
        "1 thread": {"OMP_NUM_THREADS": "1"},
        "2 threads": {"OMP_NUM_THREADS": "2"},
        "4 threads, MKL compatible code, ATen scalar": {
            "OMP_NUM_THREADS": "4",
            "MKL_CBWR": "COMPATIBLE",
            "ATEN_CPU_CAPABILITY": "default",
        },
        "2 threads, AVX2 everywhere": {
            "OMP_NUM_THREADS": "2",
            "MKL_CBWR": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2",
            "ATEN_CPU_CAPABILITY": "avx2",
        },
    }
    if "avx512f" in cpu_flags():
        paths["1 thread, MKL AVX-512 code"] = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AVX512"}
    paths["2 threads, another vector library (emulated)"] = {
        "OMP_NUM_THREADS": "2",
        EMULATE: "sqrt,sum",
    }
    return paths


# What no variable can make this CPU do: on an Intel CPU, MKL's vector library (which torch's
# float32 square root calls) rounds about one root in six differently under MKL_CBWR=COMPATIBLE,
# and none on an AMD CPU; another library may sum in another order. A path naming ``EMULATE``
# makes the process that calls ``emulate_other_kernels`` compute that way, so every machine
# runs the checks an Intel machine runs.
EMULATE = "EVALKIT_EMULATE_KERNELS"


def emulate_other_kernels():
    """Under ``EMULATE``: torch's float32 ``sqrt`` one unit in the last place up for about one
    value in six (``sqrt``), and float32 sums over the last dimension taken in reverse order
    (``sum``), in this process."""
    import torch

    asked = set(filter(None, os.environ.get(EMULATE, "").split(",")))
    if "sqrt" in asked:
        torch.sqrt = torch.Tensor.sqrt = _other_sqrt(torch.Tensor.sqrt)
    if "sum" in asked:
        torch.sum = torch.Tensor.sum = _other_sum(torch.Tensor.sum)


def _other_sqrt(sqrt):
    import torch

    def rounded_otherwise(values, *args, **kwargs):
        roots = sqrt(values, *args, **kwargs)
        if roots.dtype != torch.float32:
            return roots
        picked = values.contiguous().view(torch.int32).remainder(6) == 0
        return torch.where(picked, torch.nextafter(roots, torch.full_like(roots, 1e30)), roots)

    return rounded_otherwise


def _other_sum(total):
    import torch

    def reversed_order(values, *args, **kwargs):
        dim = kwargs.get("dim", args[0] if args else None)
        if values.dtype != torch.float32 or dim not in (-1, values.dim() - 1):
            return total(values, *args, **kwargs)
        return total(values.flip(-1), *args, **kwargs)

    return reversed_order


def run_under(path: dict[str, str], *argv: str, timeout: int = 600) -> str:
    """``python *argv`` under a kernel path (its variables over this process's); its output."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
    }
    root = str(Path(__file__).resolve().parents[1])  # its scripts import benchmarks.kernels
    keep["PYTHONPATH"] = os.pathsep.join(filter(None, [root, keep.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, *argv],
        env={**keep, **path},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
