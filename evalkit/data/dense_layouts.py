"""Readers for the dense tasks' real on-disk layouts, and the embedded stand-ins written in
those same layouts (docs/protocols.md, "Monocular depth" and "ADE20k"), and the dataset kinds
``ade20k``, ``waymo``, ``kitti`` and ``nyu`` that the resolver in ``evalkit.data`` opens.

ADE20k (SceneParsing release)::

    ADEChallengeData2016/images/{training,validation}/<name>.jpg
    ADEChallengeData2016/annotations/{training,validation}/<name>.png   # uint8, 0 = other/ignore, 1..150

Depth (one flattened layout for Waymo-derived exports, KITTI and NYU-v2)::

    <dataset>/<split>/image/<id>.{jpg,png}
    <dataset>/<split>/depth/<id>.png   # uint16, metres × scale (Waymo, KITTI: 256; NYU: 1000); 0 = no return
    <dataset>/<split>/depth/<id>.npy   # or float32 metres; 0 or NaN = no return
    <dataset>/<split>/mask/<id>.png    # optional validity mask (non-zero = valid LiDAR return)

Images are resized to a square ``size`` for the backbone; targets stay at their own resolution
for evaluation (predictions are upsampled to them).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from evalkit.data import DataKind
from evalkit.data.folder import load_rgb
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity
from evalkit.storage.writes import replacing, sweep_stale

ADE_DIR = "ADEChallengeData2016"
ADE_SPLITS = {"train": "training", "val": "validation"}
ADE_CLASSES = 150
IGNORE = 255
ADE_LAYOUT = (
    f"{ADE_DIR}/images/{{training,validation}}/<name>.jpg and "
    f"{ADE_DIR}/annotations/{{training,validation}}/<name>.png"
)


@dataclass(frozen=True)
class DepthSpec:
    dirname: str
    splits: tuple[str, str]  # folder names of (train, val)
    scale: float  # PNG units per metre
    min_depth: float
    max_depth: float
    crop: str | None  # evaluation crop: garg (KITTI), nyu, or none
    scene: str  # embedded stand-in kind
    embedded_size: tuple[int, int]
    # What a depth value is: "range" (distance from the camera centre: the Waymo tools' and
    # `evalkit prepare waymo`'s default) or "forward" (along the camera's axis: KITTI, NYU).
    convention: str = "forward"

    def layout(self, split: str) -> str:
        return (
            f"{self.dirname}/{split}/image/<id>.{{jpg,png}} + {self.dirname}/{split}/depth/"
            f"<id>.{{png (uint16, metres×{self.scale:g}),npy (float metres)}}"
        )


DEPTH = {
    "waymo": DepthSpec(
        "waymo_depth",
        ("training", "validation"),
        256.0,
        1e-3,
        80.0,
        None,
        "street",
        (160, 240),
        convention="range",
    ),
    "kitti": DepthSpec(
        "kitti_depth", ("train", "val"), 256.0, 1e-3, 80.0, "garg", "street", (128, 416)
    ),
    "nyu": DepthSpec(
        "nyu_depth_v2", ("train", "test"), 1000.0, 1e-3, 10.0, "nyu", "indoor", (192, 256)
    ),
}


def image_tensor(path: Path, size, mean, std) -> torch.Tensor:
    """The image resized to ``size``: a side (squared) or (height, width)."""
    height, width = (size, size) if isinstance(size, int) else size
    image = load_rgb(path).resize((width, height), Image.BICUBIC)
    array = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (array - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def frame_size(images: list[Path], short: int, multiple: int) -> tuple[int, int]:
    """(height, width) with the short side ``short`` and the first image's aspect, the long
    side rounded to a multiple of ``multiple`` (the patch): frames are not squashed."""
    if not images:
        return (short, short)
    with Image.open(images[0]) as image:
        width, height = image.size
    long = max(
        multiple, round(short * max(width, height) / min(width, height) / multiple) * multiple
    )
    return (short, long) if width >= height else (long, short)


class DenseDataset(torch.utils.data.Dataset):
    """Items are (image tensor, index); ``target(index)`` reads the ground truth."""

    independent_reads = True  # an item is its own file, read by a pure function of its index

    def __init__(self, images: list[Path], size, preprocess):
        self.images = images
        self.size = size
        self.mean, self.std = preprocess.mean, preprocess.std

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return image_tensor(self.images[index], self.size, self.mean, self.std), index

    def original(self, index: int) -> np.ndarray:
        return np.asarray(load_rgb(self.images[index]))

    def identity(self) -> str:
        """The images the backbone reads (name, size, content digest) and the size they are
        resized to; targets do not change features."""
        root = self.images[0].parent if self.images else Path()
        return files_identity(
            self.images, root, **identity_options(self), extra=f"size={self.size}"
        )


def scale_crop_flip(dataset, index: int, crop: int, labels: np.ndarray):
    """mmseg's ADE20k training view of image ``index`` and its label map: resized so the
    short side is ``crop`` × U(0.5, 2.0) (aspect kept), padded to the crop (labels with 255,
    ignored), a random ``crop`` × ``crop`` window, a flip with p 0.5, and photometric jitter
    (brightness, contrast, saturation, hue: torchvision's ColorJitter standing in for
    PhotoMetricDistortion). Random draws come from torch's generator, which the trainer seeds
    per item. Returns (normalised image tensor, label map uint8 array)."""
    from torchvision import transforms as T

    image = load_rgb(dataset.images[index])
    scale = crop * (0.5 + 1.5 * torch.rand(()).item()) / min(image.size)
    size = (max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale)))
    image = image.resize(size, Image.BICUBIC)
    label_map = Image.fromarray(labels.astype(np.uint8)).resize(size, Image.NEAREST)
    width, height = max(crop, size[0]), max(crop, size[1])
    canvas, canvas_labels = Image.new("RGB", (width, height)), Image.new("L", (width, height), 255)
    canvas.paste(image)
    canvas_labels.paste(label_map)
    left = int(torch.randint(0, width - crop + 1, ()))
    top = int(torch.randint(0, height - crop + 1, ()))
    box = (left, top, left + crop, top + crop)
    image, label_map = canvas.crop(box), canvas_labels.crop(box)
    if torch.rand(()) < 0.5:
        image, label_map = (x.transpose(Image.FLIP_LEFT_RIGHT) for x in (image, label_map))
    image = T.ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05)(image)
    array = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
    mean, std = (torch.tensor(v)[:, None, None] for v in (dataset.mean, dataset.std))
    return (array - mean) / std, np.asarray(label_map)


def window_starts(length: int, crop: int, stride: int) -> list[int]:
    """Offsets of ``crop``-long windows covering [0, length): every ``stride``, the last one
    flush with the end (mmseg's sliding-window inference)."""
    if length <= crop:
        return [0]
    return sorted({*range(0, length - crop, stride), length - crop})


class SlidingWindows(torch.utils.data.Dataset):
    """Windows of ``dataset``'s images for sliding-window evaluation: each image resized so
    its short side is ``crop`` (aspect kept), then ``crop`` × ``crop`` windows every ``stride``
    pixels. Items are (window tensor, window index); ``of_image(i)`` lists image i's windows
    as (window index, top, left) and ``shapes[i]`` is its resized (height, width)."""

    def __init__(self, dataset: DenseDataset, crop: int, stride: int):
        self.dataset, self.crop, self.stride = dataset, crop, stride
        self.windows, self.shapes, self.by_image = [], [], []
        for index, path in enumerate(dataset.images):
            with Image.open(path) as image:
                width, height = image.size
            scale = crop / min(width, height)
            shape = (max(crop, round(height * scale)), max(crop, round(width * scale)))
            self.shapes.append(shape)
            mine = [
                (top, left)
                for top in window_starts(shape[0], crop, stride)
                for left in window_starts(shape[1], crop, stride)
            ]
            first = len(self.windows)
            self.by_image.append([(first + j, *at) for j, at in enumerate(mine)])
            self.windows += [(index, top, left) for top, left in mine]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, k: int):
        index, top, left = self.windows[k]
        height, width = self.shapes[index]
        image = load_rgb(self.dataset.images[index]).resize((width, height), Image.BICUBIC)
        window = image.crop((left, top, left + self.crop, top + self.crop))
        array = torch.from_numpy(np.asarray(window, dtype=np.float32) / 255.0).permute(2, 0, 1)
        mean, std = (torch.tensor(v)[:, None, None] for v in (self.dataset.mean, self.dataset.std))
        return (array - mean) / std, k

    def of_image(self, index: int) -> list[tuple[int, int, int]]:
        return self.by_image[index]

    def identity(self) -> str:
        return f"{self.dataset.identity()}|windows crop={self.crop} stride={self.stride}"


