"""``evalkit prepare imagenet-c``: a user's ImageNet validation set under the 15 corruptions × 5
severities, written in ImageNet-C's layout (``<corruption>/<severity>/<wnid>/<image>.JPEG``)
for ``imagenet-c-ece`` or any other tool (effect-table row 11; docs/protocols.md,
"ImageNet-C").

As the original generator: each image resized (short side 256, bilinear) and centre-cropped to
224, corrupted by ``evalkit.data.corruptions``, saved as JPEG at quality 85. Each output's
randomness is seeded from (seed, corruption, severity, the image's path), so a file's content
does not depend on the worker that wrote it or on which files were already there: a run
resumes by skipping finished files (written under a temporary name, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from evalkit.data.corruptions import NAMES, SEVERITIES, corrupt
from evalkit.data.folder import to_rgb
from evalkit.errors import EvalkitError

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
RESIZE, CROP, QUALITY = 256, 224, 85


def image_seed(seed: int, corruption: str, severity: int, relative: str) -> int:
    digest = hashlib.sha256(f"{seed}:{corruption}:{severity}:{relative}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def centre_crop(path: Path) -> np.ndarray:
    image = to_rgb(Image.open(path))
    scale = RESIZE / min(image.size)
    size = (max(RESIZE, round(image.width * scale)), max(RESIZE, round(image.height * scale)))
    image = image.resize(size, Image.BILINEAR)
    left, top = (image.width - CROP) // 2, (image.height - CROP) // 2
    return np.asarray(image.crop((left, top, left + CROP, top + CROP)))


def outputs(dest: Path, relative: str, corruptions, severities):
    stem = str(Path(relative).with_suffix(".JPEG"))
    return [(c, s, dest / c / str(s) / stem) for c in corruptions for s in severities]


def corrupt_one(job: tuple) -> int:
    """Every missing output of one clean image; returns how many were written."""
    source, dest, relative, corruptions, severities, seed = job
    todo = [o for o in outputs(dest, relative, corruptions, severities) if not o[2].is_file()]
    if not todo:
        return 0
    clean = centre_crop(source / relative)
    for corruption, severity, path in todo:
        out = corrupt(
            clean, corruption, severity, seed=image_seed(seed, corruption, severity, relative)
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        Image.fromarray(out).save(partial, format="JPEG", quality=QUALITY, optimize=True)
        partial.replace(path)
    return len(todo)


def _one_thread():
    import torch

    torch.set_num_threads(1)  # the workers share the cores


def clean_images(source: Path) -> list[str]:
    images = sorted(
        str(p.relative_to(source)) for p in source.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not images:
        raise EvalkitError(
            f"no images under {source}: expected an ImageNet val in class folders <wnid>/<image>"
        )
    return images


def prepare_imagenet_c(source: Path, dest: Path, *, workers: int, seed: int, progress,
                       corruptions=NAMES, severities=SEVERITIES) -> dict:  # fmt: skip
    """Writes the sets; returns counts. ``dest/provenance.json`` records the seed and settings."""
    source, dest = Path(source), Path(dest)
    images = clean_images(source)
    unknown = sorted(set(corruptions) - set(NAMES))
    if unknown:
        raise EvalkitError(
            f"unknown corruptions {', '.join(unknown)}: choose from {', '.join(NAMES)}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    provenance = {"source": str(source), "seed": seed, "resize": RESIZE, "crop": CROP, "jpeg_quality": QUALITY,
                  "corruptions": list(corruptions), "severities": list(severities),
                  "seeding": "sha256(seed:corruption:severity:relative path)[:4], little-endian"}  # fmt: skip
    (dest / "provenance.json").write_text(json.dumps(provenance, indent=1))
    jobs = [(source, dest, r, tuple(corruptions), tuple(severities), seed) for r in images]
    written = 0
    if workers <= 1:
        for job in progress(jobs, "imagenet-c"):
            written += corrupt_one(job)
    else:
        with ProcessPoolExecutor(workers, initializer=_one_thread) as pool:
            for count in progress(
                pool.map(corrupt_one, jobs, chunksize=8), "imagenet-c", total=len(jobs)
            ):
                written += count
    total = len(images) * len(corruptions) * len(severities)
    return {"images": len(images), "outputs": total, "written": written, "kept": total - written}
