"""CelebA as its release ships it, for the fairness evaluation (docs/protocols.md, "Fairness";
docs/data.md, "CelebA").

Layout under the data root::

    celeba/list_attr_celeba.txt       # line 1: image count; line 2: the 40 attribute names;
                                      # then "<image> v1 … v40", each value 1 or -1
    celeba/list_eval_partition.txt    # "<image> 0|1|2": train, valid, test
    celeba/img_align_celeba/<image>   # the aligned and cropped JPEGs

A split (``train``, ``valid``, ``test``) yields ``(image, index)``; ``targets`` and ``groups``
are the chosen attributes as 0/1 (``Smiling`` or ``Attractive`` the target, ``Male`` the
subgroup by default). A malformed list file is refused in one line naming the file and line.

The embedded stand-in draws small faces in the same layout with a planted correlation: the
target attribute is present in 70 % of one subgroup and 30 % of the other, and the subgroup is
easier to see than the target, so an unconstrained classifier leans on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from evalkit.data import DataKind
from evalkit.data.folder import read_image
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity

ATTRIBUTES_FILE, PARTITION_FILE, IMAGES = (
    "list_attr_celeba.txt",
    "list_eval_partition.txt",
    "img_align_celeba",
)
PARTITIONS = {"train": 0, "valid": 1, "test": 2}
ATTRIBUTE_NAMES = [
    "5_o_Clock_Shadow",
    "Arched_Eyebrows",
    "Attractive",
    "Bags_Under_Eyes",
    "Bald",
    "Bangs",
    "Big_Lips",
    "Big_Nose",
    "Black_Hair",
    "Blond_Hair",
    "Blurry",
    "Brown_Hair",
    "Bushy_Eyebrows",
    "Chubby",
    "Double_Chin",
    "Eyeglasses",
    "Goatee",
    "Gray_Hair",
    "Heavy_Makeup",
    "High_Cheekbones",
    "Male",
    "Mouth_Slightly_Open",
    "Mustache",
    "Narrow_Eyes",
    "No_Beard",
    "Oval_Face",
    "Pale_Skin",
    "Pointy_Nose",
    "Receding_Hairline",
    "Rosy_Cheeks",
    "Sideburns",
    "Smiling",
    "Straight_Hair",
    "Wavy_Hair",
    "Wearing_Earrings",
    "Wearing_Hat",
    "Wearing_Lipstick",
    "Wearing_Necklace",
    "Wearing_Necktie",
    "Young",
]


def read_attributes(path: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """``list_attr_celeba.txt``: the attribute names and each image's ±1 values."""
    lines = _lines(path)
    if len(lines) < 2 or not lines[0].strip().isdigit():
        raise EvalkitError(
            f"{path}: expected the image count on line 1 and the attribute names on line 2"
        )
    names, rows = lines[1].split(), {}
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != len(names) + 1 or any(v not in ("1", "-1") for v in parts[1:]):
            raise EvalkitError(
                f"{path}:{number}: expected '<image>' and {len(names)} values of 1 or -1, "
                f"got {len(parts)} fields"
            )
        rows[parts[0]] = np.array([int(v) for v in parts[1:]], dtype=np.int8)
    if len(rows) != int(lines[0]):
        raise EvalkitError(
            f"{path}: line 1 says {int(lines[0])} images but {len(rows)} are listed: "
            "the file is truncated or was edited"
        )
    return names, rows


def read_partition(path: Path) -> dict[str, int]:
    """``list_eval_partition.txt``: each image's partition (0 train, 1 valid, 2 test)."""
    out = {}
    for number, line in enumerate(_lines(path), start=1):
        parts = line.split()
        if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
            raise EvalkitError(f"{path}:{number}: expected '<image> 0|1|2', got {line.strip()!r}")
        out[parts[0]] = int(parts[1])
    return out


def read_release(root: Path) -> tuple[list[str], dict[str, np.ndarray], dict[str, int]]:
    """Both list files of a release — attribute names, each image's values, each image's
    partition — parsed whole and checked against each other. Parsed once per version of the
    files: a run's three splits (and ``prepare``) share it."""
    root = Path(root)
    return _parsed(root, _stamp(root / ATTRIBUTES_FILE), _stamp(root / PARTITION_FILE))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None  # reading it says what is missing
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=2)
def _parsed(root: Path, *stamps):
    names, values = read_attributes(root / ATTRIBUTES_FILE)
    partition = read_partition(root / PARTITION_FILE)
    missing = sorted(set(values) - set(partition))
    if missing:
        raise EvalkitError(
            f"{root / PARTITION_FILE} lists no partition for {missing[0]} "
            f"({len(missing)} images): use the two list files of one release"
        )
    return names, values, partition


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise EvalkitError(
            f"missing {path}: CelebA's release has {ATTRIBUTES_FILE}, {PARTITION_FILE} and "
            f"{IMAGES}/ side by side under celeba/"
        )
    return [line for line in path.read_text().splitlines() if line.strip()]


