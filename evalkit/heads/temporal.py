"""Heads that classify a clip from its per-frame features (B, T, D) (effect-table row 10;
docs/protocols.md, "Video").

- ``temporal``: the paper's "small transformer to aggregate frozen, per-frame
  representations": a linear map to ``width``, a class token, learned temporal position
  embeddings, ``depth`` pre-norm transformer blocks, then a linear classifier on the class token.
- ``attentive``: V-JEPA's attentive probe: one learned query attends over the frames in one
  cross-attention block (cross-attention + MLP, pre-norm) before a linear classifier. V-JEPA's
  tokens carry their time from its video encoder; per-frame image features do not, so the
  frames get learned temporal position embeddings here (without them the probe could not tell
  a clip from its reverse).
- ``mean``: the mean over frames, then a linear classifier (the baseline that cannot see
  the order of frames).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

HEADS = ("temporal", "attentive", "mean")


@dataclass(frozen=True)
class HeadConfig:
    kind: str = "temporal"
    width: int = 0  # 0: the feature width
    depth: int = 2  # temporal blocks
    heads: int = 0  # 0: width // 64 (at least 1)

    def sized(self, dim: int) -> HeadConfig:
        width = self.width or dim
        heads = self.heads or max(1, width // 64)
        while width % heads:  # the nearest head count that divides the width
            heads -= 1
        return HeadConfig(self.kind, width, self.depth, heads)


def build_head(cfg: HeadConfig, dim: int, classes: int, frames: int) -> nn.Module:
    cfg = cfg.sized(dim)
    if cfg.kind == "mean":
        return MeanLinear(dim, classes)
    if cfg.kind == "attentive":
        return AttentiveProbe(dim, classes, frames, cfg)
    return TemporalTransformer(dim, classes, frames, cfg)


class MeanLinear(nn.Module):
    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x.mean(1))


class TemporalTransformer(nn.Module):
    def __init__(self, dim: int, classes: int, frames: int, cfg: HeadConfig):
        super().__init__()
        self.inp = nn.Linear(dim, cfg.width)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.pos = nn.Parameter(torch.randn(1, frames + 1, cfg.width) * 0.02)
        block = nn.TransformerEncoderLayer(
            cfg.width,
            cfg.heads,
            4 * cfg.width,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(block, cfg.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.pos[:, : h.shape[1] + 1]
        return self.out(self.norm(self.blocks(h)[:, 0]))


class AttentiveProbe(nn.Module):
    def __init__(self, dim: int, classes: int, frames: int, cfg: HeadConfig):
        super().__init__()
        self.inp = nn.Linear(dim, cfg.width) if cfg.width != dim else nn.Identity()
        self.pos = nn.Parameter(torch.randn(1, frames, cfg.width) * 0.02)
        self.query = nn.Parameter(torch.randn(1, 1, cfg.width) * 0.02)
        self.norm_kv = nn.LayerNorm(cfg.width)
        self.attn = nn.MultiheadAttention(cfg.width, cfg.heads, batch_first=True)
        self.norm_mlp = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.norm_kv(self.inp(x) + self.pos[:, : x.shape[1]])
        q = self.query.expand(len(x), -1, -1)
        h = q + self.attn(q, kv, kv, need_weights=False)[0]
        h = h + self.mlp(self.norm_mlp(h))
        return self.out(self.norm(h[:, 0]))
