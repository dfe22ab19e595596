"""``evalkit prepare imagenet-c``: a user's ImageNet validation set under the 15 corruptions × 5
severities, written in ImageNet-C's layout (``<corruption>/<severity>/<wnid>/<image>.JPEG``)
for ``imagenet-c-ece`` or any other tool (effect-table row 11; docs/protocols.md,
"ImageNet-C").

As the original generator: each image resized (short side 256, bilinear) and centre-cropped to
224, corrupted by ``evalkit.data.corruptions``, saved as JPEG at quality 85. Each output's
randomness is seeded from (seed, corruption, severity, the image's path), so a file's content
does not depend on the worker that wrote it or on which files were already there: a run
resumes by skipping finished files. Every file is written through ``evalkit.storage.writes`` (under a
temporary name, then renamed; a full disk is one line); temporaries left by a killed run are
swept when the next one starts; worker processes end when the command's process does; and
``provenance.json`` counts the outputs on disk, whichever runs wrote them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from evalkit.data.corruptions import NAMES, SEVERITIES, corrupt
from evalkit.data.folder import to_rgb
from evalkit.errors import EvalkitError
from evalkit.seeds import derived_seed
from evalkit.storage.identity import write_json
from evalkit.storage.writes import process_ended, replacing, sweep_stale

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
RESIZE, CROP, QUALITY = 256, 224, 85


def image_seed(seed: int, corruption: str, severity: int, relative: str) -> int:
    """32 bits of the image's derived seed (the low half, so files prepared before the seed
    rule are unchanged)."""
    return derived_seed(seed, corruption, severity, relative) & 0xFFFFFFFF


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
        with replacing(path) as partial:
            Image.fromarray(out).save(partial, format="JPEG", quality=QUALITY, optimize=True)
    return len(todo)


def _worker_start(parent: int):
    """A pool worker: one torch thread (the workers share the cores), and ended by the kernel
    when the command's process dies (a killed parent would otherwise leave it running)."""
    import torch

    torch.set_num_threads(1)
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def sweep_temporaries(dest: Path):
    """Remove what killed writers left under ``dest``: this version's temporaries and the
    ``.<name>.<pid>.partial`` files of earlier versions, whose writer has ended."""
    for folder, _, names in os.walk(dest):
        if any(name.startswith(".") for name in names):
            sweep_stale(Path(folder))
            for name in names:
                pid = name.removesuffix(".partial").rpartition(".")[2]
                if name.endswith(".partial") and pid.isdigit() and process_ended(int(pid)):
                    with contextlib.suppress(OSError):
                        (Path(folder) / name).unlink()


def on_disk(dest: Path, images: list[str], corruptions, severities) -> int:
    return sum(
        path.is_file() for r in images for *_, path in outputs(dest, r, corruptions, severities)
    )


def clean_images(source: Path) -> list[str]:
    images = sorted(
        str(p.relative_to(source)) for p in source.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not images:
        raise EvalkitError(
            f"no images under {source}: expected an ImageNet val in class folders <wnid>/<image>"
        )
    return images


def prepare_imagenet_c(
    source: Path,
    dest: Path,
    *,
    workers: int,
    seed: int,
    progress,
    corruptions=NAMES,
    severities=SEVERITIES,
) -> dict:
    """Writes the sets; returns counts. ``dest/provenance.json`` records the seed and settings."""
    source, dest = Path(source), Path(dest)
    images = clean_images(source)
    unknown = sorted(set(corruptions) - set(NAMES))
    if unknown:
        raise EvalkitError(
            f"unknown corruptions {', '.join(unknown)}: choose from {', '.join(NAMES)}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(dest)
    jobs = [(source, dest, r, tuple(corruptions), tuple(severities), seed) for r in images]
    written = 0
    if workers <= 1:
        for job in progress(jobs, "imagenet-c"):
            written += corrupt_one(job)
    else:
        with ProcessPoolExecutor(
            workers, initializer=_worker_start, initargs=(os.getpid(),)
        ) as pool:
            for count in progress(
                pool.map(corrupt_one, jobs, chunksize=8), "imagenet-c", total=len(jobs)
            ):
                written += count
    total = len(images) * len(corruptions) * len(severities)
    provenance = {
        "source": str(source),
        "seed": seed,
        "resize": RESIZE,
        "crop": CROP,
        "jpeg_quality": QUALITY,
        "corruptions": list(corruptions),
        "severities": list(severities),
        "seeding": "sha256(seed:corruption:severity:relative path)[:4], little-endian",
        "images": len(images),
        "outputs": on_disk(dest, images, corruptions, severities),
    }
    write_json(dest / "provenance.json", provenance)
    return {"images": len(images), "outputs": total, "written": written, "kept": total - written}
