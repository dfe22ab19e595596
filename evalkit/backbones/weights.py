"""Local checkpoints: safe reading (safetensors or ``torch.load(weights_only=True)``), strict
key/shape checks with one-line errors, and a fast content fingerprint used as the weights id."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from evalkit.errors import EvalkitError

_FINGERPRINT_CHUNK = 4 << 20
_WRAPPER_KEYS = ("state_dict", "model", "module", "params")


def fingerprint(path: str | Path) -> str:
    """sha256 over the size and the first and last 4 MiB: stable for a file's content and
    cheap even for a 44 GB checkpoint (hashing it whole would take minutes)."""
    path = Path(path)
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_CHUNK))
        f.seek(max(0, path.stat().st_size - _FINGERPRINT_CHUNK))
        digest.update(f.read(_FINGERPRINT_CHUNK))
    return "sha256-fp:" + digest.hexdigest()[:16]


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
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
        raise EvalkitError(
            f"cannot read checkpoint {path}: {type(exc).__name__}: {exc} "
            "(expected a safetensors file or a torch state dict of tensors)"
        ) from exc
    return _unwrap(state, path)


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
