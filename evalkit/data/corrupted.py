"""ImageNet-C: the validation images under 15 corruptions × 5 severities, laid out as
``imagenet-c/<corruption>/<severity>/<class>/<image>`` (effect-table row 11; docs/protocols.md,
"ImageNet-C"). A split is ``<corruption>/<severity>``, e.g. ``fog/3``; its class folders are
matched to the training classes by name.

The embedded stand-in applies evalkit's own corruptions (``evalkit.data.corruptions``) to the
first images of each class of the embedded ImageNet stand-in's val split, written once in the
same layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from evalkit.data import DataKind
from evalkit.data.corruptions import CORRUPTIONS_VERSION, NAMES, SEVERITIES, corrupt
from evalkit.data.folder import ImageFolder, to_rgb
from evalkit.errors import EvalkitError

LAYOUT = "imagenet-c/<corruption>/<severity>/<class>/<image>"
STAND_IN_PER_CLASS = 4


def split_name(corruption: str, severity: int) -> str:
    return f"{corruption}/{severity}"


def _open(root: Path, split: str, *, source: str, transform=None, classes=None) -> ImageFolder:
    corruption, _, severity = split.partition("/")
    folder = root / corruption / severity
    if not folder.is_dir():
        present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise EvalkitError(
            f"no ImageNet-C split {split!r} under {root} (corruptions present: "
            f"{', '.join(present) or 'none'}): expected {LAYOUT}"
        )
    return ImageFolder(folder, transform, layout_hint=LAYOUT, classes=classes)


def _write_embedded(base: Path) -> Path:
    from evalkit.data.embedded import ShapesSpec, write_once, write_shapes

    clean = write_shapes(ShapesSpec(), base) / "val"
    spec = {
        "kind": "imagenet-c",
        "per_class": STAND_IN_PER_CLASS,
        "source": clean.parent.name,
        "corruptions": CORRUPTIONS_VERSION,
    }
    target = (
        Path(base) / f"imagenet-c-{clean.parent.name}-n{STAND_IN_PER_CLASS}-v{CORRUPTIONS_VERSION}"
    )
    return write_once(target, lambda tmp: _fill(clean, tmp), spec)


def _fill(clean: Path, tmp: Path):
    classes = sorted(p.name for p in clean.iterdir() if p.is_dir())
    files = [
        (name, path)
        for name in classes
        for path in sorted((clean / name).iterdir())[:STAND_IN_PER_CLASS]
    ]
    images = np.stack([np.asarray(to_rgb(Image.open(path))) for _, path in files])
    for corruption in NAMES:
        for severity in SEVERITIES:
            out = corrupt(images, corruption, severity, seed=0)
            for (name, path), image in zip(files, out, strict=True):
                folder = tmp / corruption / str(severity) / name
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(folder / path.name)


IMAGENET_C = DataKind(
    name="imagenet-c",
    dirname="imagenet-c",
    layout=LAYOUT,
    write_embedded=_write_embedded,
    open_split=_open,
)
