"""Ground floor: the process layout of a run, a 2-D device mesh ``("dp", "tp")`` when launched
by torchrun. It knows no model: the ViT-22B sharding plan lives in ``evalkit.parallel``.

Tensor-parallel ranks (one ``tp`` row) see the same images and split the model; data-parallel
groups split the feature-cache shards. Rank 0 alone writes result rows; the first rank of each
tensor-parallel group writes the shards its group computed. A single process is the trivial
layout, so callers never branch on "distributed or not".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from evalkit.errors import EvalkitError

LAUNCH_HINT = "launch with: torchrun --nproc-per-node N -m evalkit run ... --tp K"


@dataclass(frozen=True)
class Layout:
    mesh: Any = None  # DeviceMesh with dims ("dp", "tp"), or None for one process
    rank: int = 0
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def main(self) -> bool:
        """Writes rows and prints."""
        return self.rank == 0

    @property
    def writer(self) -> bool:
        """Writes the cache shards its tensor-parallel group computed."""
        return self.tp_rank == 0


_CURRENT = [Layout()]


def current() -> Layout:
    return _CURRENT[0]


def setup(tp: int = 1, *, device: str = "cpu") -> Layout:
    """Join the torchrun process group (gloo on CPU, nccl on CUDA) and build the mesh."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if tp < 1:
        raise EvalkitError(f"--tp must be at least 1, got {tp}")
    if world == 1 and tp == 1:
        if torch.device(device).index is not None:
            torch.cuda.set_device(device)  # kernels, memory figures and peaks on --device's GPU
        return current()
    if world % tp:
        raise EvalkitError(
            f"--tp {tp} must divide the number of processes ({world}); {LAUNCH_HINT}"
        )
    if world == 1:
        raise EvalkitError(f"--tp {tp} needs {tp} processes; {LAUNCH_HINT}")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if device_type == "cuda":
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        if not dist.is_initialized():  # bound to its GPU: NCCL connects eagerly, no guessing
            dist.init_process_group("nccl", device_id=local)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    mesh = init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    layout = Layout(
        mesh=mesh,
        rank=dist.get_rank(),
        dp_rank=mesh.get_local_rank("dp"),
        dp_size=world // tp,
        tp_rank=mesh.get_local_rank("tp"),
        tp_size=tp,
    )
    _CURRENT[0] = layout
    return layout


def barrier():
    if current().mesh is not None:
        import torch.distributed as dist

        dist.barrier()


def teardown():
    if current().mesh is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
        _CURRENT[0] = Layout()


def average_gradients(module: torch.nn.Module):
    """After backward under torchrun: the mean of the data-parallel ranks' gradients, so
    every rank steps as one process on the joined batch would."""
    layout = current()
    if layout.dp_size == 1:
        return
    import torch.distributed as dist

    group = layout.mesh["dp"].get_group()
    for p in module.parameters():
        if p.grad is None or _fsdp_reduced(p.grad):
            continue
        # A tensor-parallel gradient is a DTensor on the ("tp",) mesh, which c10d cannot
        # reduce: its local shard is reduced instead (dp ranks hold the same shard of it).
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(local, group=group)
        local /= layout.dp_size


def _fsdp_reduced(grad) -> bool:
    """A gradient FSDP2 already averaged over the data-parallel ranks (it lives on a mesh with
    their dimension: ("dp",) alone, or ("dp", "tp") with tensor parallelism)."""
    mesh = getattr(grad, "device_mesh", None)
    return mesh is not None and "dp" in (mesh.mesh_dim_names or ())


def mean_over_ranks(value: float) -> float:
    """The mean of a number over the data-parallel ranks (itself in one process)."""
    layout = current()
    if layout.dp_size == 1:
        return value
    import torch.distributed as dist

    # on the group's device: NCCL takes CUDA tensors only
    total = torch.tensor([value], dtype=torch.float64, device=layout.mesh.device_type)
    dist.all_reduce(total, group=layout.mesh["dp"].get_group())
    return total.item() / layout.dp_size


_DTYPES = (torch.float32, torch.uint8, torch.int64, torch.float16, torch.bfloat16, torch.bool)


def broadcast_from_first(tensor: torch.Tensor | None, group, device: str) -> torch.Tensor:
    """``tensor`` as the group's first rank holds it, on every rank of ``group`` (others pass
    None): its dtype and shape travel first, then its values, on ``device`` (NCCL takes device
    tensors only)."""
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0)
    header = torch.zeros(8, dtype=torch.int64, device=device)
    if tensor is not None:
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.ndim
        header[2 : 2 + tensor.ndim] = torch.tensor(tensor.shape)
    dist.broadcast(header, src=src, group=group)
    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
    if tensor is None:
        tensor = torch.empty(header[2 : 2 + ndim].tolist(), dtype=dtype, device=device)
    else:
        tensor = tensor.to(device, non_blocking=True)
    dist.broadcast(tensor, src=src, group=group)
    return tensor
