"""``evalkit prepare waymo`` on a release written as Waymo ships it (``benchmarks/waymo_release``:
official column names and arrow types, real-size LiDARs and camera, the FRONT calibration of
the dataset's own camera-model test), in a scene whose depth is known at every pixel; then each
malformed input a real download can hold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from evalkit.cli import main

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def release(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # the release writer lives beside the benchmarks
    from benchmarks import waymo_release

    waymo_release.write_release(tmp_path / "v2", frames=2)
    return tmp_path / "v2", waymo_release


def prepare(source: Path, dest: Path, *extra: str) -> int:
    return main(
        ["prepare", "waymo", str(source), str(dest), "--splits", "training", "--quiet", *extra]
    )


def depth_png(dest: Path, frame: str = "seg-official_100_FRONT") -> np.ndarray:
    path = dest / "waymo_depth" / "training" / "depth" / f"{frame}.png"
    return np.asarray(Image.open(path)).astype(float) / 256


def test_every_written_pixel_is_the_scene_and_no_out_of_view_return_folds_in(release, tmp_path):
    """Every camera pixel sees the far patch (15 m from the camera centre); returns of the near
    patch lie beyond the field of view, where the distortion polynomial turns back: the
    dataset's camera model refuses them (radial factor outside [0.8, 1.2]), so none may land."""
    source, scene = release
    assert prepare(source, tmp_path / "out") == 0
    depth = depth_png(tmp_path / "out")
    valid = depth > 0
    assert valid.sum() > 20_000  # the TOP and FRONT LiDARs cover much of the image
    assert np.abs(depth[valid] - scene.FAR).max() <= 0.01  # within 1 cm, no near return
    rows = np.nonzero(valid)[0]
    assert rows.max() - rows.min() > 1000  # spread over the image, not one band
    mask = np.asarray(
        Image.open(tmp_path / "out/waymo_depth/training/mask/seg-official_100_FRONT.png")
    )
    assert ((mask > 0) == valid).all()
    provenance = json.loads((tmp_path / "out/waymo_depth/provenance.json").read_text())
    assert provenance["depth"] == "range" and provenance["skipped"] == {}


def test_forward_depth_is_the_range_times_the_cosine_off_axis(release, tmp_path):
    source, scene = release
    assert prepare(source, tmp_path / "fwd", "--depth", "forward") == 0
    forward = depth_png(tmp_path / "fwd")
    valid = forward > 0
    # forward = range · cos(angle off the optical axis) ∈ [FAR·cos(field of view), FAR]
    assert (forward[valid] <= scene.FAR + 0.01).all()
    assert (forward[valid] >= scene.FAR * math.cos(math.radians(35))).all()
    assert forward[valid].mean() < scene.FAR - 0.1  # off-axis pixels are nearer along the axis
    provenance = json.loads((tmp_path / "fwd/waymo_depth/provenance.json").read_text())
    assert provenance["depth"] == "forward"


def rewrite(source: Path, component: str, change):
    """Rewrites one component file through ``change(table) -> table``."""
    path = next((source / "training" / component).glob("*.parquet"))
    pq.write_table(change(pq.read_table(path)), path)


def rename(column: str, new: str):
    return lambda table: table.rename_columns(
        [new if c == column else c for c in table.column_names]
    )


