"""Inputs a careful user still produces: symbolic links that loop (to themselves, to each
other, to a folder above), class names spelled in two Unicode forms, a constructor rejecting a
``--model-arg`` value, ``--weights`` on a backbone that reads none, a bare pickle as weights.
Each is one line naming the problem, or (Unicode) simply works."""

from __future__ import annotations

import os
import pickle
import unicodedata

import numpy as np
import pytest
from PIL import Image

from evalkit.cli import main


def _images(folder, count=3):
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(len(str(folder)))
    for i in range(count):
        pixels = (generator.random((24, 24, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"{i}.png")


def _dataset(root, train=("cat", "dog"), val=("cat", "dog")):
    for split, names in (("train", train), ("val", val)):
        for name in names:
            _images(root / "imagenet" / split / name)
    return root


def _run(root, tmp_path, *extra):
    return main(
        [
            "run",
            "--task",
            "imagenet-linear",
            "--backbone",
            "fake",
            "--data",
            "folder",
            "--data-dir",
            str(root),
            "--out",
            str(tmp_path / "rows"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--quiet",
            "--set",
            "l2_grid=0.1",
            *extra,
        ]
    )


def _one_line_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("shape", ["self", "pair", "up", "inside"])
def test_symbolic_link_loops_are_one_line_naming_the_link(tmp_path, capsys, shape):
    root = _dataset(tmp_path / "data")
    train = root / "imagenet" / "train"
    if shape == "self":
        os.symlink("loop", train / "loop")
    elif shape == "pair":
        os.symlink("b", train / "a")
        os.symlink("a", train / "b")
    elif shape == "up":
        (train / "cow").mkdir()
        os.symlink("..", train / "cow" / "up")
    else:
        os.symlink(".", train / "cat" / "again")
    assert _run(root, tmp_path) == 2
    line = _one_line_error(capsys)
    assert "loop" in line and "has no images" not in line


def test_class_names_match_across_unicode_forms(tmp_path, capsys):
    composed, decomposed = (unicodedata.normalize(f, "café") for f in ("NFC", "NFD"))
    assert composed != decomposed
    root = _dataset(tmp_path / "data", train=(composed, "dog"), val=(decomposed, "dog"))
    assert _run(root, tmp_path) == 0, capsys.readouterr().err


def test_a_name_the_training_split_lacks_shows_its_code_points(tmp_path, capsys):
    root = _dataset(tmp_path / "data", train=("cat", "dog"), val=("cät", "dog"))
    assert _run(root, tmp_path) == 2
    assert "U+00E4" in _one_line_error(capsys)


def test_a_constructor_rejecting_a_value_is_one_line_naming_the_option(tmp_path, capsys):
    code = main(
        [
            "run",
            "--task",
            "imagenet-linear",
            "--backbone",
            "timm/vit_tiny_patch16_224",
            "--model-arg",
            "act_layer=/tmp/x.pt",
            "--data",
            "embedded",
            "--out",
            str(tmp_path / "rows"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--quiet",
        ]
    )
    assert code == 2
    assert "rejected --model-arg act_layer='/tmp/x.pt'" in _one_line_error(capsys)


def test_weights_for_a_backbone_that_reads_none_are_refused(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"anything")
    root = _dataset(tmp_path / "data")
    assert _run(root, tmp_path, "--weights", str(weights)) == 2
    assert "fake loads no weights" in _one_line_error(capsys)


class Thing:
    pass


def test_a_bare_pickle_as_weights_is_called_a_pickle(tmp_path):
    from evalkit.errors import EvalkitError
    from evalkit.storage.checkpoints import read_state_dict

    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps({"w": Thing()}, protocol=4))
    with pytest.raises(EvalkitError, match="it is a pickle holding Python objects"):
        read_state_dict(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(EvalkitError, match="not a safetensors file or a torch checkpoint"):
        read_state_dict(path)


def test_check_data_notes_evaluation_images_copied_from_training(tmp_path, capsys):
    import shutil

    root = _dataset(tmp_path / "data")
    val = root / "imagenet" / "val"
    shutil.copy(root / "imagenet" / "train" / "dog" / "1.png", val / "cat" / "copy.png")
    assert (
        main(
            [
                "check-data",
                "--task",
                "imagenet-linear",
                "--data",
                "folder",
                "--data-dir",
                str(root),
                "--quiet",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "val: 1 images are exact copies of train images" in out and "copy.png" in out
