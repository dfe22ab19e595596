"""Rank-aware weight loading: every parameter is filled from a *source* that returns just the
slice this rank holds, whatever the layout (one process, tensor parallel, FSDP2 or both).

Sources: seeded random init (``RandomSource``: computed per parameter from its name, so every
layout gets the same numbers) and ``evalkit.storage.checkpoints.SafetensorsSource`` (one file or a
sharded index, read lazily slice by slice).
"""

from __future__ import annotations

import torch

from evalkit.storage.checkpoints import check_matches


class RandomSource:
    def __init__(self, model_init, seed: int):
        self.init, self.seed = model_init, seed
        self.name = f"random init (seed {seed})"

    def shapes(self, expected: dict) -> dict:
        return expected

    def read(self, name: str, shape, index) -> torch.Tensor:
        return self.init(name, shape, self.seed)[index]


def local_slice(param: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """This rank's storage of ``param`` and the index of that part in the full tensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param, tuple(slice(0, n) for n in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    return param.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


@torch.no_grad()
def materialize(model: torch.nn.Module, source) -> torch.nn.Module:
    """Fill every parameter of ``model`` (already moved off the meta device with
    ``to_empty``) with its slice from ``source``; keys and shapes are checked first."""
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    check_matches(expected, source.shapes(expected), source=source.name)
    for name, param in model.named_parameters():
        local, index = local_slice(param)
        local.copy_(source.read(name, expected[name], index).to(local.dtype))
    return model
