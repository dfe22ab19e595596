"""LiT text towers: a text transformer trained contrastively against a locked image tower's
cached embeddings (effect-table row 6; docs/protocols.md, "LiT").

The tower is open_clip's ``TextTransformer`` (causal, end-of-text pooling, linear projection)
with open_clip's byte-pair tokenizer cut to ``context`` tokens, randomly initialised at a
configurable size (LiT's small towers: width 192 or 384, 12 layers). Its output width is the
image embedding's width, so no image head is needed (LiT's default); ``image_head`` adds a
linear one. Image and text embeddings are L2-normalised (eps 1e-8); logits are their dot
products × a learned temperature (stored as its log, initialised at 10). The loss is the
symmetric softmax contrastive loss, or the sigmoid loss (with a learned bias, initialised at
-2.71). Under torchrun every rank gathers the other ranks' embeddings with their gradients, so
the negatives are the global batch and the loss is the one-process loss of the joined batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from evalkit import distributed
from evalkit.errors import EvalkitError
from evalkit.storage.checkpoints import (
    SafetensorsSource,
    load_strict,
    read_state_dict,
    save_checkpoint,
)

VOCAB = 49408  # open_clip's byte-pair vocabulary
LOSSES = ("softmax", "sigmoid")
SIGMOID_BIAS_INIT = -2.71


@dataclass(frozen=True)
class TowerConfig:
    width: int = 192
    layers: int = 12
    heads: int = 3
    mlp_ratio: float = 4.0
    context: int = 16
    embed_dim: int = 0  # the image embedding's width
    image_head: bool = False
    loss: str = "softmax"
    temperature: float = 10.0
    image_tower: dict = field(default_factory=dict)  # what the cached embeddings came from
    # The zero-shot prompts the tower is scored with: big_vision's canonicalised LiT prompts
    # (towers saved before this field was recorded were scored so too).
    prompts: str = "canonical"


def _open_clip():
    try:
        import open_clip
    except ImportError as exc:
        raise EvalkitError(
            "LiT text towers need open_clip_torch: pip install 'evalkit[clip]'"
        ) from exc
    return open_clip


class LitModel(nn.Module):
    def __init__(self, cfg: TowerConfig):
        super().__init__()
        if cfg.loss not in LOSSES:
            raise EvalkitError(f"unknown LiT loss {cfg.loss!r}: choose from {', '.join(LOSSES)}")
        if cfg.width % cfg.heads:
            raise EvalkitError(
                f"text width {cfg.width} must be a multiple of its heads ({cfg.heads})"
            )
        transformer = _open_clip().transformer.TextTransformer
        self.cfg = cfg
        self.text = transformer(
            context_length=cfg.context,
            vocab_size=VOCAB,
            width=cfg.width,
            heads=cfg.heads,
            layers=cfg.layers,
            mlp_ratio=cfg.mlp_ratio,
            output_dim=cfg.embed_dim,
        )
        dim = cfg.embed_dim
        self.image_head = nn.Linear(dim, dim) if cfg.image_head else nn.Identity()
        self.log_temperature = nn.Parameter(torch.tensor(math.log(cfg.temperature)))
        self.bias = nn.Parameter(torch.tensor(SIGMOID_BIAS_INIT if cfg.loss == "sigmoid" else 0.0))

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.text(tokens), dim=-1, eps=1e-8)

    def embed_images(self, features: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.image_head(features.float()), dim=-1, eps=1e-8)

    def loss(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The contrastive loss of this rank's pairs against the global batch's."""
        images = gather_rows(self.embed_images(features))
        texts = gather_rows(self.embed_text(tokens))
        return contrastive_loss(images, texts, self.log_temperature, self.bias, kind=self.cfg.loss)


def contrastive_loss(images, texts, log_temperature, bias, *, kind: str = "softmax"):
    """Pairs are the diagonal. softmax: 0.5·(image→text + text→image) cross-entropy;
    sigmoid: −Σ log σ(±(logit + bias)) over all pairs, divided by the batch size. The logits
    and the loss are fp32 whatever the autocast around them: at temperature 1/100 a bf16
    similarity's rounding (~0.004) moves a logit by ~0.4."""
    with torch.autocast(images.device.type, enabled=False):
        logits = images.float() @ texts.float().T * log_temperature.float().exp()
        return _pair_loss(logits, None if bias is None else bias.float(), kind)


def _pair_loss(logits, bias, kind: str):
    if kind == "sigmoid":
        signs = 2 * torch.eye(len(logits), device=logits.device) - 1
        return -nn.functional.logsigmoid(signs * (logits + bias)).sum() / len(logits)
    target = torch.arange(len(logits), device=logits.device)
    ce = nn.functional.cross_entropy
    return 0.5 * (ce(logits, target) + ce(logits.T, target))


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every data-parallel rank's rows, in rank order, with gradients flowing back to each
    rank's own rows; one process returns ``x``."""
    layout = distributed.current()
    if layout.dp_size == 1:
        return x
    from torch.distributed._functional_collectives import all_gather_tensor_autograd

    return all_gather_tensor_autograd(x.contiguous(), 0, layout.mesh["dp"].get_group())


class LitText:
    """A trained tower as a ``TextTower``, plus the image side it was trained with."""

    def __init__(self, model: LitModel):
        self.model = model.eval().requires_grad_(False)
        self.cfg = model.cfg
        self.embed_dim = model.cfg.embed_dim
        self._tokenizer = tokenizer(model.cfg.context)
        self.prompt_style = model.cfg.prompts
        self.default_templates = "clip_paper"  # big_vision's LiT evaluators' set

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self._tokenizer(texts)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(next(self.model.parameters()).device)  # the tokenizer gives CPU ids
        return self.model.embed_text(tokens)

    def embed_images(self, features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model.embed_images(features.to(next(self.model.parameters()).device))


def tokenizer(context: int):
    """open_clip's byte-pair tokenizer, captions cut to ``context`` tokens."""
    return _open_clip().tokenizer.SimpleTokenizer(context_length=context)


def save_tower(model: LitModel, out: Path) -> Path:
    """``out/model.safetensors`` with the tower's config in its metadata."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    return save_checkpoint(state, Path(out), {"lit_tower": asdict(model.cfg)})


def load_tower(path: str | Path) -> LitText:
    """A saved tower; a file that is not one is a one-line error."""
    config = SafetensorsSource(path).config().get("lit_tower")
    if not config:
        raise EvalkitError(f"{path} is not a LiT text tower (no lit_tower config in its metadata)")
    model = LitModel(TowerConfig(**config))
    load_strict(model, read_state_dict(path), source=str(path))
    return LitText(model)
