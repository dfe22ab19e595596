"""``evalkit check-data``: look at everything a task would read, without a backbone.

Per split: images, classes and their counts (classification), the range of image sizes; every
file that cannot be read (all of them, not the first); for dense layouts, every annotation or
depth map checked as the task's reader checks it. Problems — anything that would stop the run
or give a wrong number (a missing split, an evaluation class the training split lacks, fewer
than two training classes, an unreadable file, a bad annotation) — make the command exit 2;
notes (a training class an evaluation split does not have) are shown without failing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from evalkit.data import DataConfig
from evalkit.data.resolve import data_kind, dataset_root, is_stand_in, open_dataset
from evalkit.errors import EvalkitError
from evalkit.progress import ProgressBar
from evalkit.storage.identity import file_digest
from evalkit.storage.writes import not_readable


@dataclass
class SplitReport:
    split: str
    images: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    smallest: tuple[int, int] | None = None
    largest: tuple[int, int] | None = None


@dataclass
class DataReport:
    dataset: str
    splits: list[SplitReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_dataset(name: str, splits: tuple[str, ...], config: DataConfig, *, progress=True):
    """Check the ``splits`` of dataset ``name`` (the first is the training split)."""
    report, train_classes, opened = DataReport(name), None, {}
    for split in splits:
        try:
            dataset = open_split_for_check(name, split, config, train_classes)
        except EvalkitError as exc:
            report.problems.append(f"{split}: {exc}")
            continue
        split_report = SplitReport(split, images=len(dataset))
        report.splits.append(split_report)
        if hasattr(dataset, "classes"):
            train_classes = _check_classes(dataset, split_report, report, train_classes)
        if getattr(dataset, "skipped", None):
            report.notes.append(f"{split}: skipped {dataset.skipped}")
        _check_files(dataset, split_report, report, progress=progress)
        opened[split] = dataset
    _check_duplicates(opened, report)
    return report


def _check_duplicates(opened: dict, report: DataReport):
    """A note for every evaluation split holding exact copies of training images: a probe
    scored on them is scored on what it was fitted to. Only files whose byte size occurs in
    both splits are hashed."""
    names = list(opened)
    if len(names) < 2:
        return
    train = _by_size(_files(opened[names[0]]))
    for split in names[1:]:
        copies = []
        for size, paths in _by_size(_files(opened[split])).items():
            if size in train:
                seen = {file_digest(p): p for p in train[size]}
                copies += [(p, seen[d]) for p in paths if (d := file_digest(p)) in seen]
        if copies:
            first, original = copies[0]
            report.notes.append(
                f"{split}: {len(copies)} images are exact copies of {names[0]} images (e.g. "
                f"{first} = {original}): scores on them measure memory, not generalisation"
            )


def _files(dataset) -> list:
    if hasattr(dataset, "samples"):
        return [path for path, _ in dataset.samples]
    return [p for p in getattr(dataset, "images", []) if isinstance(p, str | Path)]


def _by_size(paths) -> dict[int, list]:
    groups: dict[int, list] = {}
    for path in paths:
        groups.setdefault(os.path.getsize(path), []).append(path)
    return groups


@dataclass(frozen=True)
class _Identity:
    """Normalisation that leaves pixels as they are: the check reads no backbone's."""

    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)


def find_data(
    reads: dict[str, dict[str, str]], config: DataConfig, opened: dict | None = None
) -> list[str]:
    """Open every split a job reads (``Task.reads()``) without reading an image, and describe
    each dataset in one line; a missing folder, split or class is a one-line error here, before
    any backbone is built. Each split opened is put in ``opened`` under (dataset, split name)."""
    lines = []
    opened = {} if opened is None else opened
    for name, splits in reads.items():
        train_classes, found = None, []
        for key, split in splits.items():
            dataset = opened[(name, key)] = open_split_for_check(name, split, config, train_classes)
            classes = getattr(dataset, "classes", None)
            train_classes = train_classes or (list(classes) if classes else None)
            found.append(f"{split} {len(dataset):,}")
        classes = f"{len(train_classes):,} classes; " if train_classes else ""
        lines.append(f"{name} ({_source(name, config)}): {classes}{', '.join(found)}")
    return lines


def _source(name: str, config: DataConfig) -> str:
    if is_stand_in(name, config):
        return "embedded stand-in"
    return str(dataset_root(data_kind(name), config))


def open_split_for_check(name: str, split: str, config: DataConfig, train_classes):
    """Classification readers take the training classes; dense readers an image size."""
    if data_kind(name).targets == "dense":
        return open_dataset(name, split, config, size=224, preprocess=_Identity())
    return open_dataset(name, split, config, classes=train_classes)


def _check_classes(dataset, split_report: SplitReport, report: DataReport, train_classes):
    counts = {name: 0 for name in dataset.classes}
    for label in dataset.labels:
        counts[dataset.classes[label]] += 1
    split_report.classes = counts
    if train_classes is None:
        if len(counts) < 2:
            report.problems.append(
                f"{split_report.split}: {len(counts)} class: a classifier needs at least two"
            )
        return list(dataset.classes)
    absent = [name for name, count in counts.items() if count == 0]
    if absent:
        report.notes.append(
            f"{split_report.split} has no images of {len(absent)} training classes: "
            f"{', '.join(absent[:5])}{' …' if len(absent) > 5 else ''}"
        )
    return train_classes


def _check_files(dataset, split_report: SplitReport, report: DataReport, *, progress: bool):
    """Every image's header (size) and, for dense layouts, every target through the reader."""
    paths = [p for p, _ in getattr(dataset, "samples", [])] or getattr(dataset, "images", [])
    targets = hasattr(dataset, "target")
    check_file = getattr(dataset, "check_file", None)
    with ProgressBar(progress, len(paths), f"check {split_report.split}") as advance:
        for index, path in enumerate(paths):
            problem = check_file(path) if check_file else _check_image(path, split_report)
            if problem is None and targets:
                problem = _check_target(dataset, index)
            if problem:
                report.problems.append(f"{split_report.split}: {problem}")
            advance(1)


def _check_image(path, split_report: SplitReport) -> str | None:
    try:
        with Image.open(path) as image:
            image.verify()
            size = image.size
    except PermissionError:  # another user's file: sound, and not this user's to replace
        return f"image {path} is not readable by this user ({not_readable(path)})"
    except Exception as exc:  # noqa: BLE001 - every way a file can be unreadable
        return f"unreadable image {path} ({type(exc).__name__})"
    area = size[0] * size[1]
    if split_report.smallest is None or area < split_report.smallest[0] * split_report.smallest[1]:
        split_report.smallest = size
    if split_report.largest is None or area > split_report.largest[0] * split_report.largest[1]:
        split_report.largest = size
    return None


def _check_target(dataset, index: int) -> str | None:
    try:
        dataset.target(index)
    except EvalkitError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - an unreadable annotation or depth file
        return f"unreadable target of {dataset.images[index]} ({type(exc).__name__})"
    return None
