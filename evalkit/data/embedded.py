"""Embedded stand-in data: procedural images written to disk in the real layouts.

``shapes``: a classification set of shape × colour × texture classes (4 × 3 × 2 = 24), written
as ``<root>/{train,val}/<class>/<index>.png`` — the ImageNet class-folder layout — so the same
reader that reads ImageNet reads it. Every image is a pure function of (seed, split, class,
index): the same seed gives byte-identical files on any machine.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {"red": (220, 50, 40), "green": (40, 180, 60), "blue": (40, 80, 220)}
TEXTURES = ("solid", "striped")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class ShapesSpec:
    seed: int = 0
    train_per_class: int = 40
    val_per_class: int = 16
    size: int = 96

    def key(self) -> str:
        return f"shapes-s{self.seed}-t{self.train_per_class}-v{self.val_per_class}-px{self.size}"


def class_names() -> list[str]:
    return [f"{s}-{c}-{t}" for s in SHAPES for c in COLOURS for t in TEXTURES]


def render(spec: ShapesSpec, split: str, label: int, index: int) -> Image.Image:
    rng = np.random.default_rng([spec.seed, SPLITS.index(split), label, index])
    shape, colour, texture = class_names()[label].split("-")
    size = spec.size
    background = rng.normal(120, 25, (size, size, 3)) + rng.uniform(-40, 40, 3)
    radius = size * rng.uniform(0.18, 0.32)
    centre = rng.uniform(radius + 2, size - radius - 2, 2)
    mask = Image.new("L", (size, size), 0)
    _draw_shape(ImageDraw.Draw(mask), shape, centre, radius, rng.uniform(0, 2 * math.pi))
    inside = np.asarray(mask, dtype=bool)
    if texture == "striped":
        period = max(4, size // 12)
        ys, xs = np.mgrid[:size, :size]
        inside &= ((xs + ys) // (period // 2)) % 2 == 0
    fill = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 15, 3), 0, 255)
    pixels = np.where(inside[..., None], fill, background)
    pixels += rng.normal(0, 6, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, centre, radius: float, angle: float):
    cx, cy = centre
    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=255)
        return
    if shape == "cross":
        arm = radius / 3
        points = [
            (-arm, -radius),
            (arm, -radius),
            (arm, -arm),
            (radius, -arm),
            (radius, arm),
            (arm, arm),
            (arm, radius),
            (-arm, radius),
            (-arm, arm),
            (-radius, arm),
            (-radius, -arm),
            (-arm, -arm),
        ]
    else:
        corners = 4 if shape == "square" else 3
        points = [
            (
                radius * math.cos(2 * math.pi * k / corners),
                radius * math.sin(2 * math.pi * k / corners),
            )
            for k in range(corners)
        ]
    cos, sin = math.cos(angle), math.sin(angle)
    draw.polygon([(cx + x * cos - y * sin, cy + x * sin + y * cos) for x, y in points], fill=255)


def write_shapes(spec: ShapesSpec, root: Path) -> Path:
    """Write the set under ``root/<spec.key()>`` once; later calls return the finished folder.
    Written to a temporary folder and renamed, so a crash never leaves a half-written set."""
    target = Path(root) / spec.key()
    if (target / "spec.json").exists():
        return target
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    counts = {"train": spec.train_per_class, "val": spec.val_per_class}
    for split, count in counts.items():
        for label, name in enumerate(class_names()):
            folder = tmp / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                render(spec, split, label, index).save(folder / f"{index:05d}.png")
    (tmp / "spec.json").write_text(json.dumps(asdict(spec)))
    try:
        tmp.rename(target)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target
