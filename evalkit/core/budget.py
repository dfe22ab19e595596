"""The machine a run is planned for and whether the run fits it: a named target
(``--target 8xH100-80GB``), one described (``gpus=8,gpu_gb=80,host_gb=1024``), or this
machine. Memory is checked per rank (device) and per host (every rank a host runs holds its own
host buffers); the cache's disk against what is not cached yet.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.core.task import Shape, Stage
from evalkit.device import free_bytes
from evalkit.errors import EvalkitError

GB = 10**9


@dataclass(frozen=True)
class Target:
    """A machine a run is planned for: GPUs per host (0: none) and the memory of each, host
    RAM per host, and the disk for the cache (None: not checked)."""

    name: str
    gpus: int
    gpu_bytes: int | None
    host_bytes: int
    disk_bytes: int | None = None
    peak_tflops: float = 0.0  # dense bf16, from the data sheet (0: unknown)

    def describe(self) -> str:
        gpus = f"{self.gpus} × {human(self.gpu_bytes)} GPU" if self.gpus else "no accelerator"
        return f"{self.name}: {gpus}, RAM {human(self.host_bytes)} per host"


# Named targets: the GPUs' memory as sold, host RAM as the common cloud instances have it.
TARGETS = {
    "1xA100-80GB": Target("1xA100-80GB", 1, 80 * GB, 170 * GB, peak_tflops=312.0),
    "8xA100-80GB": Target("8xA100-80GB", 8, 80 * GB, 1152 * 2**30, peak_tflops=312.0),
    "8xH100-80GB": Target("8xH100-80GB", 8, 80 * GB, 2048 * 2**30, peak_tflops=989.0),
    "1xH200": Target("1xH200", 1, 141 * GB, 256 * 2**30, peak_tflops=989.0),
}
TARGET_KEYS = {
    "gpus": "gpus",
    "gpu_gb": "gpu_bytes",
    "host_gb": "host_bytes",
    "disk_gb": "disk_bytes",
    "tflops": "peak_tflops",
}


def parse_target(text: str) -> Target:
    """A name from ``TARGETS`` or ``gpus=N,gpu_gb=G,host_gb=H[,disk_gb=D]``."""
    if text in TARGETS:
        return TARGETS[text]
    fields = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1
        if key not in TARGET_KEYS or number < 0:
            raise EvalkitError(
                f"--target {text!r}: expected 'this', one of {', '.join(TARGETS)}, or "
                "gpus=N,gpu_gb=G,host_gb=H[,disk_gb=D,tflops=T]"
            )
        scale = {"gpus": 1, "tflops": 1}.get(key, GB)
        fields[TARGET_KEYS[key]] = number if key == "tflops" else int(number * scale)
    if "host_bytes" not in fields or (fields.get("gpus") and "gpu_bytes" not in fields):
        raise EvalkitError(f"--target {text!r} needs host_gb, and gpu_gb when it has gpus")
    gpus = fields.pop("gpus", 0)
    return Target(text, gpus, fields.pop("gpu_bytes", None) if gpus else None, **fields)


@dataclass
class Budget:
    """What a host has — RAM, device memory per rank, free disk at the cache — and how many of
    the run's ranks it runs (``ranks`` in all over ``nodes`` hosts)."""

    host: int
    device: int | None
    disk: int | None
    name: str = "this machine"
    ranks: int = 1
    nodes: int = 1
    problems: list[str] = field(default_factory=list)

    @classmethod
    def here(cls, device: str, cache: Path, ranks: int = 1) -> Budget:
        """This machine, running every rank itself (torchrun on one host)."""
        disk_root = next(p for p in [Path(cache), *Path(cache).parents] if p.exists())
        device_bytes = free_bytes(device) if device.startswith("cuda") else None
        return cls(
            free_bytes("cpu") or 0,
            device_bytes,
            shutil.disk_usage(disk_root).free,
            ranks=ranks,
        )

    @classmethod
    def of(cls, target: Target, ranks: int = 1) -> Budget:
        """``ranks`` placed on hosts of ``target``, one per GPU."""
        nodes = math.ceil(ranks / target.gpus) if target.gpus else 1
        return cls(
            target.host_bytes, target.gpu_bytes, target.disk_bytes, target.name, ranks, nodes
        )

    @property
    def ranks_per_host(self) -> int:
        return math.ceil(self.ranks / self.nodes)

    def check(self, stages: list[Stage], shape: Shape, cached: int = 0):
        """What ``stages`` need beyond this budget; ``cached`` bytes of the cache they fill
        are on disk already (read, not written)."""
        disk = max(sum(s.cache_bytes for s in stages) - cached, 0)
        if self.disk is not None and disk > self.disk:
            self.problems.append(f"feature cache needs {human(disk)}, {human(self.disk)} free")
        weights = shape.weight_bytes_per_rank  # loaded for the whole run
        per_host = self.ranks_per_host
        for stage in stages:
            # Without an accelerator the weights and the "device" buffers are in RAM too.
            rank = stage.host_bytes + (
                0 if self.device is not None else weights + stage.device_bytes
            )
            if rank * per_host > 0.9 * self.host:
                ranks = f" per rank, {human(rank * per_host)} for a host's {per_host} ranks"
                self.problems.append(
                    f"{stage.name} holds {human(rank)} in RAM with the weights"
                    f"{ranks if per_host > 1 else ''}, {human(self.host)} available"
                )
            on_device = stage.device_bytes + weights
            if self.device is not None and on_device > 0.9 * self.device:
                self.problems.append(
                    f"{stage.name} needs {human(on_device)} per device, {human(self.device)} free"
                )


def human(n: float | None) -> str:
    if n is None:
        return "unknown"
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
