"""How a backbone is built: the options every adapter accepts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BackboneOptions:
    weights: str | None = None  # local checkpoint path
    pretrained: bool = False  # let the adapter fetch its own published weights (needs network)
    seed: int = 0  # random-init seed when no weights are given
    device: str = "cpu"
    dtype: str = "fp32"  # parameter dtype where the adapter honours it (vit22b: bf16 halves memory)
    random_init: bool = False  # allow random weights where an adapter refuses them by default
    fsdp: bool = False  # vit22b: shard parameters over the data-parallel axis (FSDP2)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. img_size, depth (tests)


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """``--model-arg key=value`` pairs → constructor kwargs; values read as bool, int, float or
    (otherwise) text: ``qk_norm=false``, ``img_size=384``, ``pool=gap``."""
    from evalkit.errors import EvalkitError

    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise EvalkitError(f"--model-arg expects key=value, got {pair!r}")
        out[key] = _literal(raw)
    return out


def _literal(raw: str):
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw
