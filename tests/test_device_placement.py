"""Every task family run on a stand-in CUDA device (``tests/fake_cuda.py``): a tensor left on
the wrong side of the host–device boundary fails here as it would on a GPU. Each of the first
four crash sites a CUDA run met (the stability trainer's model left on the CPU; a CPU
standardiser on device features in distillation and video; open_clip and LiT text towers fed
CPU tokens, CPU rows against device class embeddings, a CPU table indexed by device indices)
fails one of these; the two collective sites have their own tests below."""

from __future__ import annotations

import os

import pytest
import torch
from fake_cuda import fake_cuda, on_cuda

import evalkit
from benchmarks import gpu_check

# The device check's table of task families, with the test's own tiny open_clip architecture.
FAMILIES = {
    **gpu_check.FAMILIES,
    "zero-shot (open_clip)": ("zeroshot-imagenet", "open_clip/Tiny-Test", []),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_task_family_keeps_its_tensors_on_one_side(
    family, monkeypatch, tmp_path, data_cache, tiny_clip_registered
):
    task, backbone, settings = FAMILIES[family]
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))  # stand-in data written once a session
    monkeypatch.setenv("EVALKIT_EMBEDDED_SCENES", "16,8")
    with fake_cuda(monkeypatch):
        rows = evalkit.run(
            task,
            backbone,
            data="embedded",
            device="cuda",
            out=tmp_path / "rows",
            cache_dir=tmp_path / "cache",
            progress=False,
            overrides=settings,
        )
    assert rows and all(row["provenance"]["device"] == "cuda" for row in rows)
    assert all(row["provenance"]["tf32"] is False for row in rows)  # full fp32, and said so


def test_the_stand_in_device_catches_what_cuda_refuses(monkeypatch):
    """The harness itself: the mistakes it must see, and what CUDA allows."""
    with fake_cuda(monkeypatch):
        head = torch.nn.Linear(4, 2).to("cuda")
        rows = torch.zeros(3, 4)
        with pytest.raises(RuntimeError, match="same device"):
            head(rows)  # a CPU batch into a device module
        out = head(rows.cuda())
        assert on_cuda(out) and out.device.type == "cuda"
        assert on_cuda(out * torch.tensor(2.0))  # a CPU scalar may join, as on CUDA
        with pytest.raises(RuntimeError, match="indices"):
            torch.arange(5)[torch.tensor([1]).cuda()]  # a CPU table, device indices
        with pytest.raises(TypeError, match="numpy"):
            out.detach().numpy()
        assert not on_cuda(out.detach().cpu())


class OneRankMesh:
    """A data-parallel mesh dimension of a run on CUDA, over a one-process gloo group."""

    device_type = "cuda"

    def __getitem__(self, name):
        return self

    def get_group(self):
        import torch.distributed as dist

        return dist.group.WORLD


@pytest.fixture()
def one_process_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_number_averaged_over_ranks_travels_on_the_groups_device(monkeypatch, one_process_group):
    """Under torchrun on GPUs the group is NCCL's, which takes CUDA tensors only."""
    from evalkit import distributed

    layout = distributed.Layout(mesh=OneRankMesh(), dp_size=2)
    monkeypatch.setattr(distributed, "_CURRENT", [layout])
    with fake_cuda(monkeypatch):
        assert distributed.mean_over_ranks(3.0) == 1.5  # one rank's 3.0 over dp_size 2


def test_tensor_parallel_gradients_are_averaged_over_data_parallel_ranks(
    monkeypatch, one_process_group
):
    """A tensor-parallel gradient is a DTensor on the ("tp",) mesh, which ``all_reduce``
    refuses; its local shard is what the data-parallel ranks share and reduce."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from evalkit import distributed

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(torch.nn.Linear(4, 6), mesh["tp"], ColwiseParallel())
    model(torch.ones(2, 4)).full_tensor().sum().backward() if hasattr(
        model(torch.ones(2, 4)), "full_tensor"
    ) else model(torch.ones(2, 4)).sum().backward()
    before = model.weight.grad.to_local().clone()
    monkeypatch.setattr(distributed, "_CURRENT", [distributed.Layout(mesh=mesh, dp_size=2)])
    distributed.average_gradients(model)
    torch.testing.assert_close(model.weight.grad.to_local(), before / 2)  # one rank's sum / 2