@pytest.mark.parametrize("column", ["f_u", "k2"])
def test_a_missing_intrinsic_column_is_one_line_before_any_work(release, tmp_path, capsys, column):
    source, _ = release
    full = f"[CameraCalibrationComponent].intrinsic.{column}"
    rewrite(source, "camera_calibration", rename(full, full + "_renamed"))
    assert prepare(source, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"no column '{full}'" in err and "camera_calibration" in err
    assert not (tmp_path / "out" / "waymo_depth" / "training" / "depth").exists()


@pytest.mark.parametrize("names", [["FRONT", "FRONT"], ["1", "1"]])
def test_camera_and_laser_names_stored_as_strings_are_read(release, tmp_path, names):
    source, _ = release

    def as_strings(key, mapping):
        def change(table):
            values = [mapping.get(v, str(v)) for v in table.column(key).to_pylist()]
            index = table.column_names.index(key)
            return table.set_column(index, key, pa.array(values, pa.string()))

        return change

    camera = {1: names[0]}
    laser = {1: "TOP", 2: "FRONT"} if names[0] == "FRONT" else {}
    for component in ("camera_image", "camera_calibration"):
        rewrite(source, component, as_strings("key.camera_name", camera))
    for component in ("lidar", "lidar_calibration"):
        rewrite(source, component, as_strings("key.laser_name", laser))
    assert prepare(source, tmp_path / "out") == 0
    assert (depth_png(tmp_path / "out") > 0).sum() > 20_000


def test_a_truncated_jpeg_is_skipped_and_nothing_of_its_frame_is_written(release, tmp_path, capsys):
    source, _ = release

    def truncate_first(table):
        images = table.column("[CameraImageComponent].image").to_pylist()
        images[0] = images[0][: int(len(images[0]) * 0.6)]
        index = table.column_names.index("[CameraImageComponent].image")
        return table.set_column(
            index, "[CameraImageComponent].image", pa.array(images, pa.binary())
        )

    rewrite(source, "camera_image", truncate_first)
    assert prepare(source, tmp_path / "out") == 1  # skipped, and --allow-skips not given
    out = capsys.readouterr().out
    assert "does not decode whole" in out and "written: 1" in out
    written = sorted(
        p.name for p in (tmp_path / "out/waymo_depth/training").rglob("*.*") if p.is_file()
    )
    assert all("seg-official_200_FRONT" in name for name in written)
    assert prepare(source, tmp_path / "out", "--allow-skips") == 0


def test_a_null_range_image_leaves_that_laser_out_with_a_count(release, tmp_path, capsys):
    source, _ = release

    def null_top(table):
        lasers = table.column("key.laser_name").to_pylist()
        for part in ("values", "shape"):
            name = f"[LiDARComponent].range_image_return1.{part}"
            column = table.column(name).to_pylist()
            column = [
                None if laser == 1 else value for laser, value in zip(lasers, column, strict=True)
            ]
            index = table.column_names.index(name)
            table = table.set_column(
                index, table.schema.field(name), pa.array(column, table.schema.field(name).type)
            )
        return table

    rewrite(source, "lidar", null_top)
    assert prepare(source, tmp_path / "out", "--allow-skips") == 0
    out = capsys.readouterr().out
    assert "null range image (laser TOP)" in out and "written: 2" in out
    assert (depth_png(tmp_path / "out") > 0).sum() > 1000  # the FRONT LiDAR's returns remain


def test_an_empty_camera_image_file_is_skipped_with_its_reason(release, tmp_path, capsys):
    source, _ = release
    rewrite(source, "camera_image", lambda table: table.slice(0, 0))
    assert prepare(source, tmp_path / "out") == 1
    assert "camera_image file has no rows" in capsys.readouterr().out


def test_an_unreadable_segment_is_skipped_with_its_file_named(release, tmp_path, capsys):
    source, _ = release
    path = next((source / "training" / "lidar").glob("*.parquet"))
    path.write_bytes(b"not parquet")
    assert prepare(source, tmp_path / "out") == 1
    assert "unreadable parquet file lidar/seg-official.parquet" in capsys.readouterr().out


def test_any_v2_split_name_is_read(release, tmp_path):
    source, _ = release
    (source / "training").rename(source / "testing")
    code = main(
        ["prepare", "waymo", str(source), str(tmp_path / "out"), "--splits", "testing", "--quiet"]
    )
    assert code == 0
    assert len(list((tmp_path / "out/waymo_depth/testing/mask").glob("*.png"))) == 2


def test_the_nearest_return_wins_a_pixel_in_any_order():
    """Two returns into one pixel (an occlusion edge): the nearer depth is kept, whichever
    laser or row came first, within one laser's returns and across lasers."""
    from evalkit.data.prepare.waymo import StagedDepth

    staged = StagedDepth(height=2, width=3)
    staged.add(np.array([0, 0]), np.array([0, 0]), np.array([9.0, 4.0]), max_depth=80)
    staged.add(np.array([0]), np.array([0]), np.array([6.0]), max_depth=80)  # a farther laser
    staged.add(np.array([2]), np.array([1]), np.array([7.0]), max_depth=80)
    staged.add(np.array([2, 2]), np.array([1, 1]), np.array([3.0, 5.0]), max_depth=80)
    staged.add(np.array([1]), np.array([1]), np.array([90.0]), max_depth=80)  # beyond the cap
    assert staged.image().tolist() == [[4.0, 0.0, 0.0], [0.0, 0.0, 3.0]]


def test_a_point_outside_the_radial_window_never_lands_even_where_it_would_fit():
    """k1 = −0.5: at u = 0.77 the radial factor is 0.70, outside [0.8, 1.2], where the
    polynomial has turned back; distorted, the point would land at column 154 of a 200-px
    image. The camera model leaves it out; a point at u = 0.3 (factor 0.955) lands."""
    from evalkit.data.prepare.waymo import Camera

    camera = Camera(
        width=200,
        height=200,
        extrinsic=np.eye(4),
        intrinsic=(100.0, 100.0, 100.0, 100.0, -0.5, 0.0, 0.0, 0.0, 0.0),
    )
    points = np.array([[1.0, -0.77, 0.0], [1.0, -0.3, 0.0]])  # x forward, y left, z up
    cols, rows, depth = camera.project(points)
    assert cols.tolist() == [128] and rows.tolist() == [100]
    radial = 1 - 0.5 * 0.77**2
    assert 0 <= 100 * 0.77 * radial + 100 < 200 and radial < 0.8  # it would fit in the image