class FaceAttributes(torch.utils.data.Dataset):
    """One CelebA partition: images with a target and a subgroup attribute (0/1)."""

    independent_reads = True  # an item is its own file, read by a pure function of its index

    def __init__(self, root: Path, split: str, transform=None, *, target="Smiling", group="Male"):
        if split not in PARTITIONS:
            raise EvalkitError(f"CelebA has no split {split!r}: choose {', '.join(PARTITIONS)}")
        self.root, self.transform = Path(root), transform
        names, values, partition = read_release(self.root)
        for attribute in (target, group):
            if attribute not in names:
                raise EvalkitError(
                    f"CelebA has no attribute {attribute!r}: choose from {', '.join(names)}"
                )
        self.images = sorted(i for i, p in partition.items() if p == PARTITIONS[split])
        self.images = [i for i in self.images if i in values]
        column = {a: names.index(a) for a in (target, group)}
        self.targets = np.array([values[i][column[target]] == 1 for i in self.images], np.int64)
        self.groups = np.array([values[i][column[group]] == 1 for i in self.images], np.int64)
        self.attributes = (target, group)
        self.samples = [(self.root / IMAGES / i, i) for i in self.images]  # for check-data

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        path = self.samples[index][0]
        if not path.is_file():
            raise EvalkitError(f"missing image {path}: CelebA's aligned images are in {IMAGES}/")
        return read_image(path, self.transform), index

    def identity(self) -> str:
        paths = [path for path, _ in self.samples]
        lists = [self.root / ATTRIBUTES_FILE, self.root / PARTITION_FILE]
        extra = f"{self.transform!r}"  # not the attributes: items are (image, index) either way
        return files_identity(lists + paths, self.root, **identity_options(self), extra=extra)


def open_split(root: Path, split: str, *, source: str, transform=None, **options):
    if source == "hf":
        raise EvalkitError("CelebA is read from its release files: use --data folder")
    return FaceAttributes(
        root,
        split,
        transform,
        target=options.get("target", "Smiling"),
        group=options.get("group", "Male"),
    )


# --- the embedded stand-in -----------------------------------------------------------------


@dataclass(frozen=True)
class FacesSpec:
    seed: int = 5
    counts: tuple[int, int, int] = (320, 120, 160)  # train, valid, test
    size: tuple[int, int] = (72, 88)  # width, height (CelebA's aligned images are 178 × 218)
    planted: float = 0.7  # P(target | one subgroup); 1 - planted in the other

    def key(self) -> str:
        return f"celeba-s{self.seed}-n{sum(self.counts)}-p{self.planted}"


def draw_face(rng, spec: FacesSpec, male: bool, smiling: bool, attractive: bool) -> Image.Image:
    """A face: hair short and dark (male) or long and light, a mouth curved up (smiling) or
    straight, and rosy cheeks when attractive; skin, position and noise vary."""
    width, height = spec.size
    skin = np.clip(np.array([224, 180, 150]) + rng.normal(0, 18, 3), 0, 255)
    image = Image.new("RGB", spec.size, tuple(int(v) for v in rng.uniform(60, 200, 3)))
    pen = ImageDraw.Draw(image)
    cx, cy = width / 2 + rng.normal(0, 2), height / 2 + rng.normal(0, 2)
    face = (cx - 22, cy - 28, cx + 22, cy + 28)
    hair = (40, 30, 25) if male else (200, 160, 90)
    if not male:
        pen.rectangle((cx - 27, cy - 30, cx + 27, cy + 34), fill=hair)
    pen.ellipse(face, fill=tuple(int(v) for v in skin))
    pen.chord((cx - 23, cy - 32, cx + 23, cy - 4), 180, 360, fill=hair)
    for side in (-1, 1):
        pen.ellipse((cx + side * 10 - 3, cy - 6, cx + side * 10 + 3, cy), fill=(30, 30, 40))
        if attractive:
            pen.ellipse(
                (cx + side * 13 - 4, cy + 5, cx + side * 13 + 4, cy + 11), fill=(235, 120, 120)
            )
    if smiling:
        pen.arc((cx - 9, cy + 6, cx + 9, cy + 18), 20, 160, fill=(120, 30, 30), width=2)
    else:
        pen.line((cx - 8, cy + 14, cx + 8, cy + 14), fill=(120, 30, 30), width=2)
    pixels = np.asarray(image, np.float64) + rng.normal(0, 10, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def write_faces(base: Path, spec: FacesSpec = FacesSpec()) -> Path:
    """The stand-in under ``base/<spec.key()>``, written once."""
    from dataclasses import asdict

    from evalkit.data.embedded import write_once

    def fill(tmp: Path):
        (tmp / IMAGES).mkdir()
        rng = np.random.default_rng(spec.seed)
        rows, partitions, number = [], [], 0
        for partition, count in enumerate(spec.counts):
            for _ in range(count):
                number += 1
                name = f"{number:06d}.jpg"
                male = bool(rng.random() < 0.5)
                smiling = bool(rng.random() < (spec.planted if male else 1 - spec.planted))
                attractive = bool(rng.random() < (1 - spec.planted if male else spec.planted))
                draw_face(rng, spec, male, smiling, attractive).save(
                    tmp / IMAGES / name, quality=95
                )
                values = {"Male": male, "Smiling": smiling, "Attractive": attractive}
                row = [("1" if values.get(a, False) else "-1").rjust(2) for a in ATTRIBUTE_NAMES]
                rows.append(f"{name} {' '.join(row)}")
                partitions.append(f"{name} {partition}")
        header = [str(len(rows)), " ".join(ATTRIBUTE_NAMES)]
        (tmp / ATTRIBUTES_FILE).write_text("\n".join(header + rows) + "\n")
        (tmp / PARTITION_FILE).write_text("\n".join(partitions) + "\n")

    return write_once(Path(base) / spec.key(), fill, asdict(spec))


CELEBA = DataKind(
    name="celeba",
    dirname="celeba",
    layout="celeba/{list_attr_celeba.txt,list_eval_partition.txt,img_align_celeba/}",
    write_embedded=write_faces,
    open_split=open_split,
    targets="attributes",
)
