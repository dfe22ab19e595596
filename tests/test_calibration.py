"""Calibration tasks end to end on the embedded stand-ins: the ImageNet-C layout and reader,
rows and their averaging, temperature scaling, the reliability diagram, fine-tuned mode."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from evalkit.errors import EvalkitError


@pytest.mark.long
def test_imagenet_c_stand_in_has_the_layout_and_a_clear_error(ctx):
    from evalkit.data.resolve import open_dataset

    fog = open_dataset("imagenet-c", "fog/3", ctx.data)
    assert len(fog) == 24 * 4 and len(fog.classes) == 24
    root = Path(fog.root).parents[1]
    assert {p.name for p in root.iterdir() if p.is_dir()} >= {"gaussian_noise", "jpeg_compression"}
    assert sorted(p.name for p in (root / "fog").iterdir()) == ["1", "2", "3", "4", "5"]
    with pytest.raises(
        EvalkitError, match="no ImageNet-C split 'smoke/3'.*<corruption>/<severity>"
    ):
        open_dataset("imagenet-c", "smoke/3", ctx.data)


def test_imagenet_c_ece_averages_corruptions_then_severities(fake, ctx, tmp_path):
    from evalkit.core.runner import resolve_task

    ctx.artifacts = tmp_path / "pictures"
    task = resolve_task("imagenet-c-ece", ["corruptions=fog,contrast", "severities=1,5"])
    rows = {m.metric: m for m in task.run(fake, ctx)}
    assert set(rows) == set(task.metrics())
    by_set = rows["ece/mean"].extra["ece_by_corruption"]
    assert set(by_set) == {"fog/1", "fog/5", "contrast/1", "contrast/5"}
    assert rows["ece/s5"].value == pytest.approx((by_set["fog/5"] + by_set["contrast/5"]) / 2)
    assert rows["ece/mean"].value == pytest.approx(
        statistics.mean([rows["ece/s1"].value, rows["ece/s5"].value])
    )
    assert rows["ece/s1"].n == 2 * 96 and rows["ece/clean"].n == 384
    assert rows["ece/s1"].higher_is_better is False and rows["top1/s1"].higher_is_better
    assert 0 <= rows["ece/clean"].value <= 1 and rows["ece/clean"].extra["temperature"] > 0
    assert Path(rows["ece/mean"].extra["picture"]).read_bytes()[:4] == b"\x89PNG"
    assert task.reference == {}  # the paper's ECE is of a fine-tuned classifier


def test_scores_with_the_temperature_are_the_metrics_of_the_scaled_logits():
    from evalkit.protocols.calibration import expected_calibration_error, negative_log_likelihood
    from evalkit.tasks.calibration import scores

    generator = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(500, 6, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 6, (500,), generator=generator)
    scaled = scores(logits, labels, 2.5, 15)
    assert scaled["ece_ts"] == pytest.approx(
        expected_calibration_error(torch.softmax(logits / 2.5, 1), labels)
    )
    assert scaled["nll_ts"] == pytest.approx(negative_log_likelihood(logits / 2.5, labels))
    assert scaled["ece_ts"] < scaled["ece"]  # confident random logits: cooling them helps
    plain = scores(logits, labels, 1.0, 15)
    assert plain["ece_ts"] == plain["ece"] and plain["nll_ts"] == plain["nll"]


def test_imagenet_ece_temperature_scaling_lowers_the_nll(fake, ctx, data_cache, tmp_path):
    """Also its per-image file: each image named by its path under the data root with its
    class's name and the answered class's, as the classification files name them."""
    import pandas as pd

    from evalkit.core.runner import resolve_task

    ctx.predictions = tmp_path / "ece.parquet"
    rows = {m.metric: m for m in resolve_task("imagenet-ece").run(fake, ctx)}
    assert rows["nll_ts"].value <= rows["nll"].value + 0.05  # fitted on held-out train images
    assert rows["ece"].extra["fit_images"] + rows["ece"].extra["held_out_images"] == 960
    frame = pd.read_parquet(ctx.predictions)
    (root,) = (Path(data_cache) / "embedded").glob("shapes-*")
    assert len(frame) == 384 and all((root / image).is_file() for image in frame["image"])
    assert frame["image"].str.startswith("val/").all()
    assert frame["label_name"].tolist() == [Path(i).parent.name for i in frame["image"]]
    assert (frame["correct"] == (frame["label_name"] == frame["prediction_name"])).all()


def test_finetuned_calibration_sets_the_paper_number_beside_it(ctx):
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    task = resolve_task(
        "imagenet-ece",
        ["finetune=true", "finetune_steps=2", "finetune_batch_size=8", "finetune_resolution=32"],
    )
    rows = {m.metric: m for m in task.run(load_backbone("vit22b/test"), ctx)}
    assert rows["ece"].extra["finetuned"] is True
    assert rows["ece"].extra["classifier"].startswith("fine-tuned")
    assert task.reference["ece"]["ViT-22B (fine-tuned, 384 px)"] == 0.01


def test_calibration_settings_are_checked():
    from evalkit.core.runner import resolve_task

    with pytest.raises(EvalkitError, match="corruptions=smoke"):
        resolve_task("imagenet-c-ece", ["corruptions=smoke"])
    with pytest.raises(EvalkitError, match="severities=6"):
        resolve_task("imagenet-c-ece", ["severities=6"])
