"""Sharding plans for the ViT-22B family, keyed by module name (docs/architecture.md).

Tensor parallel (Megatron style, with DTensor): the in-projections (``attn.q/k/v``, ``mlp.fc1``)
are split by output columns, so each rank holds whole heads and a slice of the MLP; the
out-projections (``attn.out``, ``mlp.fc2``) are split by input rows and leave partial sums. The
partial sums meet at the block's ``reduce`` module, where one all-reduce makes them whole: one
reduction per parallel block, two per sequential block (``reduce_attn``, ``reduce_mlp``).
FSDP2 (optional) shards every parameter over the data-parallel axis and gathers one block at a
time. ``sharded_dim`` states the same plan without torch.distributed, for the planner.
"""

from __future__ import annotations

import torch

from evalkit.errors import EvalkitError

COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc1")
ROWWISE = ("attn.out", "mlp.fc2")
REDUCE = ("reduce", "reduce_attn", "reduce_mlp")
HEAD_LOCAL = ("attn.q_norm", "attn.k_norm")  # replicated, applied per head


def sharded_dim(name: str) -> int | None:
    """The dimension of parameter ``name`` that tensor parallelism splits, or None if every
    rank holds all of it (norms, embeddings, out-projection biases, the MAP head)."""
    parts = name.split(".")
    if parts[0] != "blocks" or len(parts) < 4:
        return None
    module, leaf = ".".join(parts[2:-1]), parts[-1]
    if module in COLWISE:
        return 0
    if module in ROWWISE and leaf == "weight":
        return 1
    return None


def check_divisible(cfg, tp: int):
    if cfg.heads % tp or cfg.mlp % tp:
        raise EvalkitError(
            f"--tp {tp} must divide the head count ({cfg.heads}) and MLP width ({cfg.mlp})"
        )


def tensor_parallel_plan(model) -> dict:
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for index, _ in enumerate(model.blocks):
        prefix = f"blocks.{index}."
        for name in COLWISE:
            plan[prefix + name] = ColwiseParallel()
        for name in ROWWISE:
            # Leave the partial sums unreduced: the block reduces once where branches meet.
            plan[prefix + name] = RowwiseParallel(output_layouts=Partial(), use_local_output=False)
    return plan


def apply_tensor_parallel(model, mesh):
    """Shard ``model`` (built on the meta device or not) over the 1-D ``mesh``."""
    from torch.distributed.tensor.parallel import parallelize_module

    check_divisible(model.cfg, mesh.size())
    model = parallelize_module(model, mesh, tensor_parallel_plan(model))
    for block in model.blocks:
        for name in REDUCE:
            if hasattr(block, name):
                getattr(block, name).register_forward_pre_hook(reduce_partial_in_fp32)
    sum_head_local_gradients(model, mesh)
    return model


def reduce_partial_in_fp32(module, args):
    """The block's one all-reduce, of partial sums made whole in fp32 and handed on in the
    dtype they came in: a bf16 sum over ranks would round each partial once more (~4e-3)."""
    from torch.distributed.tensor import Replicate

    (partial,) = args
    whole = partial.to(torch.float32).redistribute(placements=[Replicate()]).to_local()
    return (whole.to(partial.dtype),)


def sum_head_local_gradients(model, mesh):
    """The QK norms are replicated, yet each rank applies them to its own heads only, so each
    rank's gradient of them is a partial sum: a hook adds the ranks' parts (training only;
    inference computes no gradients)."""
    from torch.distributed._functional_collectives import all_reduce

    group = mesh.get_group()
    for name, param in model.named_parameters():
        if any(f".{norm}." in name for norm in HEAD_LOCAL):
            param.register_hook(lambda grad: all_reduce(grad, "sum", group))


def apply_fsdp(model, mesh):
    """FSDP2 over the 1-D data-parallel ``mesh``: each block is one gather unit."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    # Extraction calls forward_layers and pool, not forward: the root's parameters (patch and
    # position embeddings, norms, the MAP head) are gathered for them only when FSDP hooks them.
    for method in ("forward_layers", "pool"):
        if hasattr(model, method):
            register_fsdp_forward_method(model, method)
    return model
