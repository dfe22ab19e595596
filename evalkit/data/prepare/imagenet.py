"""``evalkit prepare imagenet``: ImageNet-1k as the dataset owners ship it → the class-folder
layout the ImageNet tasks read (effect-table rows 5, 11, 12; docs/data.md, "ImageNet").

Validation: one flat folder of ``ILSVRC2012_val_<number>.JPEG`` with its labels from the devkit
(``ILSVRC2012_validation_ground_truth.txt``, one ILSVRC2012 class id per image in number order,
and ``meta.mat``, which maps those ids to WordNet ids) or from Kaggle's ``LOC_val_solution.csv``
(``ImageId,PredictionString``: the first word of the string is the WordNet id). Training: class
folders (``train/<wnid>/``), or the per-class tar files ``<wnid>.tar`` the training archive
holds (or that archive itself, ``ILSVRC2012_img_train.tar``, read as a stream), or Kaggle's
``ILSVRC/Data/CLS-LOC/train/<wnid>/``. Every malformed labels file is a one-line error naming
the file and the line. Images are linked, not copied, when the file system allows (symbolic links; ``--copy``
copies); tar members are extracted. Class folders are WordNet ids, and the set carries
CLIP's class names (``imagenet_classes.json``) for prompts.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import tarfile
from importlib import resources
from pathlib import Path

from evalkit.errors import EvalkitError

VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG$", re.IGNORECASE)  # .jpeg alike
WNID = re.compile(r"n\d{8}")
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_VAL = "LOC_val_solution.csv"
NAMES_FILE = "imagenet_classes.json"


def find(source: Path, name: str) -> Path | None:
    """The first file called ``name`` under ``source`` (the devkit nests its files)."""
    direct = source / name
    if direct.is_file():
        return direct
    return next(iter(sorted(source.rglob(name))), None)


def val_labels(source: Path) -> dict[int, str]:
    """{validation image number: WordNet id}, from the devkit or Kaggle's solution file."""
    kaggle = find(source, KAGGLE_VAL)
    if kaggle is not None:
        return kaggle_labels(kaggle)
    truth, meta = find(source, GROUND_TRUTH), find(source, "meta.mat")
    if truth is None or meta is None:
        raise EvalkitError(
            f"no validation labels under {source}: expected the devkit's {GROUND_TRUTH} and meta.mat "
            f"(ILSVRC2012_devkit_t12/data/), or Kaggle's {KAGGLE_VAL}"
        )
    return devkit_labels(truth, devkit_wnids(meta))


def kaggle_labels(path: Path) -> dict[int, str]:
    """Kaggle's ``ImageId,PredictionString`` rows: the string's first word is the WordNet id."""
    labels = {}
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
            raise EvalkitError(
                f"{path}: expected the header ImageId,PredictionString, found "
                f"{','.join(reader.fieldnames or ()) or 'none'}"
            )
        for line, row in enumerate(reader, start=2):
            number = VAL_NAME.search(f"{row['ImageId']}.JPEG")
            words = (row["PredictionString"] or "").split()
            if number is None or not words or not WNID.fullmatch(words[0]):
                raise EvalkitError(
                    f"{path} line {line}: expected ILSVRC2012_val_<number>,<wnid> ..., found "
                    f"{row['ImageId']!r},{row['PredictionString']!r}"
                )
            labels[int(number.group(1))] = words[0]
    return labels


def devkit_labels(truth: Path, wnid_of: dict[int, str]) -> dict[int, str]:
    """The ground truth's 1-based ILSVRC2012 class ids, one per image in number order."""
    labels = {}
    for number, word in enumerate(truth.read_text().split(), start=1):
        if not word.isdigit() or int(word) not in wnid_of:
            hint = " (the devkit's ids are 1-based; this file holds a 0)" if word == "0" else ""
            raise EvalkitError(
                f"{truth} line {number}: {word!r} is not the id of one of meta.mat's "
                f"{len(wnid_of)} leaf classes{hint}"
            )
        labels[number] = wnid_of[int(word)]
    return labels


def devkit_wnids(meta: Path) -> dict[int, str]:
    """{ILSVRC2012 id: WordNet id} of the 1,000 leaf classes in the devkit's ``meta.mat``."""
    from scipy.io import loadmat

    try:
        synsets = loadmat(str(meta), squeeze_me=True)["synsets"]
        wnids = {
            int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0
        }
    except Exception as exc:  # noqa: BLE001 - scipy raises many kinds for a file it cannot read
        raise EvalkitError(
            f"{meta} is not the devkit's meta.mat (a 'synsets' table with ILSVRC2012_ID, WNID "
            f"and num_children): {type(exc).__name__}"
        ) from None
    if not wnids:
        raise EvalkitError(
            f"{meta} lists no leaf class (num_children 0): not the devkit's meta.mat"
        )
    return wnids


def flat_val_folder(source: Path) -> Path:
    for name in ("ILSVRC2012_img_val", "val", "ILSVRC/Data/CLS-LOC/val"):
        folder = source / name
        if folder.is_dir() and any(VAL_NAME.search(p.name) for p in folder.iterdir()):
            return folder
    raise EvalkitError(
        f"no flat validation folder under {source}: expected ILSVRC2012_img_val/ (or val/) "
        "holding ILSVRC2012_val_<number>.JPEG"
    )