class ADE20k(DenseDataset):
    def __init__(self, root: Path, split: str, size: int, preprocess):
        folder = ADE_SPLITS[split]
        images_dir, labels_dir = root / "images" / folder, root / "annotations" / folder
        for path in (images_dir, labels_dir):
            if not path.is_dir():
                raise EvalkitError(f"ADE20k folder not found: {path} (expected {ADE_LAYOUT})")
        images = sorted(p for p in images_dir.iterdir() if p.suffix.lower() in (".jpg", ".png"))
        if not images:
            raise EvalkitError(f"no images in {images_dir} (expected {ADE_LAYOUT})")
        super().__init__(images, size, preprocess)
        self.labels_dir = labels_dir

    def target(self, index: int) -> np.ndarray:
        """Labels with reduce_zero_label: 0 → 255 (ignored), 1..150 → 0..149."""
        image = self.images[index]
        path = self.labels_dir / f"{image.stem}.png"
        if not path.is_file():
            raise EvalkitError(
                f"missing annotation {path} for {image.name} (expected {ADE_LAYOUT})"
            )
        with Image.open(path) as png:
            raw = np.asarray(png)
            width, height = png.size
        if raw.ndim != 2:
            raise EvalkitError(
                f"annotation {path} is not a single-channel label PNG (mode {png.mode})"
            )
        with Image.open(image) as picture:
            if picture.size != (width, height):
                raise EvalkitError(
                    f"annotation {path} is {width}×{height} but {image.name} is "
                    f"{picture.size[0]}×{picture.size[1]}: they must match"
                )
        if raw.max() > ADE_CLASSES:
            raise EvalkitError(
                f"annotation {path} has label {int(raw.max())}: ADE20k labels are 0..{ADE_CLASSES}"
            )
        labels = raw.astype(np.int64) - 1
        labels[raw == 0] = IGNORE
        return labels


