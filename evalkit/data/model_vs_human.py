"""The model-vs-human benchmark's stimuli and human trials, read as the benchmark ships them
(docs/protocols.md, "Shape bias and human alignment"; docs/data.md, "model-vs-human").

Layout under the data root (the benchmark's own ``datasets/`` and ``raw-data/`` folders)::

    model-vs-human/datasets/cue-conflict/<shape category>/<shape><i>-<texture><j>.png
    model-vs-human/datasets/{edge,silhouette}/<category>/<image>.png
    model-vs-human/datasets/<set>/dnn/session-<k>/<nnnn>_<x>_<y>_<condition>_<category>_….png
        # the twelve parametric sets, sketch and stylized
    model-vs-human/raw-data/<set>/<set>_subject-<nn>_session_<k>.csv
        # subj, session, trial, rt, object_response, category, condition, imagename

A set (``cue-conflict``, ``contrast``, …) is a split: items are ``(image, category index)``
over the 16 entry-level categories, with each image's condition and the id the human trials
name it by (the benchmark's short image name). A root may carry ``categories.json``
(``{category: [class folder, …]}``) to name its own categories and the classifier classes
that map to them, as the embedded stand-in does; otherwise categories map to ImageNet classes
by the benchmark's table (``meta/model_vs_human_categories.json``, WordNet ids).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from evalkit.data import DataKind
from evalkit.data.folder import IMAGE_SUFFIXES, ImageFolder
from evalkit.errors import EvalkitError
from evalkit.storage.identity import read_json

PARAMETRIC = (
    "colour",
    "contrast",
    "high-pass",
    "low-pass",
    "phase-scrambling",
    "power-equalisation",
    "false-colour",
    "rotation",
    "eidolonI",
    "eidolonII",
    "eidolonIII",
    "uniform-noise",
)
FOLDER_SETS = ("cue-conflict", "edge", "silhouette")  # <category>/<image>
SETS = ("edge", "silhouette", "cue-conflict", *PARAMETRIC, "sketch", "stylized")
CATEGORIES_FILE = "categories.json"
TRIAL_COLUMNS = ("subj", "object_response", "category", "condition", "imagename")


def benchmark_categories() -> dict[str, list[str]]:
    """The benchmark's 16 categories, each with the ImageNet classes (WordNet ids) mapped to it."""
    text = resources.files("evalkit.data").joinpath("meta", "model_vs_human_categories.json")
    return json.loads(text.read_text())


def imagenet_wnids() -> list[str]:
    """ImageNet-1k's WordNet ids in class-index order: the classes of a 1000-way head."""
    text = resources.files("evalkit.data").joinpath("meta", "imagenet_classes.json")
    return list(json.loads(text.read_text()))


def categories_of(root: Path) -> dict[str, list[str]]:
    """The root's own categories (``categories.json``), else the benchmark's."""
    own = Path(root) / CATEGORIES_FILE
    return read_json(own) if own.exists() else benchmark_categories()


def short_name(imagename: str) -> str:
    """The image's own name without a trial's prefix, as the benchmark pairs trials: the last
    underscore-separated part, or the last two when they are an ImageNet id (``n0…_<k>``)."""
    parts = imagename.split("_")
    if len(parts) == 1:
        return parts[0]
    return f"{parts[-2]}_{parts[-1]}" if parts[-2].startswith("n0") else parts[-1]


def texture_of(imagename: str) -> str:
    """A cue-conflict image's texture category: ``…_dog10-bird2.png`` → ``bird``."""
    stem = imagename.split("_")[-1].split(".")[0]
    return "".join(ch for ch in stem.split("-")[-1] if not ch.isdigit())


