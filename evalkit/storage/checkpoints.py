"""Ground floor: everything evalkit knows about checkpoint files, for every model family.

Reading (safetensors, or ``torch.load(weights_only=True)`` so no pickled object ever runs),
the weights id (a hash of every byte, memoised in ``evalkit.storage.identity``), strict key/shape
checks with one-line errors, and writing: one ``model.safetensors`` or, past a size, shards plus Hugging Face's
``model.safetensors.index.json`` whose ``weight_map`` names the file of each key. A model's
config travels in the safetensors metadata, so ``--weights`` alone rebuilds the model.
``SafetensorsSource`` reads any of these lazily, one slice at a time, for sharded loading.

This module knows no model, no backbone and no process layout (docs/architecture.md).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.storage.identity import content_id, spec_key

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_KEY = "evalkit_config"
_WRAPPER_KEYS = ("state_dict", "model", "module", "params")


# --- reading ---------------------------------------------------------------------------------


def weights_id(path: str | Path) -> str:
    """The id of a weights file: sha256 of all its bytes (memoised, so hashed once)."""
    return "sha256:" + content_id(path)[:16]


def checkpoint_id(path: str | Path) -> str:
    """The id of a checkpoint named by a file, a folder or a shard index: over every file it
    is read from (``missing`` when there is none: loading it will say what is expected)."""
    path = Path(path)
    if path.is_file() and not path.name.endswith(".index.json"):
        return weights_id(path)
    try:
        return SafetensorsSource(path).weights_id()
    except EvalkitError:
        return "missing"


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise EvalkitError(
            f"weights file not found: {path} (pass a local .safetensors/.pt/.pth checkpoint; "
            "evalkit does not download weights unless asked with --pretrained)"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not _is_pickle(path):
            raise EvalkitError(
                f"cannot read checkpoint {path}: not a safetensors file or a torch checkpoint"
            ) from exc
        # Any refusal of torch's weights-only unpickler (its wording varies by version and by
        # pickle protocol) means the pickle holds more than tensors.
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found[1]})" if found else ""
        raise EvalkitError(
            f"cannot read checkpoint {path}: it is a pickle holding Python objects{what} "
            "besides tensors, which evalkit never runs: save the model's state_dict alone, or "
            "convert it to safetensors"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EvalkitError(
            f"cannot read checkpoint {path}: {type(exc).__name__}: {first} "
            "(expected a safetensors file or a torch state dict of tensors)"
        ) from exc
    return _unwrap(state, path)


def _is_pickle(path: Path) -> bool:
    """A torch checkpoint (a zip archive) or a bare pickle of protocol 2 or later."""
    with open(path, "rb") as f:
        head = f.read(2)
    return head == b"PK" or head[:1] == b"\x80"


def _unwrap(state, path: Path) -> dict[str, torch.Tensor]:
    while isinstance(state, dict):
        inner = next((state[k] for k in _WRAPPER_KEYS if isinstance(state.get(k), dict)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise EvalkitError(f"checkpoint {path} is not a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_strict(
    model: torch.nn.Module, state: dict[str, torch.Tensor], *, source: str, skip: tuple = ()
):
    """Copy ``state`` into ``model``; any missing key, unexpected key or shape mismatch is an
    error naming the key and both shapes. Keys starting with a ``skip`` prefix are ignored."""
    expected = {k: v.shape for k, v in model.state_dict().items() if not k.startswith(skip)}
    given = {k: v for k, v in state.items() if not k.startswith(skip)}
    check_matches(expected, {k: v.shape for k, v in given.items()}, source=source)
    model.load_state_dict(given, strict=True)


def check_matches(expected: dict, given: dict, *, source: str):
    """``expected`` and ``given`` map keys to shapes; raise on the first disagreement."""
    for key, shape in given.items():
        if key in expected and tuple(shape) != tuple(expected[key]):
            raise EvalkitError(
                f"checkpoint {source}: {key} has shape {tuple(shape)}, the model expects "
                f"{tuple(expected[key])} (wrong architecture or size for these weights?)"
            )
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        raise EvalkitError(
            f"checkpoint {source} does not match the model: missing {missing[:3]}"
            f"{'…' if len(missing) > 3 else ''} ({len(missing)}), unexpected {unexpected[:3]}"
            f"{'…' if len(unexpected) > 3 else ''} ({len(unexpected)})"
        )


# --- lazy, sliced reading (sharded loading) ---------------------------------------------------


class SafetensorsSource:
    """A ``.safetensors`` file, an index JSON, or a folder holding either; ``read`` returns one
    slice of one tensor, so a rank reads only its part from disk (safetensors ``get_slice``)."""

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
        """The model config saved with the checkpoint (empty for other checkpoints)."""
        raw = self.metadata.get(CONFIG_KEY)
        return json.loads(raw) if isinstance(raw, str) else dict(raw or {})

    def shapes(self, expected: dict) -> dict:
        return {
            k: tuple(self._handle(f).get_slice(k).get_shape()) for k, f in self.weight_map.items()
        }

    def read(self, name: str, shape, index) -> torch.Tensor:
        return self._handle(self.weight_map[name]).get_slice(name)[index]

    def tensor(self, name: str) -> torch.Tensor:
        return self._handle(self.weight_map[name]).get_tensor(name)

    def weights_id(self) -> str:
        """sha256 over the content ids of every file (index and shards)."""
        files = sorted({self.path, *self.weight_map.values()})
        return "sha256:" + spec_key([content_id(f) for f in files], length=16)


def resolve_checkpoint(path: Path) -> Path:
    for name in (INDEX_NAME, SINGLE_NAME):
        if path.is_dir() and (path / name).is_file():
            return path / name
    if path.is_file() and (path.suffix == ".safetensors" or path.name.endswith(".index.json")):
        return path
    raise EvalkitError(
        f"no checkpoint at {path}: expected a .safetensors file, a *.safetensors.index.json "
        f"with its shard files, or a folder holding one of them (`evalkit convert` writes one)"
    )


# --- writing ---------------------------------------------------------------------------------


def save_checkpoint(
    state: dict[str, torch.Tensor], out: Path, config: dict, *, shard_bytes: int = 5 << 30
) -> Path:
    """Write ``out/model.safetensors``, or shards plus ``out/model.safetensors.index.json``
    when the weights exceed ``shard_bytes``; ``config`` goes into the metadata. Returns the
    path to pass as ``--weights``."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metadata = {CONFIG_KEY: json.dumps(config)}
    groups = _shard_groups(state, shard_bytes)
    if len(groups) == 1:
        save_file(state, str(out / SINGLE_NAME), metadata=metadata)
        return out / SINGLE_NAME
    weight_map = {}
    for number, keys in enumerate(groups, 1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: state[k] for k in keys}, str(out / name), metadata=metadata)
        weight_map |= dict.fromkeys(keys, name)
    index = {"metadata": {CONFIG_KEY: config}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=1))
    return out / INDEX_NAME


def _shard_groups(state: dict, shard_bytes: int) -> list[list[str]]:
    groups, size = [[]], 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    return groups


def parse_size(text: str) -> int:
    """'5GB', '200MB', '1024' → bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B?)\s*", text.upper())
    if not match:
        raise EvalkitError(f"cannot read size {text!r}: expected e.g. 5GB, 200MB or 1048576")
    scale = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(match[1]) * scale[match[2].rstrip("B") or ""])
