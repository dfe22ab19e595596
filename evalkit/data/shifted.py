"""ImageNet's shifted and relabelled test sets (ImageNet-v2, -R, -A, ReaL, ObjectNet) and the label space every
zero-shot evaluation scores in (effect-table row 6; docs/protocols.md, "Zero-shot").

A ``LabelSpace`` states, in the reference class list (ImageNet's), the prompt text of every
class, which classes an image's logits are restricted to, and which classes count as a correct
prediction for each of a test set's own labels:

- ImageNet val and v2: all classes; correct = the image's class.
- ImageNet-R and -A (200 classes each): logits restricted to the classes the set has.
- ImageNet ReaL: all classes; correct = any class of the image's ReaL label set (images
  with an empty set are not scored).
- ObjectNet: logits restricted to the ImageNet classes that map to an ObjectNet class; a
  prediction is correct when it is any ImageNet class mapped to the image's ObjectNet class.
  Images of classes with no ImageNet counterpart are not scored. Images lose a 2-px border.

Layouts, as downloaded (under the data root):

- ``imagenet/val/<wnid>/ILSVRC2012_val_<number>.JPEG`` with ``imagenet/real.json`` (ReaL)
- ``imagenetv2-matched-frequency-format-val/<class index>/<image>``
- ``imagenet-r/<wnid>/<image>`` and ``imagenet-a/<wnid>/<image>``
- ``objectnet-1.0/images/<folder>/<image>`` with the download's own ``objectnet-1.0/mappings/``
  (``folder_to_objectnet_label.json``, ``objectnet_to_imagenet_1k.json``,
  ``imagenet_to_label_2012_v2``, ``pytorch_to_imagenet_2012_id.json``).

The reference class list is CLIP's ImageNet class names keyed by WordNet id (shipped with
evalkit); a dataset root may carry ``imagenet_classes.json`` (``{folder: name}`` in class order)
in its place, as the embedded stand-ins do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import ImageOps

from evalkit.data import DataConfig, DataKind
from evalkit.data.folder import ImageFolder
from evalkit.data.resolve import data_kind, dataset_root, open_dataset
from evalkit.errors import EvalkitError
from evalkit.storage.identity import read_json

REFERENCE_FILE = "imagenet_classes.json"
OBJECTNET_BORDER = 2  # pixels cropped from every side of an ObjectNet image


@dataclass(frozen=True)
class LabelSpace:
    keys: tuple[str, ...]  # every reference class's id (a WordNet id, a folder name)
    names: tuple[str, ...]  # every reference class's name (prompt text)
    correct: tuple[tuple[int, ...], ...]  # per own label: reference classes counted correct
    candidates: tuple[int, ...] | None = None  # reference classes the logits are restricted to

    def over(self, classes: list[str]) -> LabelSpace:
        """The same space indexed by a classifier's own ``classes`` (a probe's training
        classes, by id): reference classes it lacks can never be predicted."""
        position = {key: i for i, key in enumerate(classes)}
        mapped = [position.get(key) for key in self.keys]
        if not any(i is not None for i in mapped):
            raise EvalkitError(
                f"none of the {len(classes)} training classes is a class of this test set "
                f"(e.g. {classes[0]!r} vs {self.keys[0]!r}): train on ImageNet's WordNet-id folders"
            )

        def move(ids):
            return tuple(sorted(mapped[i] for i in ids if mapped[i] is not None))

        candidates = None if self.candidates is None else move(self.candidates)
        return LabelSpace(
            tuple(classes), tuple(classes), tuple(move(c) for c in self.correct), candidates
        )


NAMES_FILE = "class_names.txt"  # a set of one's own: "<folder> <class name>" per line


def reference_classes(root: Path) -> dict[str, str]:
    """``{class id: name}`` in class order: the root's own table (``imagenet_classes.json``,
    or ``class_names.txt``), else ImageNet's."""
    own = Path(root) / REFERENCE_FILE
    if own.exists():
        return read_json(own)
    if (Path(root) / NAMES_FILE).exists():
        return _names_file(Path(root) / NAMES_FILE)
    text = resources.files("evalkit.data").joinpath("meta", REFERENCE_FILE).read_text()
    return json.loads(text)


