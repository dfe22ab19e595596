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
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. img_size, depth (tests)
