"""The ViT-22B model family (Dehghani et al. 2023, §2 "Model architecture"; docs/protocols.md,
"Architecture").

One recipe at every size: a parallel block, ``y = x + Attn(LN(x)) + MLP(LN(x))`` on one shared
pre-norm; a norm on queries and keys per head (over the head dimension); every norm applied
"without bias and centering", as the paper says (RMS normalisation with a learned scale;
``norm="layer"`` is the centred LayerNorm); no bias on the QKV projections, MLP biases kept;
GELU; patch 14; learned position embeddings on the patches; pooled by a MAP head (or GAP, or a
class token). ``SIZES`` holds the paper's
22B, ViT-e and ViT-G and the same recipe at L, B, S, Ti and a ``test`` size.

Ablation switches (paper's stability and efficiency findings): ``qk_norm``, ``qkv_bias``,
``ln_bias`` (with ``norm="layer"``) and ``parallel`` (False = the standard sequential pre-LN
block). ``pre_norm``, ``patch_bias``, ``pool``, ``class_token`` and ``fc_norm`` exist so timm's
``vit_*_xp_*`` models and big_vision trees convert exactly.

Every projection is its own named ``nn.Linear`` so a sharding plan can address it by name, and
each place where branch outputs meet the residual stream is a named identity module
(``reduce``, or ``reduce_attn``/``reduce_mlp``): a tensor-parallel plan puts its all-reduce
there (one per parallel block, two per sequential block). This file has no distributed code;
sharding is applied from outside by ``evalkit.parallel``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from evalkit import seeds

POOLS = ("map", "gap", "cls")
NORMS = ("layer", "rms")


@dataclass(frozen=True)
class ViTConfig:
    width: int
    depth: int
    heads: int
    mlp: int
    patch: int = 14
    image: int = 224
    qk_norm: bool = True
    qkv_bias: bool = False
    ln_bias: bool = False
    parallel: bool = True
    pool: str = "map"
    norm: str = "rms"  # the paper: every LayerNorm "without bias and centering"
    pre_norm: bool = False
    patch_bias: bool = True
    class_token: bool = False  # a class token (``pool="cls"`` sets it; MAP and GAP skip it)
    fc_norm: bool = False  # the final norm after pooling instead of before (timm's fc_norm)
    pool_prefix: bool = False  # MAP/mean pool the class token too (timm's pool_include_prefix)
    eps: float = 1e-6

    def __post_init__(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by {self.heads} heads")
        if self.pool not in POOLS or self.norm not in NORMS:
            raise ValueError(f"pool must be one of {POOLS} and norm one of {NORMS}")
        if self.norm == "rms" and self.ln_bias:
            raise ValueError("RMS norms have no bias: ln_bias needs norm=layer")
        if self.pool == "cls":  # one spelling per model: class-token pooling has a class token
            object.__setattr__(self, "class_token", True)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def grid(self) -> int:
        return self.image // self.patch

    @property
    def prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    def as_dict(self) -> dict:
        return asdict(self)


# width, depth, heads, MLP. 22b/e/g are the paper's Table 1; l/b/s/ti follow the ViT ladder.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "22b": (6144, 48, 48, 24576),
    "e": (1792, 56, 16, 15360),
    "g": (1664, 48, 16, 8192),
    "l": (1024, 24, 16, 4096),
    "b": (768, 12, 12, 3072),
    "s": (384, 12, 6, 1536),
    "ti": (192, 12, 3, 768),
    "test": (64, 4, 4, 256),
}


def config(size: str, **switches) -> ViTConfig:
    """The config of a named size, with ablation switches applied (``qk_norm=False`` …)."""
    if size not in SIZES:
        raise KeyError(size)
    width, depth, heads, mlp = SIZES[size]
    return replace(ViTConfig(width, depth, heads, mlp), **switches)


def make_norm(cfg: ViTConfig, dim: int) -> nn.Module:
    if cfg.norm == "rms":
        return nn.RMSNorm(dim, eps=cfg.eps)
    return nn.LayerNorm(dim, eps=cfg.eps, bias=cfg.ln_bias)


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, N, H·d) → (B, H, N, d). The head count comes from the width, so a projection
    whose output columns are sharded runs just its local heads."""
    return x.unflatten(-1, (-1, head_dim)).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(cfg.width, cfg.width, bias=cfg.qkv_bias)
        self.k = nn.Linear(cfg.width, cfg.width, bias=cfg.qkv_bias)
        self.v = nn.Linear(cfg.width, cfg.width, bias=cfg.qkv_bias)
        # One norm shared by all heads, over the head dimension: softmax(LN(Q)·LN(K)ᵀ/√d).
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else nn.Identity()
        self.out = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_norm(split_heads(self.q(x), self.head_dim))
        k = self.k_norm(split_heads(self.k(x), self.head_dim))
        v = split_heads(self.v(x), self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Parallel (one shared norm, one reduction) or sequential pre-LN block."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.parallel = cfg.parallel
        self.norm1 = make_norm(cfg, cfg.width)
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg.width, cfg.mlp)
        if cfg.parallel:
            self.reduce = nn.Identity()
        else:
            self.norm2 = make_norm(cfg, cfg.width)
            self.reduce_attn = nn.Identity()
            self.reduce_mlp = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            h = self.norm1(x)
            return x + self.reduce(self.attn(h) + self.mlp(h))
        x = x + self.reduce_attn(self.attn(self.norm1(x)))
        return x + self.reduce_mlp(self.mlp(self.norm2(x)))