def prepared_convention(root: Path) -> str | None:
    """The depth convention ``evalkit prepare`` recorded for a data set, if it recorded one."""
    path = root / "provenance.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("depth")
    except (OSError, ValueError, AttributeError):
        raise EvalkitError(
            f"{path} is not the JSON evalkit prepare writes: prepare again"
        ) from None


class DepthFolder(DenseDataset):
    def __init__(self, root: Path, split: str, size, preprocess, spec: DepthSpec):
        folder = spec.splits[0 if split == "train" else 1]
        base = root / folder
        if not (base / "image").is_dir() or not (base / "depth").is_dir():
            raise EvalkitError(
                f"depth dataset not found at {base} (expected {spec.layout(folder)})"
            )
        images = sorted(
            p for p in (base / "image").iterdir() if p.suffix.lower() in (".jpg", ".png")
        )
        if not images:
            raise EvalkitError(f"no images in {base / 'image'} (expected {spec.layout(folder)})")
        super().__init__(images, size, preprocess)
        self.base, self.spec, self.layout = base, spec, spec.layout(folder)
        self.prepared_convention = prepared_convention(root)

    def target(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(depth in metres, valid mask) at the ground truth's resolution."""
        stem = self.images[index].stem
        png, npy = self.base / "depth" / f"{stem}.png", self.base / "depth" / f"{stem}.npy"
        if png.is_file():
            depth = self._read_png(png)
        elif npy.is_file():
            depth = np.load(npy).astype(np.float32)
        else:
            raise EvalkitError(
                f"missing depth for {self.images[index].name} (expected {self.layout})"
            )
        valid = np.isfinite(depth) & (depth > self.spec.min_depth) & (depth < self.spec.max_depth)
        mask_path = self.base / "mask" / f"{stem}.png"
        if mask_path.is_file():
            valid &= np.asarray(Image.open(mask_path)) > 0
        return np.nan_to_num(depth), valid

    def _read_png(self, path: Path) -> np.ndarray:
        with Image.open(path) as png:
            if png.mode not in ("I;16", "I;16B", "I"):
                raise EvalkitError(
                    f"depth PNG {path} has mode {png.mode}: expected 16-bit (I;16), metres × "
                    f"{self.spec.scale:g}"
                )
            raw = np.asarray(png).astype(np.float32)
        return raw / self.spec.scale


# --- embedded stand-ins -----------------------------------------------------------------------


@dataclass(frozen=True)
class SceneSet:
    kind: str  # ade20k | waymo | kitti | nyu
    seed: int = 0
    train: int = 512
    val: int = 64

    def key(self) -> str:
        return f"scenes-{self.kind}-s{self.seed}-t{self.train}-v{self.val}"


def embedded_scene_set(kind: str) -> SceneSet:
    """The default stand-in; ``EVALKIT_EMBEDDED_SCENES=TRAIN,VAL`` shrinks it (tests, demos)."""
    counts = os.environ.get("EVALKIT_EMBEDDED_SCENES")
    if not counts:
        return SceneSet(kind)
    train, val = (int(c) for c in counts.split(","))
    return SceneSet(kind, train=train, val=val)


def write_scene_set(spec: SceneSet, root: Path) -> Path:
    """Write the stand-in once under ``root/<key>`` (atomically); returns the dataset root."""
    target = Path(root) / spec.key()
    name = ADE_DIR if spec.kind == "ade20k" else DEPTH[spec.kind].dirname
    if (target / "done").exists():
        return target / name
    sweep_stale(target.parent)  # what a run killed mid-write left
    try:
        with replacing(target) as tmp:
            _fill_scene_set(spec, tmp, name)
    except OSError:  # another process finished first (a folder is not replaced): keep theirs
        if not (target / "done").exists():
            raise
    return target / name


def _fill_scene_set(spec: SceneSet, tmp: Path, name: str):
    from evalkit.data.scenes import scene

    for split, count in (("train", spec.train), ("val", spec.val)):
        for index in range(count):
            if spec.kind == "ade20k":
                image, labels, _, _ = scene("indoor", spec.seed, split, index, (192, 256))
                _write_ade(tmp / name, split, index, image, labels)
            else:
                depth_spec = DEPTH[spec.kind]
                parts = scene(depth_spec.scene, spec.seed, split, index, depth_spec.embedded_size)
                _write_depth(tmp / name, depth_spec, split, index, parts)
    (tmp / "done").write_text(spec.key())


def _write_ade(root: Path, split: str, index: int, image, labels):
    folder = ADE_SPLITS[split]
    name = f"ADE_{folder[:5] if folder == 'training' else 'val'}_{index:08d}"
    for sub in ("images", "annotations"):
        (root / sub / folder).mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(root / "images" / folder / f"{name}.jpg", quality=95)
    Image.fromarray(labels.astype(np.uint8)).save(root / "annotations" / folder / f"{name}.png")


def _write_depth(root: Path, spec: DepthSpec, split: str, index: int, parts):
    image, _, depth, valid = parts
    base = root / spec.splits[0 if split == "train" else 1]
    for sub in ("image", "depth"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(base / "image" / f"{index:06d}.png")
    encoded = np.where(valid, np.round(depth * spec.scale), 0).clip(0, 65535).astype(np.uint16)
    Image.fromarray(encoded).save(base / "depth" / f"{index:06d}.png")


# --- dataset kinds ----------------------------------------------------------------------------


def _folders_only(name: str, source: str):
    if source == "hf":
        raise EvalkitError(f"{name} is read from its folder layout only: drop --data hf")


def _open_ade20k(root: Path, split: str, *, source: str, size: int, preprocess) -> ADE20k:
    _folders_only("ADE20k", source)
    return ADE20k(root, split, size, preprocess)


def _open_depth(name: str, root: Path, split: str, *, source: str, size, preprocess) -> DepthFolder:
    _folders_only(f"{name} depth", source)
    return DepthFolder(root, split, size, preprocess, DEPTH[name])


def _write_embedded(kind: str, folder: Path) -> Path:
    return write_scene_set(embedded_scene_set(kind), folder)


ADE20K = DataKind(
    name="ade20k",
    dirname=ADE_DIR,
    layout=ADE_LAYOUT,
    write_embedded=functools.partial(_write_embedded, "ade20k"),
    open_split=_open_ade20k,
    targets="dense",
)


def _depth_kind(name: str) -> DataKind:
    spec = DEPTH[name]
    return DataKind(
        name=name,
        dirname=spec.dirname,
        layout=spec.layout(spec.splits[0]),
        write_embedded=functools.partial(_write_embedded, name),
        open_split=functools.partial(_open_depth, name),
        targets="dense",
    )


WAYMO, KITTI, NYU = (_depth_kind(name) for name in ("waymo", "kitti", "nyu"))
