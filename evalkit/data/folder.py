"""Readers for class-folder image datasets (ImageNet layout: ``<split>/<class>/<image>``)
and for Hugging Face ``datasets`` (imagefolder or parquet with ``image`` and ``label`` columns),
and the ``imagenet`` dataset kind that resolves to one or the other."""

from __future__ import annotations

import errno
import functools
import os
import unicodedata
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from evalkit.data import DataKind
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity, spec_key
from evalkit.storage.writes import not_readable

PIXEL_LIMIT_VARIABLE = "EVALKIT_MAX_IMAGE_PIXELS"  # PIL's decompression-bomb guard
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm"}


def pixel_limit():
    """PIL's decompression-bomb guard, raised to ``$EVALKIT_MAX_IMAGE_PIXELS`` when set."""
    limit = os.environ.get(PIXEL_LIMIT_VARIABLE)
    if limit:
        Image.MAX_IMAGE_PIXELS = int(limit)


def load_rgb(path: Path) -> Image.Image:
    pixel_limit()
    try:
        with Image.open(path) as image:
            return to_rgb(image)
    except Image.DecompressionBombError as exc:
        raise EvalkitError(
            f"image {path} has more pixels than allowed ({exc}): set "
            f"{PIXEL_LIMIT_VARIABLE}=<pixels> to read it, or shrink it"
        ) from exc
    except PermissionError as exc:  # another user's file: nothing is wrong with it
        raise EvalkitError(
            f"image {path} is not readable by this user ({not_readable(path)}): ask its "
            "owner to make it readable, or read a copy of the data of your own"
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise EvalkitError(
            f"corrupt or unreadable image {path} ({exc.__class__.__name__}): replace or delete "
            "it; `evalkit check-data` with this run's --task, --set and data options lists "
            "every bad file"
        ) from exc


def read_image(path: Path, transform=None):
    """A reader's item from an image file: the transform's own ``read`` where it has one (an
    evaluation view decodes the file itself, ``evalkit.data.views``), else the transform of
    the PIL image."""
    if transform is None:
        return load_rgb(path)
    reader = getattr(transform, "read", None)
    return reader(path) if reader is not None else transform(load_rgb(path))


WIDE_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})  # 16-bit data, 0–65535


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB. Images of more than 8 bits per channel (16-bit PNG and TIFF open as ``I;16``
    or ``I``) are scaled down to 8 bits — PIL's own conversion clips them, turning almost every
    pixel white; float images (``F``) are taken as 0–1 and scaled likewise."""
    if image.mode in WIDE_MODES or image.mode == "F":
        import numpy as np

        top = 1.0 if image.mode == "F" else 65535.0
        values = np.asarray(image, dtype=np.float64) * (255.0 / top)
        image = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), mode="L")
    return image.convert("RGB")


class ImageFolder(torch.utils.data.Dataset):
    """``root/<class>/<image>``; classes sorted by name, images sorted within a class. With
    ``classes`` (the training split's), labels are those classes' indices, matched by name."""

    independent_reads = True  # an item is its own file, read by a pure function of its index

    def __init__(self, root: str | Path, transform=None, *, layout_hint: str = "", classes=None):
        self.root = Path(root)
        self.transform = transform
        own, samples = _scan(self.root, layout_hint)
        to_reference = class_index(own, classes, where=str(self.root))
        self.classes = list(classes) if classes is not None else own
        self.samples = [(path, to_reference[label]) for path, label in samples]
        self.labels = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        return read_image(path, self.transform), label

    def identity(self) -> str:
        """Every file's relative path, size and content digest (hashed once, then remembered
        by stamp), its label, and the transform: changes when a file is added, removed,
        renamed, rewritten or relabelled, or read another way; a copy elsewhere is the same."""
        extra = ",".join(map(str, self.labels)) + f"|{self.transform!r}"
        return files_identity(
            [p for p, _ in self.samples], self.root, **identity_options(self), extra=extra
        )


def class_index(own: list[str], reference, *, where: str) -> list[int]:
    """For each of a split's own class names, its index among the ``reference`` (training)
    classes; without a reference, its own position. A class the reference lacks is an error:
    its images would be scored against a class the head never saw."""
    if reference is None:
        return list(range(len(own)))
    # Names are compared in Unicode's composed form (NFC): macOS writes "café" decomposed
    # (NFD), Linux keeps what it was given, and both spellings print alike.
    index = {unicodedata.normalize("NFC", name): i for i, name in enumerate(reference)}
    unknown = [name for name in own if unicodedata.normalize("NFC", name) not in index]
    if unknown:
        listed = ", ".join(map(_spelled, unknown[:5])) + (" …" if len(unknown) > 5 else "")
        raise EvalkitError(
            f"{where} has {len(unknown)} classes the training split lacks: {listed} "
            f"(an evaluation split may only hold training classes: rename or remove them)"
        )
    return [index[unicodedata.normalize("NFC", name)] for name in own]


def _spelled(name: str) -> str:
    """A class name as printed, with its code points when it is not plain ASCII (two names
    that print alike can differ)."""
    if name.isascii():
        return name
    return f"{name} ({' '.join(f'U+{ord(c):04X}' for c in name)})"


def _scan(root: Path, hint: str):
    if not root.is_dir():
        raise EvalkitError(
            f"dataset folder not found: {root} (expected {hint or '<class>/<image>'})"
        )
    entries = [p for p in sorted(root.iterdir()) if not p.name.startswith(".")]
    for entry in entries:
        check_link(entry, root)
    class_dirs = [p for p in entries if p.is_dir()]
    if not class_dirs:
        raise EvalkitError(f"no class folders in {root} (expected {hint or '<class>/<image>'})")
    names = [unicodedata.normalize("NFC", d.name) for d in class_dirs]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise EvalkitError(
            f"{root} holds two class folders named {_spelled(twice)} (one composed, one "
            "decomposed Unicode): merge them"
        )
    samples = []
    for label, class_dir in enumerate(class_dirs):
        samples += [(p, label) for p in _class_images(class_dir)]
    return [d.name for d in class_dirs], samples


def _class_images(class_dir: Path) -> list[Path]:
    entries = sorted(class_dir.iterdir())
    for entry in entries:
        check_link(entry, class_dir)
    images = [p for p in entries if p.suffix.lower() in IMAGE_SUFFIXES]
    if images:
        return images
    folders = [p.name for p in entries if p.is_dir()]
    inside = (
        f"; it holds folders ({', '.join(folders[:3])}), and images go directly in <class>/"
        if folders
        else ""
    )
    raise EvalkitError(
        f"class folder {class_dir} has no images ({', '.join(sorted(IMAGE_SUFFIXES))}){inside}"
    )


def check_link(path: Path, parent: Path):
    """A symbolic link that goes round in a loop (to itself, to another link back to it, or to
    a folder above it) is refused in one line naming it."""
    if not path.is_symlink():
        return
    try:
        target = path.resolve(strict=True)
    except FileNotFoundError:
        return  # a dangling link: the reader says the image is unreadable
    except (OSError, RuntimeError) as exc:  # ELOOP, or Python's own loop detection
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise EvalkitError(
            f"{path} is a symbolic link loop ({path.name} → {os.readlink(path)} → …): remove "
            "or fix the link"
        ) from None
    above = parent.resolve()
    if target.is_dir() and (target == above or target in above.parents):
        raise EvalkitError(
            f"{path} links to {target}, a folder that contains it (a loop): remove the link"
        )


class HFImages(torch.utils.data.Dataset):
    """A Hugging Face dataset split with an image column and an integer label column."""

    def __init__(
        self, dataset, transform=None, *, classes=None, image_key="image", label_key="label"
    ):
        missing = {image_key, label_key} - set(dataset.column_names)
        if missing:
            raise EvalkitError(
                f"Hugging Face dataset lacks columns {sorted(missing)} (has {dataset.column_names})"
            )
        self.dataset = dataset
        self.transform = transform
        self.image_key = image_key
        raw = list(dataset[label_key])
        names = getattr(dataset.features[label_key], "names", None)
        own = list(names) if names else [str(v) for v in sorted(set(raw))]
        position = {name: i for i, name in enumerate(own)}
        local = raw if names else [position[str(v)] for v in raw]
        to_reference = class_index(own, classes, where=f"Hugging Face split {dataset.split}")
        self.classes = list(classes) if classes is not None else own
        self.labels = [to_reference[label] for label in local]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        row = self.dataset[index]
        image = to_rgb(row[self.image_key])
        return (self.transform(image) if self.transform else image), self.labels[index]

    def identity(self) -> str:
        labels = spec_key([self.labels, repr(self.transform)], length=16)
        return f"hf:{self.dataset._fingerprint}:{labels}"


def open_hf_split(root: Path, split: str, transform=None, classes=None) -> HFImages:
    """``root/<split>/*.parquet`` (or ``root/data/<split>-*.parquet``) or an imagefolder tree."""
    try:
        import datasets
    except ImportError as exc:
        raise EvalkitError(
            "Hugging Face sources need `datasets`: pip install 'evalkit[hf]'"
        ) from exc
    parquet = sorted((root / split).glob("*.parquet")) or sorted(
        root.glob(f"data/{split}-*.parquet")
    )
    if parquet:
        ds = datasets.load_dataset(
            "parquet", data_files={split: [str(p) for p in parquet]}, split=split
        )
    elif (root / split).is_dir():
        ds = datasets.load_dataset("imagefolder", data_dir=str(root / split), split="train")
    else:
        raise EvalkitError(
            f"no Hugging Face split {split!r} under {root} "
            f"(expected {root}/{split}/*.parquet or {root}/{split}/<class>/<image>)"
        )
    return HFImages(ds, transform, classes=classes)


def open_classification_split(root: Path, split: str, *, source: str, transform=None, classes=None):
    """Parquet files when asked for (``--data hf``) or found (``auto``), else class folders;
    ``classes`` (the training split's names) fixes the label of each class by name."""
    if source == "hf" or (source == "auto" and _has_parquet(root, split)):
        return open_hf_split(root, split, transform, classes=classes)
    hint = f"{root}/{{train,val}}/<class>/<image>"
    return ImageFolder(root / split, transform, layout_hint=hint, classes=classes)


def _has_parquet(root: Path, split: str) -> bool:
    return any((root / split).glob("*.parquet")) or any(root.glob(f"data/{split}-*.parquet"))


def _write_embedded_shapes(folder: Path) -> Path:
    from evalkit.data.embedded import ShapesSpec, write_shapes

    return write_shapes(ShapesSpec(), folder)


IMAGENET = DataKind(
    name="imagenet",
    dirname="imagenet",
    layout="imagenet/{train,val}/<class>/<image>",
    write_embedded=_write_embedded_shapes,
    open_split=open_classification_split,
)


def own_folder_kind(path: Path) -> DataKind:
    """``folder:PATH``: class folders (or parquet) under PATH/<split>, named in rows by
    PATH. Class names for prompts come from PATH/class_names.txt when it is there
    (``evalkit.data.shifted.reference_classes``), else from the folder names."""
    if not path.is_dir():
        raise EvalkitError(
            f"dataset folder:{path} not found: expected {path}/<split>/<class>/<image>"
        )

    def no_stand_in(_folder: Path) -> Path:
        raise EvalkitError(f"folder:{path} is a set of your own: it has no embedded stand-in")

    return DataKind(
        name=f"folder:{path}",
        dirname=str(path.resolve()),
        layout="<split>/<class>/<image>",
        write_embedded=no_stand_in,
        open_split=open_classification_split,
    )


@functools.cache  # one resolution per run: a branch that moves mid-run does not split it
def hub_dataset_kind(spec: str) -> DataKind:
    """``hf:ORG/NAME[@REVISION]``: a hub dataset repository at a revision (branch, tag or
    commit; default main), its files taken from the hub cache (fetched first where the hub is
    reachable and ``HF_HUB_OFFLINE`` is unset) and read as a set of one's own (parquet or class
    folders per split). The kind is named by the commit the revision resolved to, so rows and
    cache entries of two revisions never mix."""
    from huggingface_hub import snapshot_download

    from evalkit.data.hub import hub_cache, hub_reachable, offline

    repo, _, revision = spec.partition("@")
    try:
        folder = Path(
            snapshot_download(
                repo,
                repo_type="dataset",
                revision=revision or None,
                cache_dir=hub_cache(),
                local_files_only=offline() or not hub_reachable(),
            )
        )
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types for one cause
        at = f" at revision {revision}" if revision else ""
        raise EvalkitError(
            f"hf:{spec}: hub dataset {repo}{at} is not in the cache {hub_cache()} "
            f"({type(exc).__name__}); where there is a network run `hf download {repo} "
            f"--repo-type dataset{' --revision ' + revision if revision else ''}`"
        ) from None
    kind = own_folder_kind(folder)
    return DataKind(
        name=f"hf:{repo}@{folder.name}",
        dirname=kind.dirname,
        layout=kind.layout,
        write_embedded=kind.write_embedded,
        open_split=kind.open_split,
    )
