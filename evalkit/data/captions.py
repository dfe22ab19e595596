"""Image–text pairs for LiT (effect-table row 6; docs/protocols.md, "LiT"): caption files,
WebDataset tar shards and Hugging Face parquet, behind one reader.

Layouts under ``<data root>/captions/`` (one of, per split):

- ``<split>.csv`` or ``<split>.jsonl`` with fields ``image`` (a path relative to the folder)
  and ``caption`` (JSONL may give a list); several rows may name the same image.
- ``<split>/*.tar``: WebDataset shards as img2dataset writes them (``<key>.jpg|png|webp`` with
  ``<key>.txt``).
- ``<split>/*.parquet``: an ``image`` column and a ``caption`` (or ``text``) column.

Items are ``(image, index)``: the feature cache keys an image's features by its index, and
``captions[index]`` are its captions. A path that leaves the folder is an error; a missing
image or an empty caption is skipped and counted (``skipped``); an image that cannot be
decoded yields label -1 and is dropped and counted where its features are used.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from evalkit.data import DataKind
from evalkit.data.folder import IMAGE_SUFFIXES, read_image, to_rgb
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity, spec_key

UNREADABLE = -1  # the label of an image that could not be decoded


@dataclass
class Scan:
    """What a listing holds: per image its source — a path, ("tar", shard, offset, size) or
    ("parquet", split, row) — and captions; what was skipped, and the files read."""

    sources: list
    captions: list[list[str]]
    skipped: dict[str, int]
    files: list[Path]
    rows: Any = None  # parquet: the rows already opened by the scan


class ImageText(torch.utils.data.Dataset):
    """Images with their captions (``captions[index]``)."""

    def __init__(self, root: Path, scan: Scan, transform):
        self.root, self.scan, self.transform = root, scan, transform
        self.sources, self.captions, self.skipped = scan.sources, scan.captions, scan.skipped
        self.labels = list(range(len(scan.sources)))
        self._rows = scan.rows  # parquet rows (None for files and shards)

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def images(self) -> list[Path]:
        """The image files (shards and parquet rows are not files of their own)."""
        return [s for s in self.sources if isinstance(s, Path)]

    def __getitem__(self, index: int):
        try:
            return self._image(self.sources[index]), index
        except (EvalkitError, OSError, ValueError):
            return self.transform(Image.new("RGB", (64, 64))), UNREADABLE

    def _image(self, source):
        if isinstance(source, Path):
            return read_image(source, self.transform)
        if source[0] == "tar":
            with open(source[1], "rb") as f:
                f.seek(source[2])
                data = f.read(source[3])
            with Image.open(io.BytesIO(data)) as image:
                return self.transform(to_rgb(image))
        return self.transform(to_rgb(self._rows[source[2]]["image"]))

    def identity(self) -> str:
        extra = spec_key([self.captions, repr(self.transform)], length=16)
        return files_identity(self.scan.files, self.root, **identity_options(self), extra=extra)


def open_captions(root: Path, split: str, *, source: str = "auto", transform=None, classes=None):
    """One split of an image–text set in whichever layout it has (see the module docstring)."""
    for suffix, scan in ((".csv", _scan_csv), (".jsonl", _scan_jsonl)):
        if (root / f"{split}{suffix}").exists():
            return ImageText(root, scan(root, root / f"{split}{suffix}"), transform)
    if sorted((root / split).glob("*.tar")):
        return ImageText(root, _scan_tars(sorted((root / split).glob("*.tar"))), transform)
    if sorted((root / split).glob("*.parquet")):
        return ImageText(root, _scan_parquet(root, split), transform)
    raise EvalkitError(
        f"no image–text split {split!r} under {root}: expected {split}.csv or {split}.jsonl "
        f"(image,caption), {split}/*.tar (WebDataset) or {split}/*.parquet (image, caption)"
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EvalkitError(
            f"{path} is not UTF-8 text (byte {exc.start}): re-encode it as UTF-8"
        ) from exc


def _scan_csv(root: Path, path: Path):
    reader = csv.DictReader(io.StringIO(_read_text(path)))
    if not {"image", "caption"} <= set(reader.fieldnames or ()):
        raise EvalkitError(f"{path} needs the columns image,caption (has {reader.fieldnames})")
    return _group(root, path, ((row["image"], row["caption"]) for row in reader))


def _scan_jsonl(root: Path, path: Path):
    def pairs():
        for number, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                captions = record["caption"]
                image = record["image"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise EvalkitError(
                    f'{path}:{number}: expected {{"image": ..., "caption": ...}}'
                ) from exc
            for caption in captions if isinstance(captions, list) else [captions]:
                yield image, caption

    return _group(root, path, pairs())


def _group(root: Path, listing: Path, pairs):
    """Captions grouped by image, in first-seen order; bad pairs counted, traversal refused."""
    by_image: dict[Path, list[str]] = {}
    skipped: Counter = Counter()
    base = root.resolve()
    for name, caption in pairs:
        path = _inside(base, name, listing)
        text = (caption or "").strip()
        if not text:
            skipped["empty caption"] += 1
            continue
        by_image.setdefault(path, []).append(text)
    images = []
    for path in by_image:
        if path.is_file():
            images.append(path)
        else:
            skipped["missing image"] += 1
    if not images:
        raise EvalkitError(f"{listing}: no readable image–caption pairs ({dict(skipped)})")
    return Scan(images, [by_image[p] for p in images], dict(skipped), [listing, *images])


def _inside(base: Path, name: str, listing: Path) -> Path:
    relative = Path(name)
    path = (base / relative).resolve()
    if relative.is_absolute() or not path.is_relative_to(base):
        raise EvalkitError(
            f"{listing}: image path {name!r} leaves the dataset folder {base}: give paths "
            "relative to it"
        )
    return path


def _scan_tars(tars: list[Path]):
    """WebDataset shards: members grouped by key (name without extension); an image member
    and a ``.txt`` member make a pair. Offsets are kept so an image is read with one seek.
    Link members are skipped and counted (their bytes live elsewhere, or nowhere)."""
    sources, captions, skipped = [], [], Counter()
    for tar_path in tars:
        images, texts = {}, {}
        try:
            with tarfile.open(tar_path) as tar:
                for member in tar:
                    if not member.isfile():  # links and folders hold no bytes to read
                        skipped["link or folder member"] += 0 if member.isdir() else 1
                        continue
                    key, _, ext = member.name.rpartition(".")
                    if f".{ext.lower()}" in IMAGE_SUFFIXES:
                        images[key] = ("tar", tar_path, member.offset_data, member.size)
                    elif ext == "txt":
                        texts[key] = tar.extractfile(member).read()
        except tarfile.TarError as exc:
            raise EvalkitError(f"{tar_path} is not a readable tar shard ({exc})") from exc
        for key, where in images.items():
            text = _decode(texts.get(key, b""), tar_path, key)
            if not text:
                skipped["empty caption"] += 1
                continue
            sources.append(where)
            captions.append([text])
        skipped["missing image"] += len(set(texts) - set(images))
    if not sources:
        raise EvalkitError(f"no image–caption pairs in {len(tars)} tar shards ({dict(skipped)})")
    return Scan(sources, captions, dict(skipped), list(tars))


def _decode(data: bytes, tar_path: Path, key: str) -> str:
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise EvalkitError(f"{tar_path}: caption {key}.txt is not UTF-8 text") from exc


def _load_parquet(root: Path, split: str):
    try:
        import datasets
    except ImportError as exc:
        raise EvalkitError("parquet captions need `datasets`: pip install 'evalkit[hf]'") from exc
    files = [str(p) for p in sorted((root / split).glob("*.parquet"))]
    return datasets.load_dataset("parquet", data_files={split: files}, split=split)


def _scan_parquet(root: Path, split: str):
    rows = _load_parquet(root, split)
    column = next((c for c in ("caption", "text") if c in rows.column_names), None)
    if "image" not in rows.column_names or column is None:
        raise EvalkitError(
            f"parquet captions under {root / split} need columns image and caption (or text); "
            f"has {rows.column_names}"
        )
    sources, captions, skipped = [], [], Counter()
    for index, text in enumerate(rows[column]):
        if not (text or "").strip():
            skipped["empty caption"] += 1
            continue
        sources.append(("parquet", split, index))
        captions.append([text.strip()])
    return Scan(sources, captions, dict(skipped), sorted((root / split).glob("*.parquet")), rows)


# --- the embedded stand-in --------------------------------------------------------------

CAPTIONED_IMAGES = 2400
PHRASINGS = (
    "a {size} {colour} {texture} {shape} on a {background} background",
    "a photo of a {texture} {shape} in {colour}",
    "{colour} {shape}, {texture}, {position}",
    "there is a {size} {colour} {shape} {position}",
    "a {texture} {colour} {shape}",
    "an image showing a {colour} {texture} {shape} over a {background} backdrop",
)


def caption(drawing, what: tuple[str, str, str], rng) -> list[str]:
    """Three captions in different phrasings naming what is drawn and where."""
    shape, colour, texture = what
    size = "small" if drawing.radius < 0.22 else "large" if drawing.radius > 0.28 else "medium"
    x, y = drawing.centre
    horizontal = "on the left" if x < 0.4 else "on the right" if x > 0.6 else "in the middle"
    vertical = "at the top" if y < 0.4 else "at the bottom" if y > 0.6 else ""
    words = {
        "shape": shape,
        "colour": colour,
        "texture": texture,
        "size": size,
        "position": f"{horizontal} {vertical}".strip(),
        "background": "dark" if drawing.brightness < 110 else "light",
    }
    picked = rng.choice(len(PHRASINGS), size=3, replace=False)
    return [PHRASINGS[i].format(**words) for i in picked]


def _write_embedded(base: Path) -> Path:
    from evalkit.data.embedded import COLOURS, SHAPES, TEXTURES, draw, write_once

    def fill(tmp: Path):
        (tmp / "images").mkdir()
        rows = []
        for index in range(CAPTIONED_IMAGES):
            rng = np.random.default_rng([7, index])
            what = (
                SHAPES[rng.integers(4)],
                list(COLOURS)[rng.integers(3)],
                TEXTURES[rng.integers(2)],
            )
            drawing = draw(rng, 96, what)
            name = f"images/{index:05d}.png"
            drawing.image.save(tmp / name)
            rows += [(name, text) for text in caption(drawing, what, rng)]
        with open(tmp / "train.csv", "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([("image", "caption"), *rows])

    spec = {"kind": "captions", "images": CAPTIONED_IMAGES, "seed": 7}
    return write_once(Path(base) / f"captions-s7-n{CAPTIONED_IMAGES}", fill, spec)


CAPTIONS = DataKind(
    name="captions",
    dirname="captions",
    layout="captions/{train.csv|train.jsonl|train/*.tar|train/*.parquet}",
    write_embedded=_write_embedded,
    open_split=open_captions,
    targets="captions",
)