class MAPHead(nn.Module):
    """Multihead attention pooling (big_vision's MAPHead): a learned probe attends over the
    tokens, then a residual MLP; returns one vector per image."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.probe = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.q = nn.Linear(cfg.width, cfg.width)
        self.k = nn.Linear(cfg.width, cfg.width)
        self.v = nn.Linear(cfg.width, cfg.width)
        self.out = nn.Linear(cfg.width, cfg.width)
        # big_vision's MAP head norm is a LayerNorm with bias; timm's follows the model's norm.
        rms = cfg.norm == "rms"
        self.norm = (
            nn.RMSNorm(cfg.width, eps=cfg.eps) if rms else nn.LayerNorm(cfg.width, eps=cfg.eps)
        )
        self.mlp = MLP(cfg.width, cfg.mlp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        probe = self.probe.expand(tokens.shape[0], -1, -1)
        q = split_heads(self.q(probe), self.head_dim)
        k = split_heads(self.k(tokens), self.head_dim)
        v = split_heads(self.v(tokens), self.head_dim)
        y = self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        return (y + self.mlp(self.norm(y)))[:, 0]


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(3, cfg.width, cfg.patch, cfg.patch, bias=cfg.patch_bias)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.grid**2, cfg.width))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.prefix_tokens else None
        self.norm_pre = make_norm(cfg, cfg.width) if cfg.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.Identity() if cfg.fc_norm else make_norm(cfg, cfg.width)
        self.head = MAPHead(cfg) if cfg.pool == "map" else None
        self.fc_norm = make_norm(cfg, cfg.width) if cfg.fc_norm else nn.Identity()

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)
        x = x.flatten(2).transpose(1, 2) + self.position_embedding(*x.shape[-2:])
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.norm_pre(x)

    def position_embedding(self, h: int, w: int) -> torch.Tensor:
        """The learned grid, resampled bicubically when the input is not the trained size
        (dense tasks run at 504 px and more)."""
        g = self.cfg.grid
        if (h, w) == (g, g):
            return self.pos_embed
        grid = self.pos_embed.reshape(1, g, g, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
        return grid.flatten(2).transpose(1, 2)

    def forward_layers(self, images: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """Token sequences after the given blocks (0-based), each passed through the final
        norm (timm's ``forward_intermediates(norm=True)`` convention). Blocks after the last
        requested one are not run."""
        wanted, out = set(layers), {}
        x = self.embed(images)
        for index, block in enumerate(self.blocks[: max(layers) + 1]):
            x = block(x)
            if index in wanted:
                out[index] = self.norm(x)
        return [out[i] for i in layers]

    def pool(self, tokens: torch.Tensor, how: str | None = None) -> torch.Tensor:
        """One vector per image: the MAP head or the mean over the patch tokens (a class
        token is left out of both unless ``pool_prefix``), or the class token; then
        ``fc_norm`` when it is on."""
        how = how or self.cfg.pool
        if how == "cls":
            return self.fc_norm(tokens[:, 0])
        patches = tokens if self.cfg.pool_prefix else tokens[:, self.cfg.prefix_tokens :]
        return self.fc_norm(self.head(patches) if how == "map" else patches.mean(dim=1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_layers(images, [self.cfg.depth - 1])[0])


def init_value(name: str, shape: Sequence[int], seed: int) -> torch.Tensor:
    """The seeded initial value of one parameter, computed from its name alone so a rank that
    holds a slice gets exactly the slice of the unsharded value. Matrices are LeCun normal
    (std 1/√fan_in), norm scales 1, biases 0, embeddings and the probe N(0, 0.02)."""
    shape = tuple(shape)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    generator = seeds.generator(seed, name)
    if leaf in ("pos_embed", "cls_token", "probe"):
        return torch.randn(shape, generator=generator) * 0.02
    if len(shape) == 1:
        return torch.ones(shape)
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=generator) / math.sqrt(fan_in)


def build(cfg: ViTConfig, *, seed: int = 0) -> ViT:
    """An unsharded model with seeded weights (tests and small sizes)."""
    model = ViT(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(init_value(name, param.shape, seed))
    return model
