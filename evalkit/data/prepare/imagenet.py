"""``evalkit prepare imagenet``: ImageNet-1k as the dataset owners ship it → the class-folder
layout the ImageNet tasks read (effect-table rows 5, 11, 12; docs/data.md, "ImageNet").

Validation: one flat folder of ``ILSVRC2012_val_<number>.JPEG`` with its labels from the devkit
(``ILSVRC2012_validation_ground_truth.txt``, one ILSVRC2012 class id per image in number order,
and ``meta.mat``, which maps those ids to WordNet ids) or from Kaggle's ``LOC_val_solution.csv``
(``ImageId,PredictionString``: the first word of the string is the WordNet id). Training: class
folders (``train/<wnid>/``), or the per-class tar files ``<wnid>.tar`` the training archive
holds. Images are linked, not copied, when the file system allows (symbolic links; ``--copy``
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

VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG$", re.IGNORECASE)
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_VAL = "LOC_val_solution.csv"
NAMES_FILE = "imagenet_classes.json"


def find(source: Path, name: str) -> Path | None:
    """The first file called ``name`` under ``source`` (the devkit nests its files)."""
    direct = source / name
    if direct.is_file():
        return direct
    return next(iter(sorted(source.rglob(name))), None)


def val_labels(source: Path) -> dict[str, str]:
    """{validation file name: WordNet id}, from the devkit or Kaggle's solution file."""
    kaggle = find(source, KAGGLE_VAL)
    if kaggle is not None:
        with kaggle.open(encoding="utf-8", newline="") as f:
            return {
                f"{row['ImageId']}.JPEG": row["PredictionString"].split()[0]
                for row in csv.DictReader(f)
            }
    truth, meta = find(source, GROUND_TRUTH), find(source, "meta.mat")
    if truth is None or meta is None:
        raise EvalkitError(
            f"no validation labels under {source}: expected the devkit's {GROUND_TRUTH} and meta.mat "
            f"(ILSVRC2012_devkit_t12/data/), or Kaggle's {KAGGLE_VAL}"
        )
    wnid_of = devkit_wnids(meta)
    ids = [int(line) for line in truth.read_text().split()]
    return {f"ILSVRC2012_val_{i + 1:08d}.JPEG": wnid_of[class_id] for i, class_id in enumerate(ids)}


def devkit_wnids(meta: Path) -> dict[int, str]:
    """{ILSVRC2012 id: WordNet id} of the 1,000 leaf classes in the devkit's ``meta.mat``."""
    from scipy.io import loadmat

    synsets = loadmat(str(meta), squeeze_me=True)["synsets"]
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0}


def flat_val_folder(source: Path) -> Path:
    for name in ("ILSVRC2012_img_val", "val", "ILSVRC/Data/CLS-LOC/val"):
        folder = source / name
        if folder.is_dir() and any(VAL_NAME.search(p.name) for p in folder.iterdir()):
            return folder
    raise EvalkitError(
        f"no flat validation folder under {source}: expected ILSVRC2012_img_val/ (or val/) "
        "holding ILSVRC2012_val_<number>.JPEG"
    )


def place(src: Path, dst: Path, copy: bool) -> None:
    """``dst`` names ``src``'s image: a symbolic link, or a copy."""
    if dst.exists() or dst.is_symlink():
        return
    if copy:
        shutil.copyfile(src, dst)
    else:
        os.symlink(src.resolve(), dst)


def prepare_val(source: Path, out: Path, *, copy: bool, progress) -> dict:
    folder, labels = flat_val_folder(source), val_labels(source)
    images = sorted(p for p in folder.iterdir() if VAL_NAME.search(p.name))
    unlabelled = [p.name for p in images if p.name not in labels]
    if unlabelled:
        raise EvalkitError(
            f"{len(unlabelled)} validation images have no label (e.g. {unlabelled[0]}): "
            "the labels file is for a different set"
        )
    for wnid in sorted({labels[p.name] for p in images}):
        (out / "val" / wnid).mkdir(parents=True, exist_ok=True)
    for path in progress(images, "imagenet val"):
        place(path, out / "val" / labels[path.name] / path.name, copy)
    return {"val": len(images), "val_classes": len({labels[p.name] for p in images})}


def prepare_train(source: Path, out: Path, *, copy: bool, progress) -> dict:
    """Class folders are linked image by image; per-class tars are extracted."""
    tars = sorted((source / "ILSVRC2012_img_train").glob("n*.tar")) or sorted(
        source.glob("train/n*.tar")
    )
    folders = sorted(p for p in (source / "train").glob("n*") if p.is_dir())
    if not tars and not folders:
        return {"train": 0}
    count = 0
    for item in progress(tars or folders, "imagenet train"):
        target = out / "train" / item.name.removesuffix(".tar")
        target.mkdir(parents=True, exist_ok=True)
        count += (
            _extract(item, target) if item.suffix == ".tar" else _link_folder(item, target, copy)
        )
    return {"train": count, "train_classes": len(tars or folders)}


def _link_folder(folder: Path, target: Path, copy: bool) -> int:
    images = sorted(p for p in folder.iterdir() if p.is_file())
    for path in images:
        place(path, target / path.name, copy)
    return len(images)


def _extract(archive: Path, target: Path) -> int:
    """The tar's images into ``target`` (a finished class is skipped: its marker exists)."""
    done = target / ".complete"
    if done.exists():
        return int(done.read_text())
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and "/" not in m.name.strip("./")]
        tar.extractall(target, members=members, filter="data")
    done.write_text(str(len(members)))
    return len(members)


def prepare_imagenet(source: Path, dest: Path, *, copy: bool, progress) -> dict:
    source, out = Path(source), Path(dest) / "imagenet"
    if not source.is_dir():
        raise EvalkitError(
            f"ImageNet source {source} not found: point at the folder of the official files"
        )
    report = prepare_val(source, out, copy=copy, progress=progress)
    report |= prepare_train(source, out, copy=copy, progress=progress)
    names = resources.files("evalkit.data").joinpath("meta", NAMES_FILE).read_text()
    (out / NAMES_FILE).write_text(names)
    return report
