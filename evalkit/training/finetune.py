"""Fine-tuning a backbone end to end with a task head (effect-table rows 7–8 and 11, whose
paper numbers were measured fine-tuned; docs/protocols.md, "Fine-tuning").

The backbone's own adapter stays the forward path (``extract`` with gradients on), so every
backbone that evalkit evaluates frozen can be fine-tuned the same way, and what is trained is a
copy: the caller's backbone and its feature cache are left as they were. Learning rates decay
layer by layer from the head down (BEiT's layer-wise decay: the head trains at the base rate,
block ``i`` of ``depth`` at ``rate × decay^(depth - i)``, the embeddings at
``rate × decay^(depth + 1)``); norms, biases and position embeddings are not weight-decayed.
The loop itself is ``evalkit.training.loop.fit``.
"""

from __future__ import annotations

import copy
import re

import torch

from evalkit.errors import EvalkitError

BLOCK_INDEX = re.compile(r"(?:^|\.)(?:blocks|resblocks|layers)\.(\d+)\.")
EMBEDDINGS = (
    "patch_embed",
    "pos_embed",
    "cls_token",
    "conv1",
    "class_embedding",
    "positional_embedding",
    "embed",
    "reg_token",
    "ln_pre",
    "norm_pre",
)


def trainable_copy(backbone):
    """A copy of the backbone adapter whose weights require gradients, in fp32: a deep copy,
    or, for a sharded backbone (``--tp``/``--fsdp``), a fresh one built the same way (its
    ``trainable``). A bf16 run trains it under autocast, so the optimiser updates fp32 master
    weights: in bf16 (8 bits of mantissa) an update below 1/256 of a weight is lost, which
    is most of a layer-decayed lower block's."""
    if getattr(backbone, "sharded", False):
        if not hasattr(backbone, "trainable"):
            raise EvalkitError(
                f"{backbone.info.name} cannot be fine-tuned sharded: drop --tp/--fsdp"
            )
        return backbone.trainable()
    backbone_module(backbone)  # a one-line error for adapters without one, before copying
    clone = copy.deepcopy(backbone)
    backbone_module(clone).float().requires_grad_(True)
    return clone


def backbone_module(backbone) -> torch.nn.Module:
    """The image tower an adapter runs (open_clip's ``visual``, everyone else's ``model``)."""
    module = getattr(backbone, "visual", None) or getattr(backbone, "model", None)
    if not isinstance(module, torch.nn.Module):
        raise EvalkitError(f"backbone {backbone.info.name} has no trainable image tower")
    return module


def layer_of(name: str, depth: int) -> int:
    """0 for the embeddings, i + 1 for block i, depth + 1 for everything after the blocks."""
    if match := BLOCK_INDEX.search(name):
        return int(match.group(1)) + 1
    first = name.split(".")[0]
    return 0 if first in EMBEDDINGS else depth + 1


def decayed_groups(tower: torch.nn.Module, head: torch.nn.Module, *, depth: int, decay: float):
    """Optimizer parameter groups: per layer of ``tower``, an ``lr_scale`` of
    ``decay^(depth + 1 - layer)`` (the head's scale is 1), split by whether weight decay
    applies (matrices and convolutions) or not (norms, biases, embeddings of one row)."""
    groups: dict[tuple[float, bool], list] = {}
    named = [(n, p, layer_of(n, depth)) for n, p in tower.named_parameters()]
    named += [(n, p, depth + 1) for n, p in head.named_parameters()]
    for name, param, layer in named:
        if not param.requires_grad:
            continue
        key = (decay ** (depth + 1 - layer), param.ndim > 1 and "pos_embed" not in name)
        groups.setdefault(key, []).append(param)
    return [
        {"params": params, "lr_scale": scale, "decayed": decayed}
        for (scale, decayed), params in sorted(groups.items())
    ]


class EndToEnd(torch.nn.Module):
    """A backbone adapter and a head: images → the head applied to what ``extract`` returns
    (pooled vectors, or the patch grids with ``dense=True``). With ``frozen`` the backbone
    stays in eval mode and runs without autograd: only the head trains (a frozen-feature head
    whose features are computed in the loop instead of read from a cache)."""

    def __init__(
        self,
        backbone,
        head: torch.nn.Module,
        *,
        layers,
        pool: str,
        dense: bool,
        frozen: bool = False,
    ):
        super().__init__()
        self.tower = backbone_module(backbone)
        self.head = head
        self.frozen = frozen
        self._extract = backbone.extract
        self.request = {"layers": tuple(layers), "pool": pool, "dense": dense}

    def forward(self, images: torch.Tensor):
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            features = self._extract(images, **self.request)
        if self.request["dense"]:
            return self.head([g.float() for g in features.grids])
        return self.head(features.pooled.float())

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.tower.eval()
        return self
