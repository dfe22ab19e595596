"""Shape bias and human alignment: the benchmark's metrics on hand-computed decision tables,
its 1000 → 16 mapping and file naming, its released layout (read, prepared and refused in one
line), and ``model-vs-human`` / ``shape-bias`` end to end on the embedded stand-in."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from evalkit.cli.errors import declared_tables
from evalkit.errors import EvalkitError
from evalkit.metrics import accuracy_difference, error_consistency, shape_bias


def test_shape_bias_by_hand():
    """Six trials; one has shape = texture (no conflict: counted in neither share, but in the
    denominator, as the benchmark divides by all trials): 3 shape, 1 texture, 1 other."""
    decisions = ["cat", "cat", "dog", "car", "bird", "cat"]
    shapes = ["cat", "cat", "dog", "cat", "cat", "cat"]
    textures = ["dog", "car", "bird", "car", "dog", "cat"]
    out = shape_bias(decisions, shapes, textures)
    assert out["shape_fraction"] == pytest.approx(3 / 6)
    assert out["texture_fraction"] == pytest.approx(1 / 6)
    assert out["shape_bias"] == pytest.approx(3 / 4)
    assert math.isnan(shape_bias(["x"], ["cat"], ["dog"])["shape_bias"])


def test_error_consistency_by_hand():
    """Right/wrong on five trials: agree on three (c_obs .6); both 60 % right, so
    c_exp = .36 + .16 = .52 and kappa = (.6 − .52)/(1 − .52) = 1/6."""
    out = error_consistency([1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert out["observed"] == pytest.approx(0.6)
    assert out["expected"] == pytest.approx(0.52)
    assert out["kappa"] == pytest.approx(1 / 6)
    assert math.isnan(error_consistency([1, 1, 1], [1, 1, 1])["kappa"])  # 0/0: undefined
    assert math.isnan(error_consistency([0, 0], [0, 0])["kappa"])
    assert error_consistency([1, 0, 1], [1, 0, 1])["kappa"] == 1.0  # the same errors
    assert error_consistency([1, 1, 1, 1], [1, 0, 1, 0])["kappa"] == 0.0  # one perfect
    assert error_consistency([1, 0], [0, 1])["kappa"] == pytest.approx(-1.0)
    assert accuracy_difference(0.8, 0.5) == pytest.approx(0.09)  # squared
    with pytest.raises(ValueError, match="same trials"):
        error_consistency([1, 0], [1])


def test_the_benchmarks_mapping_and_names():
    from evalkit.data.model_vs_human import (
        benchmark_categories,
        imagenet_wnids,
        short_name,
        texture_of,
    )

    table, wnids = benchmark_categories(), imagenet_wnids()
    assert len(table) == 16 and sum(map(len, table.values())) == 207
    index = {w: i for i, w in enumerate(wnids)}
    assert [index[w] for w in table["knife"]] == [499]  # the benchmark's index lists
    assert [index[w] for w in table["bear"]] == [294, 295, 296, 297]
    assert [index[w] for w in table["truck"]] == [555, 569, 656, 675, 717, 734, 864, 867]
    assert short_name("0001_s5n_s01_0_bird_00_bird3-bird2.png") == "bird3-bird2.png"
    assert short_name("0001_cop_s01_c30_knife_10_n03041632_7380.png") == "n03041632_7380.png"
    assert short_name("oven10.png") == "oven10.png"
    assert texture_of("0002_s5n_s01_0_bird_00_bird2-clock3.png") == "clock"


def test_a_decision_is_the_category_of_highest_mean_probability():
    """Logits over four classes; category a = classes {0, 1}, b = {2}, c = {3}: the softmax
    (.4, .0, .35, .25) averages to a .2, b .35, c .25 → b, although class 0 is the top class."""
    from evalkit.protocols.human_alignment import category_classes, decide

    probs = torch.tensor([[0.4, 1e-12, 0.35, 0.25]])
    groups = category_classes({"a": ["w", "x"], "b": ["y"], "c": ["z"]}, ["w", "x", "y", "z"])
    assert groups == [[0, 1], [2], [3]]
    assert decide(probs.log(), groups).tolist() == [1]
    with pytest.raises(EvalkitError, match="none of category 'c'"):
        category_classes({"c": ["q"]}, ["w"])


# --- the benchmark's layout --------------------------------------------------------------


def write_benchmark(root: Path, *, trials=True) -> Path:
    """A small benchmark folder: cue-conflict (2 images) and contrast (2 conditions × 2
    images, session naming), with two observers' trials (contrast's file says 'Session' as
    the benchmark's does)."""
    grey = Image.new("RGB", (32, 32), (128, 128, 128))
    for name in ("bear1-cat1.png", "bear2-bear2.png"):
        (root / "datasets/cue-conflict/bear").mkdir(parents=True, exist_ok=True)
        grey.save(root / "datasets/cue-conflict/bear" / name)
    session = root / "datasets/contrast/dnn/session-1"
    session.mkdir(parents=True)
    names = []
    for trial, (condition, category) in enumerate(
        [("c100", "cat"), ("c100", "dog"), ("c10", "cat"), ("c10", "dog")], start=1
    ):
        name = f"{trial:04d}_cop_dnn_{condition}_{category}_10_n0210{trial}_{trial}.png"
        grey.save(session / name)
        names.append((condition, category, name))
    if trials:
        (root / "raw-data/contrast").mkdir(parents=True)
        for subject, responses in (
            (1, ["cat", "cat", "cat", "dog"]),
            (2, ["cat", "dog", "dog", "dog"]),
        ):
            rows = ["subj,Session,trial,rt,object_response,category,condition,imagename"]
            for trial, ((condition, category, name), answer) in enumerate(
                zip(names, responses, strict=True), start=1
            ):
                shown = name.replace("_dnn_", f"_s0{subject}_")
                rows.append(
                    f"subject-0{subject},1,{trial},0.9,{answer},{category},{condition},{shown}"
                )
            csv = root / f"raw-data/contrast/contrast_subject-0{subject}_session_1.csv"
            csv.write_text("\n".join(rows) + "\n")
    return root


