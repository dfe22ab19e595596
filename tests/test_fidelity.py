"""Numbers that cannot be silently wrong: evaluation labels follow the training classes by
name, settings and options are checked where they are declared, and files come as they are
(odd names, oversized images) without a traceback."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from evalkit.cli import main
from evalkit.data import DataConfig
from evalkit.data.resolve import open_dataset
from evalkit.errors import EvalkitError

COLOURS = {"cat": (200, 30, 30), "dog": (30, 200, 30), "fox": (30, 30, 200), "zebra": (0, 0, 0)}


def write_split(root, split: str, classes, per_class: int = 6):
    for name in classes:
        folder = root / "imagenet" / split / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            colour = tuple(min(255, c + 3 * i) for c in COLOURS[name])
            Image.new("RGB", (32, 32), colour).save(folder / f"{i}.png")


def run(root, *args):
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
            "--quiet",
            "--out",
            str(root / "rows"),
            *args,
        ]
    )


def test_eval_labels_follow_training_classes_by_name(tmp_path):
    write_split(tmp_path, "train", ["cat", "dog", "fox"])
    write_split(tmp_path, "val", ["cat", "fox"])
    config = DataConfig(source="folder", root=tmp_path)
    train = open_dataset("imagenet", "train", config)
    val = open_dataset("imagenet", "val", config, classes=train.classes)
    assert val.classes == ["cat", "dog", "fox"]
    assert sorted(set(val.labels)) == [0, 2]  # fox is train's 2, not val's own 1
    assert open_dataset("imagenet", "val", config).labels[-1] == 1  # the old, wrong mapping
    assert run(tmp_path) == 0


def test_an_eval_class_training_lacks_is_an_error_naming_it(tmp_path, capsys):
    write_split(tmp_path, "train", ["cat", "dog"])
    write_split(tmp_path, "val", ["cat", "zebra"])
    assert run(tmp_path) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has 1 classes the training split lacks: zebra" in err and "Traceback" not in err


def test_a_single_training_class_is_an_error(tmp_path, capsys):
    write_split(tmp_path, "train", ["cat"])
    write_split(tmp_path, "val", ["cat"])
    assert run(tmp_path) == 2
    assert "a classifier needs at least two" in capsys.readouterr().err


def test_hf_labels_follow_training_class_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["fox", "cat"])}
    )
    image = Image.new("RGB", (8, 8))
    ds = datasets.Dataset.from_dict({"image": [image, image], "label": [0, 1]}, features=features)
    from evalkit.data.folder import HFImages

    mapped = HFImages(ds, classes=["cat", "dog", "fox"])
    assert mapped.labels == [2, 0]
    with pytest.raises(EvalkitError, match="classes the training split lacks: fox"):
        HFImages(ds, classes=["cat", "dog"])


BAD_SETTINGS = [
    (["--task", "nyu-depth-dpt", "--set", "steps=-5"], "steps=-5 is out of range"),
    (["--set", "max_iter=0"], "max_iter=0 is out of range: expected a positive number"),
    (["--task", "ade20k-1/16", "--set", "batch_size=0"], "batch_size=0 is out of range"),
    (["--set", "holdout=2"], "holdout=2.0 is out of range: expected a fraction in (0, 1)"),
    (["--task", "ade20k-1/16", "--set", "image_size=0"], "image_size=0 is out of range"),
    (["--set", "l2_grid="], "l2_grid= is out of range: expected a non-empty list"),
    (["--set", "pool=tokens"], "pool=tokens is out of range: expected one of auto, cls"),
    (["--batch-size", "0"], "--batch-size must be auto or at least 1"),
    (["--workers", "-1"], "--workers must be 0 or more"),
    (["--device", "foo"], "unknown --device 'foo'"),
    (["--device", "cuda"], "this machine has no CUDA device"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SETTINGS)
def test_out_of_range_settings_are_one_line_errors(cli_env, capsys, args, message):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    task = [] if "--task" in args else ["--task", "imagenet-linear"]
    code = main(["run", *task, "--backbone", "fake", "--data", "embedded", "--quiet", *args])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and message in err and "Traceback" not in err


def test_settings_are_checked_from_python_too():
    from evalkit import get_task
    from evalkit.tasks.linear_probe import LinearProbe

    with pytest.raises(EvalkitError, match="holdout=1.5 is out of range"):
        LinearProbe(holdout=1.5)
    with pytest.raises(EvalkitError, match="fraction=0.0 is out of range"):
        get_task("ade20k-1/16", ["fraction=0"])


def test_image_smaller_than_a_patch_is_refused(cli_env, capsys):
    args = ["--task", "ade20k-1/16", "--backbone", "fake", "--data", "embedded", "--quiet"]
    os.environ["EVALKIT_EMBEDDED_SCENES"] = "4,2"
    try:
        assert main(["run", *args, "--set", "image_size=4"]) == 2
    finally:
        del os.environ["EVALKIT_EMBEDDED_SCENES"]
    assert "image_size=4 is smaller than the patch size of fake (8)" in capsys.readouterr().err


def test_non_utf8_file_names_run_end_to_end(tmp_path):
    write_split(tmp_path, "train", ["cat", "dog"])
    write_split(tmp_path, "val", ["cat", "dog"])
    odd = os.fsencode(tmp_path / "imagenet" / "train" / "cat") + b"/caf\xe9.png"
    Image.new("RGB", (32, 32), (210, 40, 40)).save(os.fsdecode(odd))
    assert run(tmp_path) == 0


def test_an_oversized_image_is_one_line_naming_the_file_and_the_limit(
    tmp_path, monkeypatch, capsys
):
    write_split(tmp_path, "train", ["cat", "dog"])
    write_split(tmp_path, "val", ["cat", "dog"])
    big = tmp_path / "imagenet" / "val" / "dog" / "huge.png"
    Image.new("RGB", (64, 64)).save(big)
    monkeypatch.setenv("EVALKIT_MAX_IMAGE_PIXELS", "1500")  # 4096 px > twice the limit
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after
    assert run(tmp_path, "--workers", "0") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "huge.png has more pixels than allowed" in err and "EVALKIT_MAX_IMAGE_PIXELS" in err


def test_square_resize_is_an_option_and_its_own_cache_entry(fake, ctx, tmp_path):
    from evalkit import get_task
    from evalkit.core.runner import run_task

    [shorter, _], _ = run_task(get_task("imagenet-linear"), fake, ctx, out_dir=tmp_path)
    [square, _], _ = run_task(
        get_task("imagenet-linear", ["resize=square"]), fake, ctx, out_dir=tmp_path
    )
    assert square["data_id"] != shorter["data_id"]  # another transform, other features
    assert square["provenance"]["images_extracted"] > 0


def check(*args):
    return main(["check-data", "--quiet", *args])


def test_check_data_reports_every_problem_and_exits_2(tmp_path, capsys):
    write_split(tmp_path, "train", ["cat", "dog", "fox"])
    write_split(tmp_path, "val", ["cat", "zebra"])
    for i in (1, 3):
        (tmp_path / "imagenet" / "train" / "dog" / f"{i}.png").write_bytes(b"not a png")
    assert check("--task", "imagenet-linear", "--data-dir", str(tmp_path)) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("unreadable image") == 2 and "dog/1.png" in out and "dog/3.png" in out
    assert "classes the training split lacks: zebra" in out
    assert "imagenet: 3 problem(s)" in out


def test_check_data_notes_a_missing_eval_class_without_failing(tmp_path, capsys):
    write_split(tmp_path, "train", ["cat", "dog", "fox"])
    write_split(tmp_path, "val", ["cat", "fox"])
    assert check("--task", "imagenet-5shot", "--data-dir", str(tmp_path)) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "val has no images of 1 training classes: dog" in out and "no problems" in out


def test_check_data_reads_every_dense_annotation(tmp_path, capsys):
    import numpy as np

    for split, folder in (("train", "training"), ("val", "validation")):
        for sub in ("images", "annotations"):
            (tmp_path / "ADEChallengeData2016" / sub / folder).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8)).save(
                tmp_path / "ADEChallengeData2016" / "images" / folder / f"{i}.jpg"
            )
            labels = np.full((8, 8), 200 if (split, i) == ("val", 1) else 3, np.uint8)
            if (split, i) != ("train", 2):
                Image.fromarray(labels).save(
                    tmp_path / "ADEChallengeData2016" / "annotations" / folder / f"{i}.png"
                )
    assert check("--task", "ade20k-1/16", "--data-dir", str(tmp_path)) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "missing annotation" in out and "2.png" in out
    assert "has label 200: ADE20k labels are 0..150" in out and "ade20k: 2 problem(s)" in out


def test_plan_prints_the_paper_scale_figures_without_running(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    assert main(["plan", "--task", "ade20k-1/16", "--backbone", "vit22b", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ade20k: train 20,210, val 2,000 (dataset card)" in out
    assert "backbone weights" in out and "fp32, tp=1" in out
    # ViT-22B grids of 1,264 + 2,000 images exceed the 8 GB cache budget: the head trains with
    # the backbone in the loop, 300 steps × 8 images + 2,000 val images through the backbone.
    assert "backbone in the loop" in out and "4,400" in out
    assert (
        main(["plan", "--task", "ade20k-1/16", "--backbone", "vit22b/ti", "--device", "cpu"]) == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "3,264" in out and "grids read per batch" in out  # ⌈20,210 / 16⌉ + 2,000, cached
    assert (
        main(
            [
                "plan",
                "--task",
                "imagenet-linear",
                "--backbone",
                "vit22b",
                "--device",
                "cpu",
                "--dtype",
                "bf16",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "1,331,167" in out and "streamed" in out and "15.2 GiB" in out  # bf16 cache
    assert "does not fit this machine" in out  # 41 GiB of bf16 weights in a CPU's RAM


def test_plan_counts_the_flops_of_each_stage(capsys, monkeypatch):
    from evalkit.heads.linear import path_flops
    from evalkit.models.vit22b import config
    from evalkit.parallel.sizing import forward_flops, human

    monkeypatch.setenv("COLUMNS", "200")
    per_image = forward_flops(config("b"))  # at its own 224 px
    args = ["plan", "--task", "imagenet-linear", "--backbone", "vit22b/b", "--device", "cpu"]
    assert main(args) == 0  # frozen: every train and val image through the backbone once
    out = " ".join(capsys.readouterr().out.split())
    probe = path_flops(1_281_167, config("b").width, 1000)  # the probe's passes over the rows
    assert f"compute: {human(1_331_167 * per_image + probe, 'FLOP')} in all" in out
    # fine-tuned at 448 px: 4× the tokens; 300 steps × 32 images, forward and backward (3×)
    assert main([*args, "--set", "finetune=true", "--set", "finetune_resolution=448"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    total = (3 * 300 * 32 + 50_000) * 4 * per_image
    assert "fine-tune backbone and head" in out and f"compute: {human(total, 'FLOP')} in all" in out


def test_plan_reads_sizes_from_the_data_when_it_is_there(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    write_split(tmp_path, "train", ["cat", "dog"])
    write_split(tmp_path, "val", ["cat", "dog"], per_class=2)
    code = main(
        [
            "plan",
            "--task",
            "imagenet-linear",
            "--backbone",
            "fake",
            "--data-dir",
            str(tmp_path),
            "--device",
            "cpu",
        ]
    )
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "imagenet: train 12, val 4 (data on disk)" in out and "resident" in out


def test_plan_does_not_time_the_passes_whose_features_are_cached(cli_env, capsys, monkeypatch):
    """After a run, its features are on disk: the plan of the same job says so and neither
    counts their forward passes nor their compute in the expected time."""
    monkeypatch.setenv("COLUMNS", "250")
    job = ["--task", "imagenet-linear", "--backbone", "fake", "--data", "embedded"]
    plan = ["plan", *job, "--device", "cpu", "--cache-dir", "c"]
    assert main(plan) == 0
    before = " ".join(capsys.readouterr().out.split())
    assert "extract features │ cached │ 1,344" in before
    assert main(["run", *job, "--device", "cpu", "--cache-dir", "c", "--quiet"]) == 0
    capsys.readouterr()
    assert main(plan) == 0
    after = " ".join(capsys.readouterr().out.split())
    assert "extract features │ cached (on disk) │ 0 │" in after, after
    total = lambda out: out.split("compute: ")[1].split(" in all")[0]  # noqa: E731
    assert total(after) != total(before)


@pytest.mark.parametrize(
    ("target", "mode"),
    [
        ("gpus=0,host_gb=1024", "streamed"),
        ("gpus=1,gpu_gb=40,host_gb=1024", "streamed"),
        ("gpus=1,gpu_gb=141,host_gb=1024", "resident"),
    ],
)
def test_the_probe_is_planned_resident_where_half_the_gpu_holds_it(
    target, mode, capsys, monkeypatch
):
    """ImageNet-1k's training features and their kept logits (~41 GiB) stay on a GPU whose
    half holds them; on a CPU (4 GiB) or a 40 GB GPU they stream."""
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["plan", "--task", "imagenet-linear", "--backbone", "fake", "--target", target])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and f"linear probe │ {mode}" in out


def test_a_run_that_does_not_fit_is_refused_unless_forced(cli_env, capsys, monkeypatch):

    from evalkit.core import budget

    tiny = budget.Budget(host=1000, device=None, disk=10**12)  # a machine with 1000 bytes of RAM
    monkeypatch.setattr(
        budget.Budget, "here", classmethod(lambda cls, device, cache, ranks=1: tiny)
    )
    args = [
        "run",
        "--task",
        "imagenet-linear",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--quiet",
    ]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "imagenet-linear on fake does not fit this machine" in err and "--force" in err
    tiny.problems.clear()
    assert main([*args, "--force"]) == 0
