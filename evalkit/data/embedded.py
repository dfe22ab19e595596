"""Embedded stand-in data: procedural images written to disk in the real layouts.

``shapes``: a classification set of shape × colour × texture classes (4 × 3 × 2 = 24), written
as ``<root>/{train,val}/<class>/<index>.png`` — the ImageNet class-folder layout — so the same
reader that reads ImageNet reads it. Every image is a pure function of (seed, split, class,
index): the same seed gives byte-identical files on any machine.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from evalkit.storage.writes import replacing, sweep_stale

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {"red": (220, 50, 40), "green": (40, 180, 60), "blue": (40, 80, 220)}
TEXTURES = ("solid", "striped")
SPLITS = ("train", "val")
CORNERS = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}
DONE = "spec.json"  # written last: a folder with it is complete


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
    return draw(rng, spec.size, (shape, colour, texture)).image


@dataclass(frozen=True)
class Drawing:
    """A drawn image and what is in it, for captions: the object's radius and centre as
    fractions of the image side, and the background's mean brightness (0–255)."""

    image: Image.Image
    radius: float
    centre: tuple[float, float]
    brightness: float
    mask: np.ndarray | None = None  # the whole object, stripes and outline filled in


STYLES = ("photo", "shifted", "rendition", "hard")


def draw(rng, size: int, what: tuple[str, str, str], style: str = "photo") -> Drawing:
    """One object (shape, colour, texture) on a background. ``photo`` is the training
    distribution; ``shifted`` (the ObjectNet stand-in) draws other backgrounds, a squashed
    viewpoint and clutter; ``rendition`` (ImageNet-R) an outline on paper; ``hard``
    (ImageNet-A) a small, low-contrast object in heavy noise."""
    shape, colour, texture = what
    background = rng.normal(120, 25, (size, size, 3)) + rng.uniform(-40, 40, 3)
    if style == "shifted":
        background = _shifted_background(rng, size)
    elif style == "rendition":
        background = np.full((size, size, 3), 235.0) + rng.normal(0, 4, (size, size, 3))
    low, high = (0.1, 0.16) if style == "hard" else (0.18, 0.32)
    radius = size * rng.uniform(low, high)
    centre = rng.uniform(radius + 2, size - radius - 2, 2)
    inside = _mask(size, shape, centre, radius, rng.uniform(0, 2 * math.pi))
    if style == "shifted":
        inside = _squash(inside, rng)
    whole = inside.copy()
    if style == "rendition":
        inside &= ~_eroded(inside, max(2, size // 24))
    elif texture == "striped":
        inside &= _stripes(size)
    fill = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 15, 3), 0, 255)
    if style == "hard":
        fill = 0.55 * fill + 0.45 * background.mean((0, 1))
    pixels = np.where(inside[..., None], fill, background)
    if style == "shifted":
        pixels = _clutter(pixels, rng, size)
    pixels += rng.normal(0, 30 if style == "hard" else 6, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    where = (float(centre[0] / size), float(centre[1] / size))
    return Drawing(image, float(radius / size), where, float(background.mean()), whole)


def draw_objects(rng, size: int, whats: list[tuple[str, str, str]]) -> Image.Image:
    """Several objects (shape, colour, texture) on one photo-style background: the JFT
    stand-in's images, each object one of its labels."""
    pixels = rng.normal(120, 25, (size, size, 3)) + rng.uniform(-40, 40, 3)
    for shape, colour, texture in whats:
        radius = size * rng.uniform(0.12, 0.22)
        centre = rng.uniform(radius + 2, size - radius - 2, 2)
        inside = _mask(size, shape, centre, radius, rng.uniform(0, 2 * math.pi))
        if texture == "striped":
            inside &= _stripes(size)
        fill = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 15, 3), 0, 255)
        pixels = np.where(inside[..., None], fill, pixels)
    pixels += rng.normal(0, 6, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _stripes(size: int) -> np.ndarray:
    period = max(4, size // 12)
    ys, xs = np.mgrid[:size, :size]
    return ((xs + ys) // (period // 2)) % 2 == 0


def _mask(size: int, shape: str, centre, radius: float, angle: float) -> np.ndarray:
    mask = Image.new("L", (size, size), 0)
    _draw_shape(ImageDraw.Draw(mask), shape, centre, radius, angle)
    return np.asarray(mask, dtype=bool)


def _shifted_background(rng, size: int) -> np.ndarray:
    """A checkerboard or a gradient of two tinted greys: a background the photos never have."""
    ys, xs = np.mgrid[:size, :size]
    a, b = rng.uniform(50, 200, (2, 1)) + rng.uniform(-25, 25, (2, 3))
    if rng.random() < 0.5:
        cell = int(rng.integers(6, 16))
        mix = (((xs // cell) + (ys // cell)) % 2)[..., None]
    else:
        mix = (xs / size)[..., None]
    return a * (1 - mix) + b * mix


def _squash(inside: np.ndarray, rng) -> np.ndarray:
    """Another viewpoint: the object foreshortened along one axis."""
    size = inside.shape[0]
    scale = rng.uniform(0.55, 0.8)
    rows = np.clip(((np.arange(size) - size / 2) / scale + size / 2).astype(int), 0, size - 1)
    squashed = inside[rows] if rng.random() < 0.5 else inside[:, rows]
    return squashed


def _eroded(inside: np.ndarray, width: int) -> np.ndarray:
    kept = inside.copy()
    for axis in (0, 1):
        for shift in (-width, width):
            kept &= np.roll(inside, shift, axis=axis)
    return kept


def _clutter(pixels: np.ndarray, rng, size: int) -> np.ndarray:
    """Two or three small grey blobs: clutter that is no class's colour."""
    ys, xs = np.mgrid[:size, :size]
    for _ in range(int(rng.integers(2, 4))):
        cy, cx = rng.uniform(0, size, 2)
        blob = (ys - cy) ** 2 + (xs - cx) ** 2 < (size * rng.uniform(0.04, 0.08)) ** 2
        pixels = np.where(blob[..., None], rng.uniform(60, 200), pixels)
    return pixels


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
        corners = CORNERS[shape]
        points = [
            (
                radius * math.cos(2 * math.pi * k / corners),
                radius * math.sin(2 * math.pi * k / corners),
            )
            for k in range(corners)
        ]
    cos, sin = math.cos(angle), math.sin(angle)
    draw.polygon([(cx + x * cos - y * sin, cy + x * sin + y * cos) for x, y in points], fill=255)


def display_names() -> dict[str, str]:
    """Each class folder's name in words ("red striped circle"): the text zero-shot prompts use."""
    return {name: describe(*name.split("-")) for name in class_names()}


def describe(shape: str, colour: str, texture: str) -> str:
    return f"{colour} {texture} {shape}"


def write_shapes(spec: ShapesSpec, root: Path) -> Path:
    """Write the set under ``root/<spec.key()>`` once; later calls return the finished folder."""

    def fill(tmp: Path):
        counts = {"train": spec.train_per_class, "val": spec.val_per_class}
        for split, count in counts.items():
            for label, name in enumerate(class_names()):
                folder = tmp / split / name
                folder.mkdir(parents=True)
                for index in range(count):
                    render(spec, split, label, index).save(folder / f"{index:05d}.png")

    target = write_once(Path(root) / spec.key(), fill, asdict(spec))
    names = target / "imagenet_classes.json"
    if not names.exists():  # sets written before zero-shot tasks existed lack it
        names.write_text(json.dumps(display_names(), indent=0))
    return target


def write_once(target: Path, fill, spec: dict) -> Path:
    """Fill a temporary folder and rename it to ``target``, so a crash never leaves a
    half-written set; a finished ``target`` is returned as it is."""
    if (target / DONE).exists():
        return target
    sweep_stale(target.parent)  # what a run killed mid-write left
    try:
        with replacing(target) as tmp:
            tmp.mkdir(parents=True)
            fill(tmp)
            (tmp / DONE).write_text(json.dumps(spec))
    except OSError:  # another process finished first (a folder is not replaced): keep theirs
        if not (target / DONE).exists():
            raise
    return target
