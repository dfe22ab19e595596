"""ImageNet-C fidelity: per corruption and severity, the mean absolute change evalkit's
corruption makes to an image (0–255) beside the original generator's on the same images, and
the original's parameters. The images are four closed-form 224-px pictures (gratings, rings,
gradients), so anyone can recompute the reference.

The reference (``ORIGINAL``) was measured once by running the original generation code —
``make_imagenet_c.py`` of the published ImageNet-C for fog, frost (its five photographs) and
elastic_transform; for motion_blur and snow, whose original calls ImageMagick, the NumPy port
of ImageMagick's motion blur in ``imagecorruptions`` 1.1.2 — with 60 seeds each. glass_blur and
zoom_blur are measured in the same run from ``original_glass_blur`` and ``original_zoom_blur``
below: the original algorithms, one image at a time with NumPy and SciPy as the original runs
them (its pixel loop, SciPy's ``gaussian_filter`` and ``zoom``). The baseline of each ratio is
that reference; 1.00 is the original's amount. Without the ``imagecorruptions`` package, frost
uses evalkit's procedural texture (docs/protocols.md, "ImageNet-C")."""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import report
from evalkit.data.corruptions import CORRUPTIONS, corrupt, frost_photos

ORIGINAL = {
    "motion_blur": (7.53, 12.06, 17.57, 22.33, 24.77),
    "fog": (38.37, 42.28, 45.59, 45.82, 47.91),
    "frost": (60.45, 70.32, 75.68, 72.17, 75.18),
    "elastic_transform": (36.32, 44.28, 12.92, 13.27, 14.58),
    "snow": (44.12, 71.67, 70.99, 85.16, 101.17),
}


def analytic_images() -> np.ndarray:
    """Four 224-px test images in closed form: gratings, rings and gradients in colour."""
    y, x = np.mgrid[0:224, 0:224] / 224.0
    r = np.hypot(x - 0.5, y - 0.4)
    checks = np.sign(np.sin(2 * np.pi * 5 * x)) * np.sign(np.sin(2 * np.pi * 5 * y))
    planes = [
        (0.5 + 0.4 * np.sin(2 * np.pi * 6 * x), 0.3 + 0.5 * y, 0.6 - 0.4 * x),
        (
            0.5 + 0.45 * np.cos(2 * np.pi * 10 * r),
            0.4 + 0.3 * np.sin(2 * np.pi * 3 * y),
            0.5 * (x + y),
        ),
        (0.2 + 0.6 * (r < 0.3), 0.7 - 0.5 * y, 0.3 + 0.3 * np.sin(2 * np.pi * 4 * (x + y))),
        (0.8 - 0.6 * x * y, 0.5 + 0.35 * checks, 0.35 + 0.25 * np.cos(2 * np.pi * 2 * x)),
    ]
    return np.stack([np.clip(np.stack(p, -1), 0, 1) * 255 for p in planes]).astype(np.uint8)


def original_glass_blur(image: np.ndarray, c, rng: np.random.Generator) -> np.ndarray:
    """The original's glass blur of one 224-px image: blur, keep 8 bits, then its pixel loop,
    whose tuple "swap" of NumPy views copies one way (written here as that copy)."""
    from scipy.ndimage import gaussian_filter

    def blur(x):
        return gaussian_filter(x, sigma=(c[0], c[0], 0), mode="nearest", truncate=4.0)

    x = np.uint8(blur(image / 255.0) * 255)
    size = x.shape[0]
    for offsets in rng.integers(-c[1], c[1], size=(c[2], size, size, 2)):
        for h in range(size - c[1], c[1], -1):
            for w in range(size - c[1], c[1], -1):
                dx, dy = offsets[h, w]
                x[h, w] = x[h + dy, w + dx]
    return np.uint8(np.clip(blur(x / 255.0), 0, 1) * 255)


def original_zoom_blur(image: np.ndarray, zooms) -> np.ndarray:
    """The original's zoom blur of one image: the mean of the image and its centre crops
    enlarged by SciPy's ``zoom`` (order 1) and trimmed to the image's size."""
    from scipy.ndimage import zoom

    x = (image / 255.0).astype(np.float32)
    out = np.zeros_like(x)
    size = x.shape[0]
    for factor in zooms:
        crop = int(np.ceil(size / factor))
        top = (size - crop) // 2
        big = zoom(x[top : top + crop, top : top + crop], (factor, factor, 1), order=1)
        trim = (big.shape[0] - size) // 2
        out += big[trim : trim + size, trim : trim + size]
    return np.uint8(np.clip((x + out) / (len(zooms) + 1), 0, 1) * 255)


def original_change(images: np.ndarray, name: str, severity: int, seeds: int) -> float:
    c = CORRUPTIONS[name][1][severity - 1]
    changes = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        for image in images:
            out = (
                original_glass_blur(image, c, rng)
                if name == "glass_blur"
                else original_zoom_blur(image, c)
            )
            changes.append(np.abs(out.astype(float) - image).mean())
    return float(np.mean(changes))


MEASURED = ("glass_blur", "zoom_blur")  # references computed in the run


def mean_change(images: np.ndarray, name: str, severity: int, seeds: int) -> float:
    changes = [
        np.abs(corrupt(images, name, severity, seed=s).astype(float) - images).mean()
        for s in range(seeds)
    ]
    return float(np.mean(changes))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    images, record = (
        analytic_images(),
        {"seeds": args.seeds, "frost_photographs": bool(frost_photos())},
    )
    references = dict(ORIGINAL)
    for name in MEASURED:
        seeds = min(args.seeds, 4) if name == "glass_blur" else 1  # zoom_blur draws nothing
        references[name] = tuple(original_change(images, name, s, seeds) for s in range(1, 6))
    for name, reference in references.items():
        ours = [mean_change(images, name, s, args.seeds) for s in range(1, 6)]
        record[name] = {
            "parameters": [str(p) for p in CORRUPTIONS[name][1]],
            "original": [round(r, 2) for r in reference],
            "ours": [round(v, 2) for v in ours],
            "ratio": [round(v / r, 3) for v, r in zip(ours, reference, strict=True)],
        }
        print(
            f"{name:18s} ours/original "
            + "  ".join(
                f"s{s}: {v:.1f}/{r:.1f}"
                for s, (v, r) in enumerate(zip(ours, reference, strict=True), 1)
            )
        )
    report("corruption_fidelity", record)


if __name__ == "__main__":
    main()
