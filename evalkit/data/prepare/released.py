"""``evalkit prepare model-vs-human`` and ``evalkit prepare celeba``: sets that evalkit reads
in their owners' own layout, checked whole and placed under a data root (docs/data.md).

model-vs-human: the benchmark's folder (its repository with the downloaded stimuli), holding
``datasets/<set>/`` and ``raw-data/<set>/*.csv``. Every set found is read as the tasks read it
(every image name parsed, every category one of the 16, every trial file's columns, every
trial's image among its set's stimuli); a set absent is reported, a malformed one is a
one-line error. CelebA: the release's two list files are parsed whole and every listed image
must be in ``img_align_celeba/``. Folders are linked (symbolic links) unless ``--copy``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evalkit.errors import EvalkitError


def place(source: Path, dest: Path, *, copy: bool):
    """``dest`` as a link to ``source`` (or a copy); an existing one is left as it is."""
    if dest.exists() or dest.is_symlink():
        return "kept"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if copy:
        shutil.copytree(source, dest) if source.is_dir() else shutil.copy2(source, dest)
        return "copied"
    os.symlink(source.resolve(), dest, target_is_directory=source.is_dir())
    return "linked"


def prepare_model_vs_human(source: Path, dest: Path, *, copy=False, progress=None) -> dict:
    from evalkit.data.model_vs_human import SETS, Stimuli, read_trials

    source = Path(source)
    if not (source / "datasets").is_dir():
        raise EvalkitError(
            f"no {source}/datasets/: name the benchmark's folder, which holds datasets/<set>/ "
            "(the downloaded stimuli) and raw-data/<set>/*.csv"
        )
    found, missing, trials = {}, [], {}
    sets = progress(SETS, "check sets") if progress else SETS
    for name in sets:
        if not (source / "datasets" / name).is_dir():
            missing.append(name)
            continue
        stimuli = Stimuli(source, name)
        trials[name] = _check_trials(source, name, stimuli, read_trials(source, name))
        found[name] = len(stimuli)
    if not found:
        raise EvalkitError(
            f"{source}/datasets/ holds none of the benchmark's sets ({', '.join(SETS)})"
        )
    target = Path(dest) / "model-vs-human"
    if (source / "categories.json").is_file():  # a set of one's own names its categories
        place(source / "categories.json", target / "categories.json", copy=copy)
    for name in found:
        place(source / "datasets" / name, target / "datasets" / name, copy=copy)
        if trials[name]:
            place(source / "raw-data" / name, target / "raw-data" / name, copy=copy)
    return {
        "written": str(target),
        "sets": found,
        "human trials": trials,
        "missing sets": missing or "none",
    }


def _check_trials(source: Path, name: str, stimuli, trials) -> int:
    """How many trials there are; each must show one of the set's images."""
    if trials is None:
        return 0
    known = set(zip(stimuli.conditions, stimuli.image_ids, strict=True))
    for row in trials.itertuples():
        if (row.condition, row.image_id) not in known:
            raise EvalkitError(
                f"{source}/raw-data/{name}: trial image {row.imagename} (condition "
                f"{row.condition}) is not among datasets/{name}/: use one release's stimuli and trials"
            )
    return len(trials)


def prepare_celeba(source: Path, dest: Path, *, copy=False, progress=None) -> dict:
    from evalkit.data.celeba import (
        ATTRIBUTES_FILE,
        IMAGES,
        PARTITION_FILE,
        PARTITIONS,
        read_release,
    )

    source = Path(source)
    names, values, partition = read_release(source)
    images = source / IMAGES
    if not images.is_dir():
        raise EvalkitError(
            f"missing {images}/: the release's aligned images (img_align_celeba.zip)"
        )
    listed = progress(sorted(values), "check images") if progress else sorted(values)
    absent = [name for name in listed if not (images / name).is_file()]
    if absent:
        raise EvalkitError(
            f"{len(absent)} listed images are not in {images}/ (first {absent[0]}): unpack the "
            "whole img_align_celeba archive"
        )
    target = Path(dest) / "celeba"
    for item in (ATTRIBUTES_FILE, PARTITION_FILE, IMAGES):
        place(source / item, target / item, copy=copy)
    counts = {s: sum(1 for i in values if partition[i] == p) for s, p in PARTITIONS.items()}
    return {"written": str(target), "attributes": len(names), "images": counts}
