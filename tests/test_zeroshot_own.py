"""Zero-shot on a classification set of one's own: ``--set dataset=folder:PATH`` reads class
folders, names them from ``class_names.txt`` (else the folder names), and takes templates from
a text file whose content is part of the run's key."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.heads.zeroshot import names_id, templates


def own_set(root):
    rng = np.random.default_rng(0)
    for folder in ("n_cat", "n_dog"):
        (root / "val" / folder).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "val" / folder / f"{i}.png")
    return root


def run_rows(tmp_path, *settings):
    out = tmp_path / "rows"
    argv = [
        "run",
        "--task",
        "zeroshot-imagenet",
        "--backbone",
        "open_clip/Tiny-Test",
        "--random-init",
        "--quiet",
        "--out",
        str(out),
        *[a for s in settings for a in ("--set", s)],
    ]
    assert main(argv) == 0
    return [json.loads(line) for f in out.rglob("*.jsonl") for line in f.open()]


def test_own_set_with_names_file_and_templates_file(tmp_path, cli_env, tiny_clip_registered):
    root = own_set(tmp_path / "pets")
    (root / "class_names.txt").write_text("n_cat a small cat\nn_dog dog, puppy\n")
    template_file = tmp_path / "pets.txt"
    template_file.write_text("# pets\na photo of a {}.\n\na drawing of a {}.\n")
    rows = run_rows(tmp_path, f"dataset=folder:{root}", f"templates={template_file}")
    top1 = next(r for r in rows if r["metric"] == "top1")
    assert top1["n"] == 6 and top1["extra"]["classes"] == 2
    assert top1["extra"]["class_names_id"] == names_id(["a small cat", "dog, puppy"])
    assert templates(str(template_file)) == ["a photo of a {}", "a drawing of a {}"]
    template_file.write_text("a photo of a {}.\n")  # edited in place: not the same run
    again = run_rows(tmp_path, f"dataset=folder:{root}", f"templates={template_file}")
    assert {r["run_key"] for r in again} != {r["run_key"] for r in rows}


def test_own_set_without_names_file_uses_folder_names(tmp_path, cli_env, tiny_clip_registered):
    root = own_set(tmp_path / "pets")
    rows = run_rows(tmp_path, f"dataset=folder:{root}")
    top1 = next(r for r in rows if r["metric"] == "top1")
    assert top1["extra"]["class_names_id"] == names_id(["n cat", "n dog"])


@pytest.mark.parametrize(
    "text, message",
    [
        ("a photo\n", "exactly one {}"),
        ("{} and {}\n", "exactly one {}"),
        ("# only a comment\n", "has none"),
    ],
)
def test_a_bad_templates_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(EvalkitError, match=message):
        templates(str(path))


def test_a_missing_own_set_is_one_line(tmp_path, cli_env, capsys):
    argv = [
        "run",
        "--task",
        "zeroshot-imagenet",
        "--backbone",
        "fake",
        "--quiet",
        "--set",
        f"dataset=folder:{tmp_path / 'absent'}",
    ]
    assert main(argv) == 2
    assert "expected" in capsys.readouterr().err
