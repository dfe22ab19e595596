"""Which pixels the depth task scores, at the task's own level: the validity mask *and* the
evaluation crop (a pixel without ground truth inside the crop, or with ground truth outside it,
is never scored), checked against metrics computed by hand; and which depth convention it
scores (data prepared as range and scored as forward depth, or back, is refused)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from evalkit.core.runner import resolve_task
from evalkit.data.dense_layouts import DEPTH, DepthFolder
from evalkit.errors import EvalkitError

PLAIN = SimpleNamespace(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
H, W = 100, 200
PREDICTED = 8.0


def write_depth_set(root, name: str, depths: list[np.ndarray]):
    spec = DEPTH[name]
    for split in spec.splits:
        for sub in ("image", "depth"):
            (root / split / sub).mkdir(parents=True, exist_ok=True)
        for i, depth in enumerate(depths):
            Image.fromarray(np.full((H, W, 3), 120, np.uint8)).save(
                root / split / "image" / f"{i}.png"
            )
            encoded = np.round(depth * spec.scale).astype(np.uint16)
            Image.fromarray(encoded).save(root / split / "depth" / f"{i}.png")
    return root


def ground_truth_with_holes(seed: int) -> np.ndarray:
    """Depths in (5, 30) m; holes (no return) inside the crop; returns outside it too."""
    rng = np.random.default_rng(seed)
    depth = rng.uniform(5, 30, (H, W))
    depth[50:70, 40:120] = 0.0  # a hole inside the Garg crop
    depth[rng.random((H, W)) < 0.3] = 0.0  # sparse, as projected LiDAR is
    return depth


def by_hand(depth: np.ndarray) -> dict[str, float]:
    """mse and abs_rel over the pixels with ground truth inside KITTI's Garg crop, for a
    constant prediction: rows [0.40810811 H, 0.99189189 H), cols [0.03594771 W, 0.96405229 W)."""
    rows = slice(int(0.40810811 * H), int(0.99189189 * H))
    cols = slice(int(0.03594771 * W), int(0.96405229 * W))
    inside = depth[rows, cols]
    scored = inside[inside > 1e-3]
    return {
        "mse": float(np.mean((scored - PREDICTED) ** 2)),
        "abs_rel": float(np.mean(np.abs(scored - PREDICTED) / scored)),
    }


def test_kitti_scores_pixels_with_ground_truth_inside_the_crop_only(tmp_path):
    depths = [ground_truth_with_holes(seed) for seed in (0, 1)]
    root = write_depth_set(tmp_path / "kitti_depth", "kitti", depths)
    dataset = DepthFolder(root, "val", (H, W), PLAIN, DEPTH["kitti"])
    task = resolve_task("kitti-depth-linear")
    per_image, _ = task.evaluate(lambda i: torch.full((1, 1, H // 4, W // 4), PREDICTED), dataset)
    assert [i for i, _ in per_image] == [0, 1]
    for (_, errors), depth in zip(per_image, depths, strict=True):
        quantised = np.round(depth * 256) / 256  # as the PNG stores it
        expected = by_hand(quantised)
        assert errors["mse"] == pytest.approx(expected["mse"], rel=1e-6)
        assert errors["abs_rel"] == pytest.approx(expected["abs_rel"], rel=1e-6)


def waymo_set(tmp_path, convention: str | None):
    root = write_depth_set(tmp_path / "waymo_depth", "waymo", [ground_truth_with_holes(0)])
    if convention:
        (root / "provenance.json").write_text(json.dumps({"depth": convention}))
    return DepthFolder(root, "train", (H, W), PLAIN, DEPTH["waymo"])


def test_waymo_prepared_as_forward_depth_is_refused_by_a_range_run(tmp_path):
    dataset = waymo_set(tmp_path, "forward")
    with pytest.raises(EvalkitError, match="prepared as 'forward'.*depth_convention=forward"):
        resolve_task("waymo-depth-linear").check_convention(dataset)
    chosen = resolve_task("waymo-depth-linear", ["depth_convention=forward"])
    assert chosen.check_convention(dataset) == "forward"
    assert chosen.config() != resolve_task("waymo-depth-linear").config()  # rows never shared


def test_the_convention_scored_is_named_in_the_row(tmp_path):
    assert (
        resolve_task("waymo-depth-linear").check_convention(waymo_set(tmp_path, "range")) == "range"
    )
    unrecorded = waymo_set(tmp_path / "bare", None)
    assert (
        resolve_task("waymo-depth-linear").check_convention(unrecorded).startswith("range (assumed")
    )
