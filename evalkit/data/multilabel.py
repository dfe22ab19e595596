"""Multi-label images for backbone pretraining (effect-table rows 1–4; docs/protocols.md,
"Pretraining"): the layout evalkit's JFT stand-in is written in, and any multi-label set can
use: ``jft/<split>.jsonl`` with ``{"image": <path relative to jft/>, "labels": [<class>, ...]}``
per line. Classes are the sorted union of the training split's labels. Items are ``(image,
multi-hot target)``; JFT-style pretraining fits them with a sigmoid cross-entropy.

The embedded stand-in: 3,000 images with one to three objects each (shape × colour × texture,
the 24 classes of the shapes set), so an image carries several labels as JFT's do.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from evalkit.data import DataKind
from evalkit.data.folder import read_image
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity

STAND_IN_IMAGES = 3000


class MultiLabelImages(torch.utils.data.Dataset):
    independent_reads = True  # an item is its own file, read by a pure function of its index

    def __init__(self, root: Path, split: str, transform=None, classes=None):
        listing = root / f"{split}.jsonl"
        if not listing.exists():
            raise EvalkitError(
                f'no multi-label split {listing} (expected lines of {{"image": ..., "labels": [...]}})'
            )
        records = [
            json.loads(line)
            for line in listing.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        self.root, self.transform = root, transform
        self.paths = [root / r["image"] for r in records]
        self.classes = (
            list(classes)
            if classes is not None
            else sorted({c for r in records for c in r["labels"]})
        )
        index = {name: i for i, name in enumerate(self.classes)}
        unknown = sorted({c for r in records for c in r["labels"]} - set(index))
        if unknown:
            raise EvalkitError(
                f"{listing} has labels the training split lacks: {', '.join(unknown[:5])}"
            )
        self.targets = [[index[c] for c in r["labels"]] for r in records]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        target = torch.zeros(len(self.classes))
        target[self.targets[i]] = 1.0
        return read_image(self.paths[i], self.transform), target

    def identity(self) -> str:
        """The files, their targets and the transform (how they are read: a decoder, a size)."""
        extra = json.dumps(self.targets) + f"|{self.transform!r}"
        return files_identity(self.paths, self.root, **identity_options(self), extra=extra)


def open_multilabel(root: Path, split: str, *, source: str = "auto", transform=None, classes=None):
    return MultiLabelImages(root, split, transform, classes)


def _write_embedded(base: Path) -> Path:
    from evalkit.data.embedded import (
        COLOURS,
        SHAPES,
        TEXTURES,
        class_names,
        draw_objects,
        write_once,
    )

    def fill(tmp: Path):
        (tmp / "images").mkdir()
        lines = []
        for index in range(STAND_IN_IMAGES):
            rng = np.random.default_rng([13, index])
            count = int(rng.integers(1, 4))
            whats = [
                (SHAPES[rng.integers(4)], list(COLOURS)[rng.integers(3)], TEXTURES[rng.integers(2)])
                for _ in range(count)
            ]
            draw_objects(rng, 64, whats).save(tmp / "images" / f"{index:05d}.png")
            labels = sorted({"-".join(what) for what in whats}, key=class_names().index)
            lines.append(json.dumps({"image": f"images/{index:05d}.png", "labels": labels}))
        (tmp / "train.jsonl").write_text("\n".join(lines) + "\n")

    return write_once(
        Path(base) / f"jft-standin-s13-n{STAND_IN_IMAGES}", fill, {"kind": "jft", "seed": 13}
    )


JFT = DataKind(
    name="jft",
    dirname="jft",
    layout="jft/<split>.jsonl + images",
    write_embedded=_write_embedded,
    open_split=open_multilabel,
    targets="multilabel",
)