def place(src: Path, dst: Path, copy: bool) -> bool:
    """``dst`` names ``src``'s image: a symbolic link, or a copy (which replaces a link an
    earlier run made). Returns whether anything was written."""
    if copy and dst.is_symlink():
        dst.unlink()
    elif dst.exists() or dst.is_symlink():
        return False
    if copy:
        shutil.copyfile(src, dst)
    else:
        os.symlink(src.resolve(), dst)
    return True


def prepare_val(source: Path, out: Path, *, copy: bool, progress) -> dict:
    folder, labels = flat_val_folder(source), val_labels(source)
    images = sorted(p for p in folder.iterdir() if VAL_NAME.search(p.name))
    number = {p: int(VAL_NAME.search(p.name).group(1)) for p in images}
    unlabelled = [p.name for p in images if number[p] not in labels]
    if unlabelled:
        raise EvalkitError(
            f"{len(unlabelled)} validation images have no label (e.g. {unlabelled[0]}): "
            "the labels file is for a different set"
        )
    for wnid in sorted({labels[number[p]] for p in images}):
        (out / "val" / wnid).mkdir(parents=True, exist_ok=True)
    written = sum(
        place(p, out / "val" / labels[number[p]] / p.name, copy)
        for p in progress(images, "imagenet val")
    )
    return {
        "val": len(images),
        "val_classes": len({labels[number[p]] for p in images}),
        "val_written": written,
        "val_kept": len(images) - written,
    }


TRAIN_TAR = "ILSVRC2012_img_train.tar"
TRAIN_FOLDERS = ("train", "ILSVRC2012_img_train", "ILSVRC/Data/CLS-LOC/train")


def prepare_train(source: Path, out: Path, *, copy: bool, progress) -> dict:
    """Class folders are linked image by image; per-class tars are extracted, from a folder
    of them or from the shipped outer archive (read as a stream, never unpacked twice)."""
    for name in TRAIN_FOLDERS:
        tars = sorted((source / name).glob("n*.tar"))
        folders = sorted(p for p in (source / name).glob("n*") if p.is_dir())
        if tars or folders:
            return _train_items(tars or folders, out, copy, progress)
    if (source / TRAIN_TAR).is_file():
        return _train_archive(source / TRAIN_TAR, out, progress)
    raise EvalkitError(
        f"no training images under {source}: expected {TRAIN_TAR}, or per-class <wnid>.tar "
        f"files or <wnid>/ folders in one of {', '.join(TRAIN_FOLDERS)} (the last is Kaggle's); "
        "--val-only prepares the validation split alone"
    )


def _train_items(items: list[Path], out: Path, copy: bool, progress) -> dict:
    count = 0
    for item in progress(items, "imagenet train"):
        target = out / "train" / item.name.removesuffix(".tar")
        target.mkdir(parents=True, exist_ok=True)
        count += (
            _extract(item, target) if item.suffix == ".tar" else _link_folder(item, target, copy)
        )
    return {"train": count, "train_classes": len(items)}


def _train_archive(archive: Path, out: Path, progress) -> dict:
    """The outer training archive: one ``<wnid>.tar`` member per class, each extracted from
    the stream into its class folder."""
    count, classes = 0, 0
    with tarfile.open(archive, mode="r|") as outer:
        for member in progress(outer, "imagenet train", total=1000):
            if not (member.isfile() and WNID.fullmatch(member.name.removesuffix(".tar"))):
                continue
            target = out / "train" / member.name.removesuffix(".tar")
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=outer.extractfile(member), mode="r|") as inner:
                count += _extract_members(inner, target)
            classes += 1
    if not classes:
        raise EvalkitError(f"{archive} holds no <wnid>.tar member: not ImageNet's training archive")
    return {"train": count, "train_classes": classes}


def _link_folder(folder: Path, target: Path, copy: bool) -> int:
    images = sorted(p for p in folder.iterdir() if p.is_file())
    for path in images:
        place(path, target / path.name, copy)
    return len(images)


def _extract(archive: Path, target: Path) -> int:
    """The tar's images into ``target`` (a finished class is skipped: its marker exists)."""
    with tarfile.open(archive) as tar:
        return _extract_members(tar, target)


def _extract_members(tar: tarfile.TarFile, target: Path) -> int:
    """Every top-level file of an open (possibly streamed) tar into ``target``, then the
    marker that makes a rerun skip the class."""
    done = target / ".complete"
    if done.exists():
        return int(done.read_text())
    count = 0
    for member in tar:
        if member.isfile() and "/" not in member.name.strip("./"):
            tar.extract(member, target, filter="data")
            count += 1
    done.write_text(str(count))
    return count


def prepare_imagenet(source: Path, dest: Path, *, copy: bool, progress, val_only=False) -> dict:
    source, out = Path(source), Path(dest) / "imagenet"
    if not source.is_dir():
        raise EvalkitError(
            f"ImageNet source {source} not found: point at the folder of the official files"
        )
    report = prepare_val(source, out, copy=copy, progress=progress)
    if not val_only:
        report |= prepare_train(source, out, copy=copy, progress=progress)
    names = resources.files("evalkit.data").joinpath("meta", NAMES_FILE).read_text()
    (out / NAMES_FILE).write_text(names)
    return report
