"""LiT training steps per second on cached image embeddings against recomputing the image
tower every step (what a trainer without the feature cache does), with
``timm/vit_small_patch16_224`` (random weights) and the default text tower (4 layers, width
192, batch 128, 16 tokens).

Target: cached ≥ 10× the recomputing baseline on this CPU.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import best_time, report
from evalkit import load_backbone
from evalkit.heads.text import LitModel, TowerConfig, tokenizer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    backbone = load_backbone("timm/vit_small_patch16_224")
    dim = backbone.info.embed_dim
    model = LitModel(TowerConfig(layers=4, embed_dim=dim, image_head=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = tokenizer(16)([f"a red striped circle number {i}" for i in range(args.batch)])
    images = torch.randn(args.batch, 3, 224, 224)
    cached = torch.randn(args.batch, dim)

    def step(features):
        loss = model.loss(features, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def from_cache():
        for _ in range(args.steps):
            step(cached)

    def recomputing():
        for _ in range(args.steps):
            with torch.no_grad():
                features = backbone.extract(images, layers=(-1,), pool="mean").pooled
            step(features)

    cached_s = best_time(from_cache) / args.steps
    baseline_s = best_time(recomputing, repeats=1) / args.steps
    report(
        "lit",
        {
            "steps_per_s_cached": round(1 / cached_s, 2),
            "steps_per_s_recomputing": round(1 / baseline_s, 3),
            "speedup": round(baseline_s / cached_s, 1),
            "target": ">= 10",
        },
    )


if __name__ == "__main__":
    main()