def _names_file(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    pairs = [line.split(maxsplit=1) for line in lines if line and not line.startswith("#")]
    bad = [" ".join(p) for p in pairs if len(p) != 2]
    if bad or not pairs:
        raise EvalkitError(
            f"{path}: each line needs '<folder> <class name>', not {bad[:1] or 'nothing'}"
        )
    return dict(sorted((folder, name) for folder, name in pairs))


def folder_space(classes: list[str], reference: dict[str, str], *, restrict=False) -> LabelSpace:
    """Class folders named by reference ids (ImageNet's WordNet ids). A set whose folders are
    none of them (a dataset of one's own) is its own reference: folder names as prompt text.
    ``restrict``: logits restricted to the classes the set has (ImageNet-R and -A, whose
    protocol is their 200); otherwise every reference class is a candidate, however few of
    them a partial copy of the set holds (ImageNet val's protocol: all 1000)."""
    index = {key: i for i, key in enumerate(reference)}
    known = [name in index for name in classes]
    if not any(known):
        words = tuple(_words(c) for c in classes)
        return LabelSpace(tuple(classes), words, tuple((i,) for i in range(len(classes))))
    if not all(known):
        unknown = [c for c, k in zip(classes, known, strict=True) if not k]
        raise EvalkitError(
            f"class folders {', '.join(unknown[:5])} are not in the reference class list "
            f"({len(reference)} classes): name folders by their ImageNet WordNet ids"
        )
    own = tuple(index[c] for c in classes)
    subset = tuple(sorted(own)) if restrict and len(set(own)) < len(reference) else None
    return LabelSpace(*_table(reference), tuple((i,) for i in own), subset)


def check_names_file(root: Path, classes: list[str]):
    """A ``class_names.txt`` must name exactly the set's class folders: a key that matches no
    folder (``C0`` for ``c0``) would otherwise leave prompts on folder names without a word."""
    path = Path(root) / NAMES_FILE
    if not path.exists():
        return
    keys, folders = set(_names_file(path)), set(classes)
    if keys != folders:
        stray, unnamed = sorted(keys - folders), sorted(folders - keys)
        raise EvalkitError(
            f"{path} must name every class folder and nothing else: "
            + "; ".join(
                part
                for part in (
                    f"keys with no folder: {', '.join(stray[:5])}" if stray else "",
                    f"folders with no name: {', '.join(unnamed[:5])}" if unnamed else "",
                )
                if part
            )
            + " (folder names are case-sensitive)"
        )


def numbered_space(classes: list[str], reference: dict[str, str]) -> LabelSpace:
    """ImageNet-v2's folders are class indices (``0`` … ``999``)."""
    bad = [c for c in classes if not (c.isdigit() and int(c) < len(reference))]
    if bad:
        raise EvalkitError(
            f"ImageNet-v2 folders must be class indices 0..{len(reference) - 1}, found "
            f"{', '.join(bad[:5])}"
        )
    return LabelSpace(*_table(reference), tuple((int(c),) for c in classes))


def objectnet_space(mappings: Path, classes: list[str], reference: dict[str, str]):
    """ObjectNet's folders → its labels → ImageNet label names → 2012 ids → class indices, all
    read from the download's ``mappings`` folder. Returns the space and, per own label,
    whether it is scored (has an ImageNet counterpart)."""
    folder_label = _mapping(mappings, "folder_to_objectnet_label.json")
    to_names = _mapping(mappings, "objectnet_to_imagenet_1k.json")
    lines = _lines(mappings / "imagenet_to_label_2012_v2")
    index_of_2012 = {
        int(v): int(k) for k, v in _mapping(mappings, "pytorch_to_imagenet_2012_id.json").items()
    }
    class_of_name = {name: index_of_2012[i] for i, name in enumerate(lines) if i in index_of_2012}
    correct = []
    for folder in classes:
        names = to_names.get(folder_label.get(folder, ""), "")
        ids = [class_of_name.get(n) for n in names.split("; ") if n]
        if None in ids:
            raise EvalkitError(
                f"{mappings}: an ImageNet name of {folder!r} is not in imagenet_to_label_2012_v2"
            )
        correct.append(tuple(sorted(ids)))
    mapped = sorted({i for ids in correct for i in ids})
    if not mapped:
        raise EvalkitError(f"no ObjectNet folder under {mappings.parent} maps to an ImageNet class")
    space = LabelSpace(*_table(reference), tuple(correct), tuple(mapped))
    return space, [bool(ids) for ids in correct]


def _table(reference: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(reference), tuple(reference.values())


def _mapping(folder: Path, name: str) -> dict:
    path = folder / name
    if not path.exists():
        raise EvalkitError(
            f"ObjectNet mapping {path} not found (ObjectNet downloads ship mappings/)"
        )
    return read_json(path)


def _lines(path: Path) -> list[str]:
    if not path.exists():
        raise EvalkitError(
            f"ObjectNet mapping {path} not found (ObjectNet downloads ship mappings/)"
        )
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def _words(folder: str) -> str:
    return folder.replace("_", " ")


class BorderCrop:
    """Crop ``pixels`` from every side before the backbone's transform (ObjectNet's frame)."""

    def __init__(self, pixels: int, then):
        self.pixels, self.then = pixels, then

    def __call__(self, image):
        return self.then(ImageOps.crop(image, border=self.pixels))

    def __repr__(self) -> str:
        return f"BorderCrop({self.pixels}, {self.then!r})"


# --- readers ----------------------------------------------------------------------------


def open_scored(name: str, split: str, config: DataConfig, transform):
    """A test split with its ``label_space``: the shifted sets carry theirs; a class-folder
    split (ImageNet val) gets one from its folder names."""
    dataset = open_dataset(name, split, config, transform=transform)
    if getattr(dataset, "label_space", None) is None:
        root = dataset_root(data_kind(name), config)
        check_names_file(root, list(dataset.classes))
        dataset.label_space = folder_space(list(dataset.classes), reference_classes(root))
    return dataset


def _open_v2(root: Path, split: str, *, source: str, transform=None, classes=None):
    dataset = _folder(
        root, "imagenetv2-matched-frequency-format-val/<class index>/<image>", transform
    )
    dataset.label_space = numbered_space(dataset.classes, reference_classes(root))
    return dataset


def _open_subset(layout: str):
    def open_split(root: Path, split: str, *, source: str, transform=None, classes=None):
        dataset = _folder(root, layout, transform)
        reference = reference_classes(root)
        dataset.label_space = folder_space(dataset.classes, reference, restrict=True)
        return dataset

    return open_split


def _open_objectnet(root: Path, split: str, *, source: str, transform=None, classes=None):
    crop = BorderCrop(OBJECTNET_BORDER, transform)
    dataset = _folder(root / "images", "objectnet-1.0/images/<folder>/<image>", crop)
    space, scored = objectnet_space(root / "mappings", dataset.classes, reference_classes(root))
    dataset.samples = [(path, label) for path, label in dataset.samples if scored[label]]
    dataset.labels = [label for _, label in dataset.samples]
    dataset.label_space = space
    return dataset


def _open_real(root: Path, split: str, *, source: str, transform=None, classes=None):
    """ImageNet val with ReaL's label sets: ``real.json`` lists, per validation image in
    file-number order, the classes it shows. Each image is its own label here, its set the
    classes counted correct; images with an empty set are not scored."""
    layout = "imagenet/val/<wnid>/ILSVRC2012_val_<number>.JPEG and imagenet/real.json"
    dataset = _folder(root / split, layout, transform)
    sets = _real_sets(root / "real.json")
    reference = reference_classes(root)
    kept, correct = [], []
    for path, _ in dataset.samples:
        found = re.search(r"ILSVRC2012_val_(\d{8})", path.name)
        if found is None or not 0 < int(found.group(1)) <= len(sets):
            raise EvalkitError(
                f"{path.name}: expected ILSVRC2012_val_<number> within real.json's {len(sets)}"
            )
        labels = sets[int(found.group(1)) - 1]
        if labels:
            kept.append(path)
            correct.append(tuple(sorted(labels)))
    bad = sorted({i for ids in correct for i in ids if not 0 <= i < len(reference)})
    if bad:
        raise EvalkitError(f"real.json names classes {bad[:5]} beyond the {len(reference)} classes")
    dataset.samples = [(path, i) for i, path in enumerate(kept)]
    dataset.labels = list(range(len(kept)))
    dataset.label_space = LabelSpace(*_table(reference), tuple(correct))
    return dataset


def _real_sets(path: Path) -> list[list[int]]:
    if not path.exists():
        raise EvalkitError(f"ReaL labels {path} not found: put real.json beside imagenet/val")
    return read_json(path)


def _folder(root: Path, layout: str, transform) -> ImageFolder:
    return ImageFolder(root, transform, layout_hint=layout)


# --- embedded stand-ins -----------------------------------------------------------------

STAND_IN_PER_CLASS = 16


def _write(kind: str, base: Path) -> Path:
    from evalkit.data.embedded import write_once

    writer = {
        "imagenet-v2": _fill_v2,
        "imagenet-r": _fill_subset,
        "imagenet-a": _fill_subset,
        "objectnet": _fill_objectnet,
        "imagenet-real": _fill_real,
    }[kind]
    spec = {"kind": kind, "seed": 0, "per_class": STAND_IN_PER_CLASS}
    return write_once(
        Path(base) / f"{kind}-s0-n{STAND_IN_PER_CLASS}", lambda tmp: writer(kind, tmp), spec
    )


def _save(folder: Path, kind: str, key: tuple[int, int], what, style: str):
    """One stand-in image, drawn from (kind, class, index) alone; ObjectNet's with a thin
    white frame, as its photographs have."""
    from evalkit.data.embedded import draw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([len(kind), sum(map(ord, kind)), *key])
    image = draw(rng, 96, what, style).image
    if style == "shifted":
        image = ImageOps.expand(image.crop((2, 2, 94, 94)), border=2, fill=(255, 255, 255))
    image.save(folder / f"{key[1]:05d}.png")


def _reference(tmp: Path):
    from evalkit.data.embedded import class_names, display_names

    (tmp / REFERENCE_FILE).write_text(json.dumps(display_names(), indent=0))
    return class_names()


def _fill_v2(kind: str, tmp: Path):
    for label, name in enumerate(_reference(tmp)):
        for index in range(STAND_IN_PER_CLASS):
            _save(tmp / str(label), kind, (label, index), name.split("-"), "photo")


def _fill_subset(kind: str, tmp: Path):
    """-R: renditions of two thirds of the classes; -A: small, hard objects of another two
    thirds (the real sets hold 200 of ImageNet's 1000)."""
    style, skip = ("rendition", 0) if kind == "imagenet-r" else ("hard", 1)
    for label, name in enumerate(_reference(tmp)):
        for index in range(STAND_IN_PER_CLASS if label % 3 != skip else 0):
            _save(tmp / name, kind, (label, index), name.split("-"), style)


def _fill_real(kind: str, tmp: Path):
    """ImageNet val file names and a real.json: every image's set holds its class; one in four
    also holds its sibling (the other texture), as ReaL adds plausible labels; one in sixteen
    is empty (not scored)."""
    names = _reference(tmp)
    sets = []
    for label, name in enumerate(names):
        for index in range(STAND_IN_PER_CLASS):
            sets.append(
                [] if index % 16 == 15 else [label, label ^ 1] if index % 4 == 0 else [label]
            )
            folder = tmp / "val" / name
            _save(folder, kind, (label, index), name.split("-"), "photo")
            (folder / f"{index:05d}.png").rename(folder / f"ILSVRC2012_val_{len(sets):08d}.png")
    (tmp / "real.json").write_text(json.dumps(sets))


def _fill_objectnet(kind: str, tmp: Path):
    """ObjectNet classes are (colour, shape) pairs, each mapped to the two ImageNet stand-in
    classes of that colour and shape (solid, striped); two more classes (pentagons, hexagons)
    have no ImageNet counterpart and are not scored, as ObjectNet's 200 such classes are not."""
    from evalkit.data.embedded import COLOURS, SHAPES, TEXTURES, describe

    names = _reference(tmp)
    folder_label, to_imagenet = {}, {}
    objects = [(s, c) for s in SHAPES for c in COLOURS] + [("pentagon", "red"), ("hexagon", "blue")]
    rng = np.random.default_rng(0)
    for number, (shape, colour) in enumerate(objects):
        folder, label = f"{colour}_{shape}", f"{colour.title()} {shape}"
        folder_label[folder] = label
        if shape in SHAPES:
            to_imagenet[label] = "; ".join(describe(shape, colour, t) for t in TEXTURES)
        for index in range(STAND_IN_PER_CLASS):
            texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
            _save(
                tmp / "images" / folder, kind, (number, index), (shape, colour, texture), "shifted"
            )
    mappings = tmp / "mappings"
    mappings.mkdir()
    # ImageNet's 2012 ids are another order than its class indices: the stand-in reverses them.
    order = list(reversed(range(len(names))))
    lines = [describe(*names[i].split("-")) for i in order]
    (mappings / "imagenet_to_label_2012_v2").write_text("\n".join(lines) + "\n")
    pytorch_to_2012 = {str(i): order.index(i) for i in range(len(names))}
    for file, value in (
        ("folder_to_objectnet_label.json", folder_label),
        ("objectnet_to_imagenet_1k.json", to_imagenet),
        ("pytorch_to_imagenet_2012_id.json", pytorch_to_2012),
    ):
        (mappings / file).write_text(json.dumps(value, indent=0))


def _kind(name: str, dirname: str, layout: str, open_split) -> DataKind:
    return DataKind(
        name=name,
        dirname=dirname,
        layout=layout,
        write_embedded=lambda base: _write(name, base),
        open_split=open_split,
    )


IMAGENET_V2 = _kind(
    "imagenet-v2",
    "imagenetv2-matched-frequency-format-val",
    "imagenetv2-matched-frequency-format-val/<class index>/<image>",
    _open_v2,
)
IMAGENET_R = _kind(
    "imagenet-r",
    "imagenet-r",
    "imagenet-r/<wnid>/<image>",
    _open_subset("imagenet-r/<wnid>/<image>"),
)
IMAGENET_A = _kind(
    "imagenet-a",
    "imagenet-a",
    "imagenet-a/<wnid>/<image>",
    _open_subset("imagenet-a/<wnid>/<image>"),
)
IMAGENET_REAL = _kind(
    "imagenet-real",
    "imagenet",
    "imagenet/{val/<wnid>/ILSVRC2012_val_<number>.JPEG,real.json}",
    _open_real,
)
OBJECTNET = _kind(
    "objectnet",
    "objectnet-1.0",
    "objectnet-1.0/{images/<folder>/<image>,mappings/}",
    _open_objectnet,
)
