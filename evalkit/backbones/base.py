"""The one Backbone protocol every adapter implements, the optional text-tower protocol, and
the pools every backbone draws from (docs/architecture.md, "Contracts").

A backbone owns its preprocessing (``info.preprocess``) and returns ``Features``: the pooled
vectors of the requested layers and, for dense tasks, per-layer patch grids, following timm's
``forward_intermediates`` semantics (layer -1 is the last block, after the final norm). Video
enters through the same path: the feature extractor folds a clip's frames into the batch and
unfolds them after (``evalkit.cache.extraction``), so an adapter only ever sees images.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from evalkit.data import DEFAULT_DECODER
from evalkit.data.views import Normalised, eval_view, normalise
from evalkit.errors import EvalkitError

# Every pool a backbone may offer, declared once; ``BackboneInfo.pools`` lists an adapter's own,
# its preferred first (a task's ``pool=auto``).
POOLS = {
    "cls": "the class token of each requested layer",
    "mean": "the mean of the patch tokens of each requested layer",
    "map": "the model's attention-pooling (MAP) head, after the last block",
    "embed": "the model's own image embedding in the space its text tower shares (CLIP)",
}


@dataclass(frozen=True)
class Preprocess:
    """A backbone's evaluation preprocessing: resize to size/crop_pct — the shorter side
    (``crop_mode`` ``center``) or both sides (``squash``, aspect not kept) — then centre-crop
    ``size``, normalised by ``mean`` and ``std``."""

    size: int = 224
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    crop_mode: str = "center"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BackboneInfo:
    name: str
    weights_id: str
    embed_dim: int
    patch_size: int
    depth: int
    num_prefix_tokens: int
    params: int
    preprocess: Preprocess = field(default_factory=Preprocess)
    pools: tuple[str, ...] = ("cls", "mean")
    random_init: bool = False
    options: dict[str, Any] = field(default_factory=dict, hash=False)  # --model-arg values
    # where the weights came from: "hub <repo>@<commit>", "local file <path>", "random init"
    source: str = field(default="", compare=False)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Features:
    """Outputs of one forward pass over B images and L requested layers.

    ``pooled`` is (B, L·D): each layer's pooled vector, concatenated in the order requested
    (``embed`` gives the model's own embedding, (B, E), whatever the layers). ``grids`` is
    ``None`` unless ``dense=True``; then a list of L tensors (B, D, h, w), one patch grid per
    requested layer."""

    pooled: torch.Tensor | None = None
    grids: list[torch.Tensor] | None = None


@runtime_checkable
class TextTower(Protocol):
    """A text encoder that shares an embedding space with an image backbone: open_clip's text
    tower, or a tower trained by LiT. ``encode`` returns L2-normalised (N, embed_dim)."""

    embed_dim: int

    def tokenize(self, texts: list[str]) -> torch.Tensor: ...

    def encode(self, tokens: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Backbone(Protocol):
    """An image backbone. An adapter may also carry ``text: TextTower`` (see ``text_tower``)."""

    info: BackboneInfo

    def transform(self, train: bool = False): ...

    def extract(
        self, images: torch.Tensor, *, layers: tuple[int, ...], pool: str, dense: bool = False
    ) -> Features: ...


def text_tower(backbone) -> TextTower:
    """The backbone's text tower, or a one-line error saying which backbones have one."""
    tower = getattr(backbone, "text", None)
    if not isinstance(tower, TextTower):
        raise EvalkitError(
            f"backbone {backbone.info.name} has no text tower: use an open_clip/<arch> backbone, "
            "or train one with a LiT task"
        )
    return tower


def build_transform(
    pre: Preprocess,
    *,
    train: bool = False,
    square: bool = False,
    decoder: str = DEFAULT_DECODER,
    normalised: bool = False,
):
    """How a backbone's images are prepared. Evaluation: resize the shorter side to
    size/crop_pct (both sides with ``square``, as big_vision's few-shot evaluators do, or when
    the backbone's own preprocessing squashes) and centre-crop, giving uint8 pixels (``evalkit.data.views``) that ``model_input`` normalises
    on the device; ``normalised`` returns the float tensor instead, for a reader whose images
    never pass through ``extract``. Training: an inception crop with a flip, normalised."""
    if not train:
        square = square or pre.crop_mode == "squash"
        view = eval_view(pre.size, pre.crop_pct, pre.interpolation, square=square, decoder=decoder)
        return Normalised(view, pre.mean, pre.std) if normalised else view
    # Here, not above: importing torchvision loads torch's compiler too (1–2 CPU-s), which an
    # evaluation whose features are cached never needs.
    from torchvision import transforms as T

    mode = T.InterpolationMode(pre.interpolation)
    return T.Compose(
        [
            T.RandomResizedCrop(pre.size, interpolation=mode),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(pre.mean, pre.std),
        ]
    )


def model_input(images: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    """What a backbone's forward reads: uint8 pixels normalised with the backbone's mean and
    std where they are (on the device, after the copy); float images as they come."""
    return normalise(images, pre.mean, pre.std)


def pool_tokens(prefix: torch.Tensor | None, grid: torch.Tensor, pool: str) -> torch.Tensor:
    """Pool one layer: ``cls`` takes the first prefix token, ``mean`` averages the patches."""
    if pool == "cls":
        if prefix is None or prefix.shape[1] == 0:
            raise ValueError("pool 'cls' needs a class token; this backbone has none (use mean)")
        return prefix[:, 0]
    if pool == "mean":
        return grid.mean(dim=(2, 3))
    raise ValueError(f"unsupported pool {pool!r}")


def check_pool(info: BackboneInfo, pool: str):
    unknown = [p for p in info.pools if p not in POOLS]
    if unknown:  # an adapter bug, not a user error
        raise ValueError(f"backbone {info.name} declares undeclared pools {unknown}")
    if pool not in info.pools:
        raise EvalkitError(
            f"backbone {info.name} does not support pool={pool!r}: choose from {', '.join(info.pools)}"
        )


def resolve_layers(info: BackboneInfo, layers, pool: str, *, map_head: str) -> list[int]:
    """Check a request and return absolute layer indices; ``map`` pools with the model's own
    attention-pool head, which sits after the last block only."""
    check_pool(info, pool)
    indices = absolute_layers(tuple(layers), info.depth)
    if pool == "map" and indices != [info.depth - 1]:
        raise EvalkitError(f"pool 'map' uses the model's {map_head}: only layers=-1")
    return indices


def absolute_layers(layers: tuple[int, ...], depth: int) -> list[int]:
    """Negative layer indices count from the end (-1 = last block)."""
    out = [depth + i if i < 0 else i for i in layers]
    bad = [i for i, a in zip(layers, out, strict=True) if not 0 <= a < depth]
    if bad:
        raise EvalkitError(f"layers {bad} out of range for a {depth}-block backbone")
    return out


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


WEIGHTS_DRAW = "backbone-weights"  # the draw a random-init adapter's weights come from


def random_init_id(name: str, seed: int, options: dict | None = None, draw: str = "") -> str:
    """The id of seeded random weights; constructor options change the weights, so they are
    part of it, and so is the name of the draw they come from (``evalkit.seeds``): weights
    drawn under the rule before draws were named have another id, so their cached features
    are never read for these. Option-free, draw-free ids (the built-in family's, whose draws
    were always named by parameter) are the same as they always were."""
    material = f"{name}:{seed}" + (f":{sorted(options.items())}" if options else "")
    material += f":draw={draw}" if draw else ""
    return "random-init:" + hashlib.sha256(material.encode()).hexdigest()[:16]