def test_the_released_layout_is_read(tmp_path):
    from evalkit.data.model_vs_human import Stimuli, read_trials

    root = write_benchmark(tmp_path / "mvh")
    cue = Stimuli(root, "cue-conflict")
    assert len(cue.classes) == 16 and cue.textures() == ["cat", "bear"]
    contrast = Stimuli(root, "contrast")
    assert contrast.conditions == ["c100", "c100", "c10", "c10"]
    assert [contrast.classes[i] for i in contrast.labels] == ["cat", "dog", "cat", "dog"]
    assert contrast.image_ids[0] == "n02101_1.png"
    trials = read_trials(root, "contrast")
    assert len(trials) == 8 and set(trials["image_id"]) == set(contrast.image_ids)
    assert read_trials(root, "edge") is None


def test_scores_against_two_observers_by_hand(tmp_path):
    """The model answers cat, cat, cat, cat. Kept condition c10 (c100 is excluded as the
    benchmark excludes it): the model is right on (cat) only → accuracy .5. Observer 1
    answers cat, dog (both right: 1.0); observer 2 dog, dog (.5).
    vs 1: accuracy difference (.5 − 1)² = .25; agree on 1 of 2 (c_obs .5); c_exp = .5·1 + .5·0
    = .5 → kappa 0. vs 2: difference 0; right/wrong (1,0) vs (0,1): c_obs 0, c_exp .5 → −1.
    Means: .125, .25, −.5. Observers with each other: difference .25, c_obs .5, kappa 0."""
    from evalkit.data.model_vs_human import Stimuli, read_trials
    from evalkit.protocols.human_alignment import score_set
    from evalkit.protocols.paired_tests import EXCLUDED

    root = write_benchmark(tmp_path / "mvh")
    stimuli = Stimuli(root, "contrast")
    cat = stimuli.classes.index("cat")
    score = score_set(np.full(4, cat), stimuli, read_trials(root, "contrast"), EXCLUDED["contrast"])
    assert score.accuracy == {"c100": 0.5, "c10": 0.5} and score.ood_accuracy == 0.5
    assert score.against_people == pytest.approx(
        {"accuracy_difference": 0.125, "observed_consistency": 0.25, "error_consistency": -0.5}
    )
    assert score.people == pytest.approx(
        {"accuracy_difference": 0.25, "observed_consistency": 0.5, "error_consistency": 0.0}
    )
    assert score.observers == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("rename", r"expected <trial>_<set>_<observer>_<condition>_<category>_<image>"),
        ("category", r"category 'unicorn' is not one of the benchmark's 16"),
        ("column", r"no column object_response"),
        ("stranger", r"trial image .*n09999_9.png .* is not among"),
    ],
)
def test_a_malformed_release_is_refused_in_one_line(tmp_path, damage, message):
    from evalkit.data.prepare.released import prepare_model_vs_human

    root = write_benchmark(tmp_path / "mvh")
    session = root / "datasets/contrast/dnn/session-1"
    csv = root / "raw-data/contrast/contrast_subject-01_session_1.csv"
    if damage == "rename":
        next(session.iterdir()).rename(session / "odd.png")
    elif damage == "category":
        Image.new("RGB", (8, 8)).save(session / "0009_cop_dnn_c10_unicorn_10_n0_9.png")
    elif damage == "column":
        csv.write_text(csv.read_text().replace("object_response", "answer"))
    else:
        csv.write_text(
            csv.read_text()
            + "subject-01,1,5,0.9,cat,cat,c10,0005_cop_s01_c10_cat_10_n09999_9.png\n"
        )
    with pytest.raises(EvalkitError, match=message) as caught:
        prepare_model_vs_human(root, tmp_path / "data")
    assert "\n" not in str(caught.value)