class Stimuli(ImageFolder):
    """One set's images with their category, condition and short name; read, counted and
    identified as class folders are (``ImageFolder``), its labels the categories' indices."""

    def __init__(self, root: Path, name: str, transform=None):
        if name not in SETS:
            raise EvalkitError(f"model-vs-human has no set {name!r}: choose from {', '.join(SETS)}")
        self.root, self.name, self.transform = Path(root), name, transform
        self.classes = sorted(categories_of(self.root))
        self.samples, self.conditions, self.image_ids = [], [], []
        for path, condition, category in self._scan():
            if category not in self.classes:
                raise EvalkitError(
                    f"{path}: category {category!r} is not one of the benchmark's "
                    f"{len(self.classes)} ({', '.join(self.classes)})"
                )
            self.samples.append((path, self.classes.index(category)))
            self.conditions.append(condition)
            self.image_ids.append(short_name(path.name))
        self.labels = [label for _, label in self.samples]

    def _scan(self):
        folder = self.root / "datasets" / self.name
        if not folder.is_dir():
            raise EvalkitError(
                f"missing {folder}: the benchmark's datasets/<set>/ folder (download its "
                "datasets, or `evalkit prepare model-vs-human DIR`)"
            )
        if self.name in FOLDER_SETS:
            found = [(p, "0", p.parent.name) for p in _images(folder, "*/*")]
        else:
            found = [(p, *_session_fields(p)) for p in _images(folder / "dnn", "session-*/*")]
        if not found:
            layout = "<category>/<image>" if self.name in FOLDER_SETS else "dnn/session-1/<image>"
            raise EvalkitError(f"{folder} holds no images: expected {folder}/{layout}")
        return found

    def textures(self) -> list[str]:
        return [texture_of(path.name) for path, _ in self.samples]


def _images(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if p.suffix.lower() in IMAGE_SUFFIXES)


def _session_fields(path: Path) -> tuple[str, str]:
    """(condition, category) from ``<nnnn>_<x>_<y>_<condition>_<category>_…``."""
    parts = path.name.split("_")
    if len(parts) < 6:
        raise EvalkitError(
            f"{path}: expected <trial>_<set>_<observer>_<condition>_<category>_<image> "
            "as the benchmark names its session images"
        )
    return parts[3], parts[4]


def read_trials(root: Path, name: str):
    """Every human trial of set ``name`` (a DataFrame; columns lower-cased, conditions as
    text, ``image_id`` the short name), or None when the root has no human data for it."""
    import pandas as pd

    folder = Path(root) / "raw-data" / name
    files = sorted(folder.glob("*.csv")) if folder.is_dir() else []
    if not files:
        return None
    frames = []
    for path in files:
        try:
            frame = pd.read_csv(path, dtype=str)
        except (ValueError, OSError) as exc:
            raise EvalkitError(f"{path}: unreadable trial file ({exc})") from exc
        frame.columns = [c.strip().lower() for c in frame.columns]
        lacking = [c for c in TRIAL_COLUMNS if c not in frame.columns]
        if lacking:
            raise EvalkitError(
                f"{path}: no column {', '.join(lacking)}: expected the benchmark's columns "
                f"{','.join(TRIAL_COLUMNS)}"
            )
        frames.append(frame[list(TRIAL_COLUMNS)])
    trials = pd.concat(frames, ignore_index=True)
    trials["image_id"] = trials["imagename"].map(short_name)
    if name in FOLDER_SETS:  # one condition, whatever the files call it
        trials["condition"] = "0"
    return trials


def open_split(root: Path, split: str, *, source: str, transform=None, **_):
    if source == "hf":
        raise EvalkitError("model-vs-human is read from the benchmark's folders: use --data folder")
    return Stimuli(root, split, transform)


def _write_embedded(base: Path) -> Path:
    from evalkit.data.stimuli import write_stimuli

    return write_stimuli(base)


MODEL_VS_HUMAN = DataKind(
    name="model-vs-human",
    dirname="model-vs-human",
    layout="model-vs-human/{datasets/<set>/…,raw-data/<set>/*.csv}",
    write_embedded=_write_embedded,
    open_split=open_split,
)
