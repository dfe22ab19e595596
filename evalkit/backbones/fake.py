"""``fake``: a tiny deterministic backbone for tests and demos.

A seeded random patch projection followed by a few residual tanh layers: no training, no
download, a few milliseconds per batch, yet its features carry colour and shape information,
so probes on it learn something real. ``model_kwargs`` may set ``delay`` (seconds per batch) so
tests can interrupt an extraction midway.
"""

from __future__ import annotations

import time

import torch

from evalkit.backbones.base import (
    WEIGHTS_DRAW,
    BackboneInfo,
    Features,
    Preprocess,
    absolute_layers,
    build_transform,
    check_pool,
    model_input,
    pool_tokens,
    random_init_id,
)
from evalkit.backbones.options import BackboneOptions
from evalkit.seeds import generator


class FakeNet(torch.nn.Module):
    def __init__(self, dim: int = 32, depth: int = 3, patch: int = 8, seed: int = 0):
        super().__init__()
        gen = generator(seed, WEIGHTS_DRAW)
        self.patch = patch
        self.embed = torch.nn.Parameter(torch.randn(3 * patch * patch, dim, generator=gen) / patch)
        self.layers = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(dim, dim, generator=gen) / dim**0.5)
            for _ in range(depth)
        )

    def forward_layers(self, images: torch.Tensor) -> list[torch.Tensor]:
        b, _, h, w = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)  # B, C, h, w, p, p
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, (h // p) * (w // p), -1)
        x = patches @ self.embed
        outs = []
        for weight in self.layers:
            x = x + torch.tanh(x @ weight)
            outs.append(x)
        return outs


MODEL_OPTIONS = frozenset({"delay", "img_size", "dim", "depth", "patch"})


class FakeBackbone:
    def __init__(self, opts: BackboneOptions):
        kwargs = dict(opts.model_kwargs)
        self.delay = float(kwargs.pop("delay", 0.0))
        self.size = int(kwargs.pop("img_size", 32))
        self.model = FakeNet(seed=opts.seed, **kwargs).to(opts.device).requires_grad_(False)
        self.info = BackboneInfo(
            name="fake",
            weights_id=random_init_id(
                f"fake:{sorted(kwargs.items())}", opts.seed, draw=WEIGHTS_DRAW
            ),
            embed_dim=self.model.embed.shape[1],
            patch_size=self.model.patch,
            depth=len(self.model.layers),
            num_prefix_tokens=1,
            params=sum(p.numel() for p in self.model.parameters()),
            preprocess=Preprocess(
                size=self.size,
                crop_pct=1.0,
                interpolation="bilinear",
                mean=(0.5, 0.5, 0.5),
                std=(0.5, 0.5, 0.5),
            ),
            pools=("cls", "mean"),
            random_init=True,
        )

    def transform(self, train: bool = False):
        return build_transform(self.info.preprocess, train=train)

    def extract(self, images, *, layers=(-1,), pool="cls", dense=False) -> Features:
        check_pool(self.info, pool)
        images = model_input(images, self.info.preprocess)
        if self.delay:
            time.sleep(self.delay)
        outs = self.model.forward_layers(images)
        h, w = (s // self.model.patch for s in images.shape[-2:])  # Waymo frames are 3:2
        pooled, grids = [], []
        for index in absolute_layers(tuple(layers), self.info.depth):
            tokens = outs[index]
            grid = tokens.transpose(1, 2).reshape(tokens.shape[0], -1, h, w)
            # The "class token" is a max-pool: a prefix token distinct from the mean.
            prefix = tokens.amax(dim=1, keepdim=True)
            pooled.append(pool_tokens(prefix, grid, pool))
            grids.append(grid)
        return Features(pooled=torch.cat(pooled, dim=1), grids=grids if dense else None)


def build(variant: str, opts: BackboneOptions) -> FakeBackbone:
    return FakeBackbone(opts)
