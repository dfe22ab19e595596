"""Rank-aware weight loading: every parameter is filled from a *source* that returns just the
slice this rank holds, whatever the layout (one process, tensor parallel, FSDP2 or both).

Sources: seeded random init (computed per parameter from its name, so every layout gets the
same numbers) and safetensors checkpoints — one file, or Hugging Face's sharded layout (an index
JSON whose ``weight_map`` names the shard file of each key). Slices are read with safetensors'
lazy ``get_slice``, so a rank reads only its part of each tensor from disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalkit.backbones.weights import check_matches, fingerprint
from evalkit.errors import EvalkitError
from evalkit.models.convert import CONFIG_KEY, INDEX_NAME


class RandomSource:
    def __init__(self, model_init, seed: int):
        self.init, self.seed = model_init, seed
        self.name = f"random init (seed {seed})"

    def shapes(self, expected: dict) -> dict:
        return expected

    def read(self, name: str, shape, index) -> torch.Tensor:
        return self.init(name, shape, self.seed)[index]


class SafetensorsSource:
    """A ``.safetensors`` file, an index JSON, or a folder holding either."""

    def __init__(self, path: str | Path):
        self.path = resolve_checkpoint(Path(path))
        self.name = str(path)
        if self.path.suffix == ".json":
            index = json.loads(self.path.read_text())
            self.weight_map = {k: self.path.parent / f for k, f in index["weight_map"].items()}
            self.metadata = index.get("metadata") or {}
        else:
            self.weight_map, self.metadata = self._single_file()
        self._handles = {}

    def _single_file(self):
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as f:
            keys = f.keys()  # a safe_open handle is not iterable
            return dict.fromkeys(keys, self.path), f.metadata() or {}

    def _handle(self, file: Path):
        from safetensors import safe_open

        if file not in self._handles:
            if not file.is_file():
                raise EvalkitError(f"checkpoint shard missing: {file} (named by {self.path})")
            self._handles[file] = safe_open(str(file), framework="pt")
        return self._handles[file]

    def config(self) -> dict:
        """The model switches saved by ``evalkit convert`` (empty for other checkpoints)."""
        raw = self.metadata.get(CONFIG_KEY)
        return json.loads(raw) if isinstance(raw, str) else dict(raw or {})

    def shapes(self, expected: dict) -> dict:
        return {
            k: tuple(self._handle(f).get_slice(k).get_shape()) for k, f in self.weight_map.items()
        }

    def read(self, name: str, shape, index) -> torch.Tensor:
        return self._handle(self.weight_map[name]).get_slice(name)[index]

    def weights_id(self) -> str:
        files = sorted({self.path, *self.weight_map.values()})
        return "sha256-fp:" + "+".join(fingerprint(f).split(":")[1][:8] for f in files)


def resolve_checkpoint(path: Path) -> Path:
    for name in (INDEX_NAME, "model.safetensors"):
        if path.is_dir() and (path / name).is_file():
            return path / name
    if path.is_file() and (path.suffix == ".safetensors" or path.name.endswith(".index.json")):
        return path
    raise EvalkitError(
        f"no checkpoint at {path}: expected a .safetensors file, a *.safetensors.index.json "
        f"with its shard files, or a folder holding one of them (`evalkit convert` writes one)"
    )


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
