"""Feature extraction end to end (evalkit's ``extract_features``: loader, batching, forward
intermediates, pooling, shard assembly) against a bare ``model(x)`` loop over the same tensors,
a warm-cache read against computing the features, and extraction from a JPEG class-folder set
(decode and resize in loader workers, overlapped with the forward) against a bare forward over
the same images already decoded.

Targets: extraction throughput ≥ 0.95× the bare loop; warm cache ≥ 20× faster than computing;
from JPEG files ≥ 0.90× the pre-decoded forward (``timm/vit_base_patch16_224``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.common import best_time, report
from evalkit import load_backbone
from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest


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
    parser.add_argument("--jpeg-backbone", default="timm/vit_base_patch16_224")
    parser.add_argument("--jpeg-images", type=int, default=192)
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
    with tempfile.TemporaryDirectory() as tmp:
        jpeg_extraction(args.jpeg_backbone, args.jpeg_images, args.batch_size, Path(tmp))


def write_jpegs(root: Path, count: int) -> Path:
    """ImageNet-sized JPEGs (500×375, quality 90) of the stand-in's drawings, in class folders."""
    from PIL import Image

    from evalkit.data.embedded import ShapesSpec, render

    for i in range(count):
        folder = root / "train" / f"class{i % 8}"
        folder.mkdir(parents=True, exist_ok=True)
        image = render(ShapesSpec(), "train", i % 8, i).resize((500, 375), Image.BICUBIC)
        image.save(folder / f"{i:05d}.jpg", quality=90)
    return root / "train"


def jpeg_extraction(spec: str, count: int, batch_size: int, tmp: Path):
    from evalkit.data.folder import ImageFolder

    backbone = load_backbone(spec)
    dataset = ImageFolder(write_jpegs(tmp, count), backbone.transform())
    decoded = torch.stack([dataset[i][0] for i in range(len(dataset))])

    def bare():
        with torch.inference_mode():
            for batch in decoded.split(batch_size):
                backbone.model(batch)

    def from_files():
        settings = ExtractSettings(batch_size=batch_size, shard_size=batch_size, progress=False)
        extract_features(
            backbone, dataset, request=FeatureRequest(), settings=settings, split="jpeg"
        )

    bare_s, files_s = best_time(bare, repeats=1), best_time(from_files, repeats=1)
    report(
        "extraction_jpeg",
        {
            "backbone": spec,
            "images": count,
            "baseline": "bare forward over the same images, decoded beforehand",
            "decoded_img_s": round(count / bare_s, 1),
            "from_jpeg_img_s": round(count / files_s, 1),
            "ratio": round(bare_s / files_s, 3),
            "target_ratio": 0.90,
        },
    )


if __name__ == "__main__":
    main()
