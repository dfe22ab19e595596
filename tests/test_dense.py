"""Dense tasks: metrics against hand-computed values, readers and their errors on the real
layouts, the scene stand-ins, subsets, heads, and the tasks end to end on tiny embedded data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from evalkit.backbones.base import Preprocess
from evalkit.data.dense_layouts import DEPTH, ADE20k, DepthFolder, SceneSet, write_scene_set
from evalkit.errors import EvalkitError
from evalkit.metrics import IGNORE, confusion_matrix, depth_errors, eval_crop, segmentation_scores


def test_miou_by_hand():
    target = np.array([[0, 0, 1], [1, 2, IGNORE]])
    pred = np.array([[0, 1, 1], [1, 0, 3]])
    confusion = confusion_matrix(pred, target, 5)
    # class 0: I=1, U=3 (gt 2 + pred 2 − 1); class 1: I=2, U=3; class 2: I=0, U=1;
    # class 3 predicted only on an ignored pixel: absent; class 4 absent everywhere.
    scores = segmentation_scores(confusion)
    assert scores["miou"] == pytest.approx(100 * (1 / 3 + 2 / 3 + 0) / 3)
    assert scores["pixel_acc"] == pytest.approx(100 * 3 / 5)
    assert scores["classes"] == 3


def test_a_class_only_predicted_counts_with_iou_zero():
    """ADE20k's mIoU averages over classes present in the ground truth or the prediction: a
    class the model predicts where it is absent lowers the mean (IoU 0)."""
    confusion = confusion_matrix(np.array([0, 0, 1]), np.array([0, 0, 0]), 3)
    assert segmentation_scores(confusion)["miou"] == pytest.approx(100 * (2 / 3 + 0) / 2)
    assert segmentation_scores(confusion)["classes"] == 2


def test_confusion_rows_are_the_ground_truth():
    confusion = confusion_matrix(np.array([2, 2]), np.array([0, 1]), 3)
    assert confusion[0, 2] == confusion[1, 2] == 1 and confusion.sum() == 2


def test_miou_sums_over_images_before_dividing():
    a = confusion_matrix(np.array([0, 0]), np.array([0, 1]), 2)
    b = confusion_matrix(np.array([1, 1, 1, 1]), np.array([1, 1, 1, 1]), 2)
    # dataset-wide: class 0 I=1 U=2; class 1 I=4 U=5 → (0.5 + 0.8) / 2
    assert segmentation_scores(a + b)["miou"] == pytest.approx(65.0)


def test_depth_errors_by_hand():
    gt = np.array([[2.0, 4.0], [1.0, 8.0]])
    pred = np.array([[2.0, 5.0], [2.0, 8.0]])
    valid = np.array([[True, True], [True, False]])
    errors = depth_errors(pred, gt, valid)
    assert errors["mse"] == pytest.approx((0 + 1 + 1) / 3)
    assert errors["rmse"] == pytest.approx(np.sqrt(2 / 3))
    assert errors["abs_rel"] == pytest.approx((0 + 0.25 + 1) / 3)
    assert errors["log10"] == pytest.approx((0 + np.log10(5 / 4) + np.log10(2)) / 3)
    assert errors["mse_log"] == pytest.approx((0 + np.log(5 / 4) ** 2 + np.log(2) ** 2) / 3)
    assert errors["delta1.1"] == pytest.approx(1 / 3)  # only the exact pixel is within 10%
    # ratios 1, 1.25, 2: δ<1.25 counts only the first (strict), δ<1.5625 the first two.
    assert (errors["delta1"], errors["delta2"], errors["delta3"]) == pytest.approx(
        (1 / 3, 2 / 3, 2 / 3)
    )
    assert depth_errors(pred, gt, np.zeros_like(valid)) is None


def test_delta_counts_under_and_over_prediction_alike():
    """δ uses max(pred / gt, gt / pred): predicting 1.2× too deep or 1.2× too shallow is the
    same ratio, inside 1.25; 1.3× either way is outside."""
    gt = np.full((1, 4), 10.0)
    pred = np.array([[12.0, 10.0 / 1.2, 13.0, 10.0 / 1.3]])
    errors = depth_errors(pred, gt, np.ones_like(gt, dtype=bool))
    assert errors["delta1"] == pytest.approx(2 / 4)
    assert errors["delta1.1"] == 0.0


def test_eval_crops():
    garg = eval_crop((375, 1242), "garg")
    rows, cols = np.nonzero(garg)
    assert (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) == (153, 371, 44, 1197)
    nyu = eval_crop((480, 640), "nyu")
    rows, cols = np.nonzero(nyu)
    assert (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) == (45, 471, 41, 601)


def test_scenes_are_deterministic_and_exact(tmp_path):
    from evalkit.data.scenes import scene

    a = scene("street", 0, "val", 3, (40, 60))
    b = scene("street", 0, "val", 3, (40, 60))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    image, labels, depth, valid = a
    assert image.shape == (40, 60, 3) and labels.shape == depth.shape == (40, 60)
    assert 0 < valid.mean() < 0.5  # sparse LiDAR
    assert not valid[labels == 6].any()  # no returns from the sky
    # A camera 1.6 m above flat ground: road depth at a row is 1.6·f / (row offset).
    _, _, flat, _ = scene("street", 0, "val", 3, (200, 300))
    assert flat[-1, 150] == pytest.approx(1.6 * 150 / np.tan(np.radians(40)) / 99.5, rel=0.02)


def tiny_ade(tmp_path, *, labels=None, size=(8, 8)):
    root = tmp_path / "ADEChallengeData2016"
    for sub in ("images", "annotations"):
        (root / sub / "training").mkdir(parents=True)
    Image.new("RGB", (size[1], size[0])).save(root / "images/training/a.jpg")
    labels = np.zeros((8, 8), np.uint8) if labels is None else labels
    Image.fromarray(labels).save(root / "annotations/training/a.png")
    return ADE20k(root, "train", 28, Preprocess())


def test_ade_reduce_zero_label(tmp_path):
    labels = np.zeros((8, 8), np.uint8)
    labels[0, :3] = [1, 150, 7]
    target = tiny_ade(tmp_path, labels=labels).target(0)
    assert target[0, :4].tolist() == [0, 149, 6, IGNORE]


def test_ade_bad_inputs(tmp_path):
    labels = np.full((8, 8), 151, np.uint8)
    with pytest.raises(EvalkitError, match="label 151: ADE20k labels are 0..150"):
        tiny_ade(tmp_path / "a", labels=labels).target(0)
    with pytest.raises(EvalkitError, match="is 8×8 but a.jpg is 9×8"):
        tiny_ade(tmp_path / "b", size=(8, 9)).target(0)
    dataset = tiny_ade(tmp_path / "c")
    (dataset.labels_dir / "a.png").unlink()
    with pytest.raises(EvalkitError, match="missing annotation"):
        dataset.target(0)
    with pytest.raises(EvalkitError, match=r"ADEChallengeData2016/images/\{training,validation\}"):
        ADE20k(tmp_path / "nowhere", "val", 28, Preprocess())


def tiny_depth(tmp_path, depth_png: Image.Image):
    base = tmp_path / "waymo_depth" / "training"
    for sub in ("image", "depth"):
        (base / sub).mkdir(parents=True)
    Image.new("RGB", (6, 4)).save(base / "image/000000.png")
    depth_png.save(base / "depth/000000.png")
    return DepthFolder(tmp_path / "waymo_depth", "train", 28, Preprocess(), DEPTH["waymo"])


def test_depth_png_scale_and_validity(tmp_path):
    raw = np.zeros((4, 6), np.uint16)
    raw[1, 2], raw[3, 5] = 256 * 10, 256 * 90  # 10 m; 90 m is beyond the 80 m cap
    depth, valid = tiny_depth(tmp_path, Image.fromarray(raw)).target(0)
    assert depth[1, 2] == 10.0 and valid.sum() == 1 and valid[1, 2]


def test_depth_png_wrong_bit_depth(tmp_path):
    dataset = tiny_depth(tmp_path, Image.fromarray(np.zeros((4, 6), np.uint8)))
    with pytest.raises(EvalkitError, match="mode L: expected 16-bit"):
        dataset.target(0)


def test_missing_depth_dataset_shows_layout(tmp_path):
    with pytest.raises(EvalkitError, match=r"waymo_depth/training/image/<id>"):
        DepthFolder(tmp_path, "train", 28, Preprocess(), DEPTH["waymo"])


def test_embedded_sets_use_the_real_layouts(tmp_path):
    ade = write_scene_set(SceneSet("ade20k", train=2, val=1), tmp_path)
    assert sorted(p.name for p in (ade / "annotations/validation").iterdir()) == [
        "ADE_val_00000000.png"
    ]
    dataset = ADE20k(ade, "train", 56, Preprocess())
    assert dataset[0][0].shape == (3, 56, 56) and dataset.target(1).shape == (192, 256)
    waymo = write_scene_set(SceneSet("waymo", train=1, val=1), tmp_path)
    with Image.open(waymo / "validation/depth/000000.png") as png:
        assert png.mode == "I;16"
    depth, valid = DepthFolder(waymo, "val", 56, Preprocess(), DEPTH["waymo"]).target(0)
    assert valid.any() and depth[valid].min() > 0 and depth[valid].max() < 80


def test_hashed_subsets_are_nested_and_seeded():
    from evalkit.protocols.grids import hashed_subset, tap_layers

    names = [f"img{i}.jpg" for i in range(160)]
    small, large = hashed_subset(names, 1 / 16, 0), hashed_subset(names, 1 / 8, 0)
    assert len(small) == 10 and len(large) == 20 and set(small) <= set(large)
    assert small == hashed_subset(names, 1 / 16, 0) != hashed_subset(names, 1 / 16, 1)
    assert hashed_subset(names, 1.0, 0) is None
    assert tap_layers(12) == (2, 5, 8, 11) and tap_layers(24) == (5, 11, 17, 23)


def test_sparse_resize_averages_returns():
    from evalkit.tasks.depth import silog_loss, sparse_resize

    depth = np.array([[2.0, 4.0, 0, 0], [0, 0, 0, 0]])
    valid = depth > 0
    mean, ok = sparse_resize(depth, valid, (1, 2))
    assert mean.tolist() == [[3.0, 0.0]] and ok.tolist() == [[True, False]]
    pred = torch.tensor([[2.0, 8.0]])
    gt, mask = torch.tensor([[2.0, 4.0]]), torch.tensor([[True, True]])
    g = torch.log(pred + 1e-3) - torch.log(gt + 1e-3)
    expected = torch.sqrt(g.var(unbiased=False) + 0.15 * g.mean() ** 2)
    assert silog_loss(pred, gt, mask) == pytest.approx(expected.item(), rel=1e-5)


def test_heads_output_shapes():
    from evalkit.heads.decoders import (
        DPTDepth,
        LinearDepth,
        LinearSegmentation,
        UperNetSegmentation,
    )

    grids = [torch.randn(2, 32, 4, 4) for _ in range(4)]
    assert LinearSegmentation([32] * 4, 150)(grids).shape == (2, 150, 4, 4)
    assert UperNetSegmentation([32] * 4, 150, 16)(grids).shape == (2, 150, 16, 16)
    depth = LinearDepth([32] * 4, min_depth=1.0, max_depth=5.0)(grids)
    assert depth.shape == (2, 1, 16, 16) and depth.min() >= 1.0 and depth.max() <= 5.0
    assert DPTDepth([32] * 4, max_depth=80.0, channels=16)(grids).shape == (2, 1, 64, 64)
    odd = [torch.randn(1, 32, 16, 16) for _ in range(4)]  # patch 14 at 224 px
    assert DPTDepth([32] * 4, max_depth=80.0, channels=16)(odd).shape == (1, 1, 256, 256)


@pytest.fixture()
def small_scenes(monkeypatch):
    monkeypatch.setenv("EVALKIT_EMBEDDED_SCENES", "24,6")


def run_cli(*args):
    from evalkit.cli import main

    return main(["run", *args, "--backbone", "vit22b/test", "--data", "embedded", "--quiet"])


def test_ade20k_alias_end_to_end_writes_rows_and_pictures(cli_env, small_scenes, capsys):
    assert run_cli("--task", "adek20k-1/4", "--set", "steps=4", "--set", "image_size=112") == 0
    assert "'adek20k-1/4' is an alias of 'ade20k-1/4'" in capsys.readouterr().out
    rows = [json.loads(line) for line in (cli_env / "results/runs/ade20k-1_4.jsonl").open()]
    assert {r["metric"] for r in rows} == {"miou", "pixel_acc"}
    assert rows[0]["extra"]["train_images"] == 6 and rows[0]["extra"]["val_images"] == 6
    assert rows[0]["task"] == "ade20k-1/4"
    with Image.open(rows[0]["extra"]["picture"]) as picture:
        assert picture.size[0] > 3 * 112


def test_depth_end_to_end_is_deterministic(cli_env, small_scenes):
    args = ("--task", "waymo-depth-dpt", "--set", "steps=4", "--set", "image_size=112")
    assert run_cli(*args) == 0
    assert run_cli(*args, "--force", "--out", "again") == 0
    first = [json.loads(line) for line in (cli_env / "results/runs/waymo-depth-dpt.jsonl").open()]
    second = [json.loads(line) for line in (cli_env / "again/waymo-depth-dpt.jsonl").open()]
    assert [r["value"] for r in first] == [r["value"] for r in second]
    assert {r["metric"]: r["higher_is_better"] for r in first}["mse"] is False
    assert first[0]["extra"]["skipped_no_valid_pixels"] == 0


def test_unknown_head_is_a_clear_error(cli_env, small_scenes):
    assert run_cli("--task", "nyu-depth-dpt", "--set", "head=upernet") == 2


def test_segmentation_over_the_cache_budget_trains_with_the_backbone_in_the_loop(
    cli_env, small_scenes
):
    common = ("--task", "ade20k-1/4", "--set", "steps=4", "--set", "image_size=64")
    assert run_cli(*common, "--set", "cache_budget_gb=0") == 0
    assert run_cli(*common) == 0
    rows = [json.loads(line) for line in (cli_env / "results/runs/ade20k-1_4.jsonl").open()]
    modes = {r["config"]["cache_budget_gb"]: r["extra"]["dense_mode"] for r in rows}
    assert modes == {0.0: "backbone in the loop", 8.0: "cached grids"}
    in_loop = next(r for r in rows if r["config"]["cache_budget_gb"] == 0.0)
    assert in_loop["extra"]["features_cached"] is False and 0 <= in_loop["value"] <= 100


def test_depth_over_the_cache_budget_and_its_per_image_predictions(cli_env, small_scenes):
    import pandas as pd

    args = (
        "--task",
        "waymo-depth-linear",
        "--set",
        "steps=4",
        "--set",
        "image_size=64",
        "--set",
        "cache_budget_gb=0",
        "--save-predictions",
    )
    assert run_cli(*args) == 0
    rows = [json.loads(line) for line in (cli_env / "results/runs/waymo-depth-linear.jsonl").open()]
    assert rows[0]["extra"]["dense_mode"] == "backbone in the loop"
    files = list((cli_env / "results/runs/predictions").glob("waymo-depth-linear--*.parquet"))
    frame = pd.read_parquet(files[0])
    mse = next(r["value"] for r in rows if r["metric"] == "mse")
    assert len(frame) == rows[0]["n"] and frame["mse"].mean() == pytest.approx(mse)


def test_window_starts_cover_the_image_with_the_last_flush():
    from evalkit.data.dense_layouts import window_starts

    assert window_starts(512, 512, 341) == [0]
    assert window_starts(683, 512, 341) == [0, 171]
    assert window_starts(1200, 512, 341) == [0, 341, 682, 688]


def test_sliding_windows_keep_the_aspect_and_stitch_by_averaging(tmp_path):
    from evalkit.data.dense_layouts import SlidingWindows
    from evalkit.tasks.segmentation import windowed

    Image.new("RGB", (150, 100), (200, 10, 10)).save(tmp_path / "wide.png")
    dataset = type(
        "Images",
        (),
        {
            "images": [tmp_path / "wide.png"],
            "mean": (0.5,) * 3,
            "std": (0.5,) * 3,
            "identity": lambda self: "x",
        },
    )()
    windows = SlidingWindows(dataset, crop=64, stride=40)
    assert windows.shapes == [(64, 96)] and [w[1:] for w in windows.of_image(0)] == [
        (0, 0),
        (0, 32),
    ]
    assert windows[1][0].shape == (3, 64, 64)
    logits = {0: torch.ones(1, 2, 16, 16), 1: 3 * torch.ones(1, 2, 16, 16)}
    stitched = windowed(windows, lambda ids: torch.cat([logits[k] for k in ids]))(0)
    assert stitched.shape == (1, 2, 64, 96)
    assert stitched[0, 0, 0, 0] == 1 and stitched[0, 0, 0, 95] == 3
    assert stitched[0, 0, 0, 40] == 2  # columns 32-63 are covered by both windows


def test_sliding_window_evaluation_in_every_mode(cli_env, small_scenes):
    common = (
        "--task",
        "ade20k-1/4",
        "--set",
        "steps=2",
        "--set",
        "image_size=64",
        "--set",
        "eval_mode=slide",
    )
    assert run_cli(*common) == 0
    assert run_cli(*common, "--set", "cache_budget_gb=0") == 0
    assert run_cli(*common, "--set", "finetune=true", "--set", "finetune_steps=2") == 0
    rows = [json.loads(line) for line in (cli_env / "results/runs/ade20k-1_4.jsonl").open()]
    miou = [r for r in rows if r["metric"] == "miou"]
    assert {r["extra"]["dense_mode"] for r in miou} == {
        "cached grids",
        "backbone in the loop",
        "fine-tuned",
    }
    assert all(r["extra"]["eval_mode"] == "slide" and r["extra"]["eval_stride"] == 42 for r in miou)


def test_mmseg_training_views_are_seeded_crops_with_labels_alike(tmp_path):
    from evalkit.data.dense_layouts import scale_crop_flip

    Image.new("RGB", (90, 60), (120, 130, 140)).save(tmp_path / "a.png")
    dataset = type(
        "Images", (), {"images": [tmp_path / "a.png"], "mean": (0.5,) * 3, "std": (0.5,) * 3}
    )()
    labels = np.zeros((60, 90), np.uint8)
    labels[:, 45:] = 7
    views = []
    for _ in range(2):
        torch.manual_seed(3)
        views.append(scale_crop_flip(dataset, 0, 64, labels))
    (image, crop), (again, crop_again) = views
    assert image.shape == (3, 64, 64) and crop.shape == (64, 64)
    assert torch.equal(image, again) and np.array_equal(crop, crop_again)  # seeded
    assert set(np.unique(crop)) <= {0, 7, 255}  # nearest resize; padding is ignored
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        seen |= set(np.unique(scale_crop_flip(dataset, 0, 64, labels)[1]).tolist())
    assert 255 in seen  # a short side scaled below the crop is padded with the ignore label


def test_mmseg_augmentation_in_the_loop_is_recorded(cli_env, small_scenes):
    args = (
        "--task",
        "ade20k-1/4",
        "--set",
        "steps=2",
        "--set",
        "image_size=64",
        "--set",
        "cache_budget_gb=0",
        "--set",
        "augment=mmseg",
    )
    assert run_cli(*args) == 0
    rows = [json.loads(line) for line in (cli_env / "results/runs/ade20k-1_4.jsonl").open()]
    assert rows[0]["extra"]["augment"] == "mmseg"


def test_frames_keep_their_aspect(tmp_path):
    from evalkit.data.dense_layouts import frame_size

    Image.new("RGB", (1920, 1280)).save(tmp_path / "waymo.png")
    Image.new("RGB", (480, 640)).save(tmp_path / "portrait.png")
    assert frame_size([tmp_path / "waymo.png"], 504, 28) == (504, 756)  # 3:2, 27 × 28
    assert frame_size([tmp_path / "portrait.png"], 224, 32) == (288, 224)


def test_depth_rows_record_the_unsquashed_input(cli_env, small_scenes):
    assert (
        run_cli("--task", "waymo-depth-linear", "--set", "steps=2", "--set", "image_size=56") == 0
    )
    row = json.loads((cli_env / "results/runs/waymo-depth-linear.jsonl").open().readline())
    height, width = row["extra"]["input_size"]
    assert height == 56 and width > height and width % 28 == 0
