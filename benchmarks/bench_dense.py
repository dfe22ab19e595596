"""Dense tasks on this CPU with ``vit22b/s`` at 224 px: dense feature extraction (4 tapped
layers' patch grids) in images/s; UperNet head training steps/s on cached features against
the same steps re-running the frozen backbone for every batch (the baseline a cache avoids);
peak resident memory. Target: cached head training ≫ 1× the backbone-in-the-loop steps."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from benchmarks.bench_extraction import TensorImages
from benchmarks.common import peak_rss_mb, report
from evalkit.backbones import BackboneOptions, load_backbone
from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.heads.decoders import LinearSegmentation, UperNetSegmentation
from evalkit.protocols.grids import tap_layers


def train_steps(head, grids_for, steps: int, batch: int, n: int) -> float:
    """Seconds per step of head training; ``grids_for(indices)`` supplies the inputs."""
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    target = torch.randint(0, 150, (batch, 56, 56))
    start = time.perf_counter()
    for step in range(steps):
        indices = torch.arange(step * batch, (step + 1) * batch) % n
        logits = F.interpolate(head(grids_for(indices)), size=(56, 56), mode="bilinear")
        loss = F.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    backbone = load_backbone("vit22b/s", BackboneOptions())
    layers = tap_layers(backbone.info.depth)
    torch.manual_seed(0)
    images = torch.randn(args.images, 3, 224, 224)
    request = FeatureRequest(layers=layers, pool="mean", dense=True)
    settings = ExtractSettings(cache_dir=None, batch_size=args.batch, workers=0, progress=False)
    start = time.perf_counter()
    feats = extract_features(
        backbone, TensorImages(images), request=request, settings=settings, split="x"
    )
    extract_s = time.perf_counter() - start
    dims = [backbone.info.embed_dim] * 4

    def from_cache(indices):
        return [g[indices] for g in feats.grids]

    def from_backbone(indices):
        with torch.inference_mode():
            grids = backbone.extract(images[indices], layers=layers, pool="mean", dense=True).grids
        return [g.clone() for g in grids]

    record = {"backbone": "vit22b/s", "extract_img_per_s": round(args.images / extract_s, 1)}
    heads = {"linear": LinearSegmentation(dims, 150), "upernet": UperNetSegmentation(dims, 150, 64)}
    for name, head in heads.items():
        train_steps(head, from_cache, 1, args.batch, args.images)  # warm-up
        cached = train_steps(head, from_cache, args.steps, args.batch, args.images)
        live = train_steps(head, from_backbone, args.steps, args.batch, args.images)
        record[f"{name}_steps_per_s_cached"] = round(1 / cached, 2)
        record[f"{name}_steps_per_s_backbone_in_loop"] = round(1 / live, 2)
        record[f"{name}_cached_vs_backbone_in_loop"] = round(live / cached, 2)
    record["peak_rss_mb"] = round(peak_rss_mb())
    report("dense", record)


if __name__ == "__main__":
    main()
