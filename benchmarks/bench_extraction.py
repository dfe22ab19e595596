"""Feature extraction end to end (evalkit's ``extract_features``: loader, batching, forward
intermediates, pooling, shard assembly) against a bare ``model(x)`` loop over the same tensors,
and a warm-cache read against computing the features.

Targets: extraction throughput ≥ 0.95× the bare loop; warm cache ≥ 20× faster than computing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.common import best_time, report
from evalkit import load_backbone
from evalkit.features import ExtractSettings, FeatureRequest, extract_features


class TensorImages(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], 0

    def identity(self) -> str:
        return f"bench-tensors-{tuple(self.images.shape)}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backbone", default="timm/vit_tiny_patch16_224")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    backbone = load_backbone(args.backbone)
    size = backbone.info.preprocess.size
    images = torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(0))
    dataset = TensorImages(images)

    def bare():
        with torch.inference_mode():
            for batch in images.split(args.batch_size):
                backbone.model(batch)

    def ours(cache_dir=None):
        settings = ExtractSettings(cache_dir=cache_dir, batch_size=args.batch_size, progress=False)
        return extract_features(
            backbone, dataset, request=FeatureRequest(), settings=settings, split="bench"
        )

    bare_s, ours_s = best_time(bare), best_time(ours)
    with tempfile.TemporaryDirectory() as tmp:
        cold_s = best_time(lambda: ours(Path(tmp)), repeats=1)
        warm_s = best_time(lambda: ours(Path(tmp)), repeats=5)
    report(
        "extraction",
        {
            "backbone": args.backbone,
            "images": args.images,
            "baseline": "bare model(x) loop",
            "bare_img_s": round(args.images / bare_s, 1),
            "ours_img_s": round(args.images / ours_s, 1),
            "throughput_ratio": round(bare_s / ours_s, 3),
            "target_ratio": 0.95,
        },
    )
    report(
        "feature_cache",
        {
            "backbone": args.backbone,
            "images": args.images,
            "baseline": "computing the features (cold)",
            "cold_s": round(cold_s, 3),
            "warm_s": round(warm_s, 4),
            "speedup": round(cold_s / warm_s, 1),
            "target_speedup": 20,
        },
    )


if __name__ == "__main__":
    main()