def test_prepare_links_every_set_found_and_names_the_rest(tmp_path, cli_env, capsys):
    from evalkit.cli import main

    root = write_benchmark(tmp_path / "mvh")
    assert main(["prepare", "model-vs-human", str(root), str(tmp_path / "data"), "--quiet"]) == 0
    placed = tmp_path / "data/model-vs-human"
    assert (placed / "datasets/contrast").is_symlink() and (placed / "raw-data/contrast").exists()
    assert not (placed / "raw-data/cue-conflict").exists()  # it has no trials
    assert main(["prepare", "model-vs-human", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "datasets/: name the benchmark's folder" in capsys.readouterr().err


# --- the tasks on the stand-in -------------------------------------------------------------


def test_shape_bias_differs_between_backbones(ctx):
    """The stand-in's cue-conflict images put one category's shape in another's colour and
    pattern: two backbones decide by them in different shares."""
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    task = resolve_task("shape-bias")
    biases = {}
    for name in ("fake", "vit22b/test"):
        rows = {m.metric: m for m in task.run(load_backbone(name), ctx)}
        assert set(task.metrics()) <= set(rows)
        assert rows["shape_fraction"].value + rows["texture_fraction"].value <= 1
        biases[name] = rows["shape_bias"].value
        by_category = rows["shape_bias"].extra["shape_bias_by_category"]
        assert set(by_category) == {"circle", "cross", "square", "triangle"}
        assert "linear probe" in rows["shape_bias"].extra["classifier"]
    assert biases["fake"] != biases["vit22b/test"]


def test_model_vs_human_scores_every_set_and_the_people(ctx, tmp_path):
    from evalkit.core.runner import resolve_task
    from evalkit.data.model_vs_human import SETS

    ctx.predictions = tmp_path / "predictions.parquet"
    task = resolve_task("model-vs-human")
    from evalkit import load_backbone

    rows = {m.metric: m for m in task.run(load_backbone("fake"), ctx)}
    assert set(task.metrics()) <= set(rows)
    for metric in ("accuracy_difference", "observed_consistency", "error_consistency"):
        assert set(rows[metric].extra[f"{metric}_by_set"]) == set(SETS)
        assert rows[metric].extra["people"] is not None
    per_set = [rows[f"ood_accuracy/{s}"].value for s in SETS]
    assert rows["ood_accuracy"].value == pytest.approx(sum(per_set) / len(per_set))
    saved = pd.read_parquet(ctx.predictions)
    assert len(saved) == sum(rows[f"ood_accuracy/{s}"].n for s in SETS)
    cue = saved[saved["set"] == "cue-conflict"]
    conflict = cue[cue["category"] != cue["texture"]]
    assert rows["shape_fraction"].value == pytest.approx(
        (conflict["decision"] == conflict["category"]).sum() / len(cue)
    )
    tables = dict(
        declared_tables("model-vs-human")(saved, 3)
    )  # evalkit errors reads these outputs too
    wrong = saved[~saved["correct"]]
    top = tables["most confused categories"].iloc[0]
    assert top["images"] == wrong.groupby(["category", "decision"]).size().max()
    assert len(tables["sets of lowest accuracy"]) == 3


def test_the_own_head_is_used_where_the_backbone_keeps_one(ctx, tmp_path):
    """A timm model built with its 1000-class head scores the benchmark's layout through the
    1000 → 16 mapping; one without a head is not applicable to classifier=own."""
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task
    from evalkit.data import DataConfig

    write_benchmark(tmp_path / "model-vs-human", trials=False)
    ctx.data = DataConfig(source="folder", root=tmp_path)
    headed = load_backbone("timm/resnet18", model_kwargs={"num_classes": 1000})
    task = resolve_task("shape-bias", ["classifier=own"])
    rows = {m.metric: m for m in task.run(headed, ctx)}
    assert rows["shape_bias"].extra["classifier"] == "timm/resnet18's own ImageNet-1k head"
    assert rows["ood_accuracy/cue-conflict"].n == 2
    assert task.lacks(load_backbone("timm/resnet18")) is not None
    assert task.datasets() == ("model-vs-human",)  # no probe: ImageNet is not read


def test_paper_numbers_stand_beside_fine_tuned_runs_only():
    from evalkit.core.runner import resolve_task

    assert resolve_task("shape-bias").reference == {}
    assert resolve_task("model-vs-human").reference == {}
    tuned = resolve_task("shape-bias", ["finetune=true"]).reference
    assert tuned == {"shape_bias": {"ViT-22B-384 (fine-tuned)": 0.87, "humans": 0.96}}
    own = resolve_task("model-vs-human", ["classifier=own"]).reference
    assert own["ood_accuracy"]["ViT-22B-384 (fine-tuned)"] == 0.837
    subset = resolve_task("model-vs-human", ["classifier=own", "sets=edge,cue-conflict"])
    assert "ood_accuracy" not in subset.reference  # the benchmark's mean is over 17 sets


def test_a_checkpoints_own_head_is_loaded_never_left_random(tmp_path):
    """A model built with its 1000-class head from ``--weights`` gets the checkpoint's head
    (a head skipped on loading would be random and its decisions noise)."""
    import timm
    from safetensors.torch import save_file

    from evalkit import load_backbone

    source = timm.create_model("resnet18", num_classes=1000)
    torch.nn.init.normal_(source.fc.weight)
    save_file(source.state_dict(), tmp_path / "w.safetensors")
    loaded = load_backbone(
        "timm/resnet18", weights=str(tmp_path / "w.safetensors"), model_kwargs={"num_classes": 1000}
    )
    assert loaded.has_imagenet_head
    assert torch.equal(loaded.model.fc.weight, source.fc.weight)
    plain = load_backbone("timm/resnet18", weights=str(tmp_path / "w.safetensors"))
    assert not plain.has_imagenet_head  # built without a head, the checkpoint's is skipped


# Each set's conditions as the release's trial files (raw-data/<set>/*.csv) spell them, and
# the conditions the benchmark's summaries keep once its exclusions are applied to the values
# pandas reads from those files.
RELEASE_CONDITIONS = {
    "colour": (["bw", "cr"], ["bw"]),
    "contrast": (
        ["c01", "c03", "c05", "c10", "c100", "c15", "c30", "c50"],
        ["c05", "c10", "c15", "c30", "c50"],
    ),
    "high-pass": (["0.4", "0.45", "0.55", "0.7", "1", "1.5", "3", "inf"], ["0.7", "1", "1.5", "3"]),
    "low-pass": (["0", "1", "10", "15", "3", "40", "5", "7"], ["1", "10", "3", "5", "7"]),
    "phase-scrambling": (["0", "120", "150", "180", "30", "60", "90"], ["120", "30", "60", "90"]),
    "power-equalisation": (["0", "pow"], ["pow"]),
    "false-colour": (["false", "true"], ["false"]),
    "rotation": (["0", "180", "270", "90"], ["180", "270", "90"]),
    "eidolonI": (
        [f"{r}-10-10" for r in (1, 128, 16, 2, 32, 4, 64, 8)],
        [f"{r}-10-10" for r in (16, 2, 32, 4, 8)],
    ),
    "eidolonII": (
        [f"{r}-3-10" for r in (1, 128, 16, 2, 32, 4, 64, 8)],
        [f"{r}-3-10" for r in (16, 2, 4, 8)],
    ),
    "eidolonIII": (
        [f"{r}-0-10" for r in (1, 128, 16, 2, 32, 4, 64, 8)],
        [f"{r}-0-10" for r in (2, 4, 8)],
    ),
    "uniform-noise": (
        ["0.00", "0.03", "0.05", "0.10", "0.20", "0.35", "0.60", "0.90"],
        ["0.03", "0.05", "0.10", "0.20", "0.35"],
    ),
}


def test_every_sets_exclusions_are_the_benchmarks_on_the_releases_spellings():
    from evalkit.data.model_vs_human import SETS
    from evalkit.protocols.paired_tests import EXCLUDED, kept_conditions

    assert set(EXCLUDED) == set(RELEASE_CONDITIONS)
    for name in SETS:
        spelled, kept = RELEASE_CONDITIONS.get(name, (["0"], ["0"]))  # the rest: one condition
        assert kept_conditions(spelled, EXCLUDED.get(name, ())) == kept, name


def test_the_stand_in_spells_conditions_and_headers_as_the_release_does(ctx):
    from evalkit.data.model_vs_human import read_trials
    from evalkit.data.resolve import dataset_root
    from evalkit.data.stimuli import CONDITIONS

    assert CONDITIONS["false-colour"] == ("true", "false")
    assert all(len(c) == 4 for c in CONDITIONS["uniform-noise"])  # 0.00, 0.10, ...
    from evalkit.data.resolve import data_kind

    root = dataset_root(data_kind("model-vs-human"), ctx.data)
    header = next((root / "raw-data" / "false-colour").glob("*.csv")).read_text().splitlines()[0]
    assert header.split(",")[:2] == ["subj", "Session"]
    assert set(read_trials(root, "false-colour")["condition"]) == {"true", "false"}


def test_ood_accuracy_and_shape_bias_get_paired_tests_that_recompute_them(ctx, tmp_path):
    """The task declares how its headline metrics are recomputed from its per-image outputs:
    the declared statistic on the saved outputs equals the rows."""
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    ctx.predictions = tmp_path / "predictions.parquet"
    task = resolve_task("model-vs-human")
    rows = {m.metric: m for m in task.run(load_backbone("fake"), ctx)}
    saved = pd.read_parquet(ctx.predictions)
    columns = set(saved.columns)
    for metric in ("ood_accuracy", "shape_bias"):
        test = task.paired_test(metric, columns)
        assert test.statistic(test.parts(saved)) == pytest.approx(rows[metric].value, abs=1e-12)
