"""Which classes a zero-shot row scores and what its saved predictions say: a partial ImageNet
val is still the 1000-way protocol (a restricted space is named and never sits beside the
paper's number); saved predictions hold the prediction that was scored, inside the label space,
with labels in the same index space and both named (ImageNet-R-style and ObjectNet-style
spaces); a ``class_names.txt`` that names no folder is refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from evalkit.cli import main
from evalkit.core.runner import resolve_task
from evalkit.data.shifted import LabelSpace, check_names_file
from evalkit.errors import EvalkitError
from evalkit.protocols.error_tables import classification_tables
from evalkit.protocols.predictions import save_classifications

WNIDS = ("n01440764", "n01443537", "n01484850")  # tench, goldfish, great white shark


def partial_val(root):
    rng = np.random.default_rng(0)
    for wnid in WNIDS:
        (root / "imagenet" / "val" / wnid).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "imagenet" / "val" / wnid / f"{i}.png")
    return root


def zero_shot_rows(tmp_path, data_root, *settings):
    out = tmp_path / "rows"
    argv = [
        "run",
        "--task",
        "zeroshot-imagenet",
        "--backbone",
        "open_clip/Tiny-Test",
        "--quiet",
        "--data-dir",
        str(data_root),
        "--out",
        str(out),
        "--save-predictions",
        *[a for s in settings for a in ("--set", s)],
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for f in out.rglob("*.jsonl") for line in f.open()]
    return next(r for r in rows if r["metric"] == "top1"), out


@pytest.mark.long
def test_a_partial_imagenet_val_is_scored_over_all_1000_classes(
    tmp_path, cli_env, tiny_clip_registered
):
    top1, _ = zero_shot_rows(tmp_path, partial_val(tmp_path / "data"))
    assert (
        top1["extra"]["candidates"] == 1000 and top1["extra"]["label_space"] == "all 1000 classes"
    )
    assert top1["extra"]["prompts"] == "verbatim" and top1["extra"]["templates"] == "openai"
    assert resolve_task("zeroshot-imagenet").reference["top1"]  # the paper's number, same protocol


def test_the_classes_present_are_a_named_protocol_without_the_papers_number(
    tmp_path, cli_env, tiny_clip_registered
):
    top1, out = zero_shot_rows(tmp_path, partial_val(tmp_path / "data"), "label_space=present")
    assert top1["extra"]["candidates"] == 3
    assert top1["extra"]["label_space"] == "3 of 1000 classes (the classes present)"
    assert resolve_task("zeroshot-imagenet", ["label_space=present"]).reference == {"top1": {}}
    import pandas as pd

    frame = pd.read_parquet(next((out / "predictions").glob("*.parquet")))
    assert set(frame["prediction"]) <= {0, 1, 2}  # tench, goldfish, great white shark
    assert set(frame["prediction_name"]) <= {"tench", "goldfish", "great white shark"}
    assert (frame["correct"] == (frame["prediction"] == frame["label"])).all()


class Recorder:
    def __init__(self):
        self.predictions, self.saved = "somewhere", None

    def save_predictions(self, columns):
        self.saved = columns


def saved(scores, labels, space, classes):
    ctx = Recorder()
    dataset = SimpleNamespace(
        classes=classes, samples=[(f"img{i}.jpg", int(y)) for i, y in enumerate(labels)]
    )
    save_classifications(ctx, scores, labels, dataset, space)
    return ctx.saved


NAMES = ("tench", "goldfish", "shark", "kite", "robin", "jay")


def test_saved_predictions_of_an_imagenet_r_style_space_are_inside_it():
    """Two of the six reference classes are the set's; the unrestricted argmax (class 3) is
    never saved as the prediction, and labels are reference indices as predictions are."""
    space = LabelSpace(tuple(f"n{i}" for i in range(6)), NAMES, ((1,), (4,)), (1, 4))
    scores = torch.tensor([[0.1, 0.5, 0.0, 0.9, 0.2, 0.0], [0.0, 0.1, 0.0, 0.9, 0.3, 0.8]])
    rows = saved(scores, torch.tensor([0, 1]), space, ["n1", "n4"])
    assert rows["prediction"] == [1, 4] and rows["prediction_name"] == ["goldfish", "robin"]
    assert rows["label"] == [1, 4] and rows["label_name"] == ["goldfish", "robin"]
    assert [set(top) for top in rows["top5"]] == [{1, 4}, {1, 4}]  # only candidates
    assert rows["correct"] == [True, True]


def test_saved_predictions_of_an_objectnet_style_space_name_both_sides():
    """ObjectNet: an own class maps to several reference classes; any of them is right."""
    space = LabelSpace(tuple(f"n{i}" for i in range(6)), NAMES, ((0, 2), (5,)), (0, 2, 5))
    scores = torch.tensor([[0.1, 0.9, 0.7, 0.0, 0.0, 0.2], [0.3, 0.9, 0.0, 0.0, 0.0, 0.2]])
    rows = saved(scores, torch.tensor([0, 1]), space, ["fish", "bird"])
    assert rows["prediction"] == [2, 0] and rows["prediction_name"] == ["shark", "tench"]
    assert rows["label_classes"] == [[0, 2], [5]] and rows["label_name"] == ["fish", "jay"]
    assert rows["correct"] == [True, False]
    import pandas as pd

    _, mistakes = classification_tables(pd.DataFrame(rows), top=5)
    assert mistakes[1].iloc[0][["label_name", "predicted"]].tolist() == ["jay", "tench"]


def test_a_names_file_whose_keys_match_no_folder_is_one_line(tmp_path):
    (tmp_path / "class_names.txt").write_text("C0 a cat\nc1 a dog\n")
    with pytest.raises(EvalkitError, match="keys with no folder: C0; folders with no name: c0"):
        check_names_file(tmp_path, ["c0", "c1"])
    (tmp_path / "class_names.txt").write_text("c0 a cat\nc1 a dog\n")
    check_names_file(tmp_path, ["c0", "c1"])
