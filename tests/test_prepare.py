"""``evalkit prepare``: official dataset files → evalkit's layouts. Waymo Open v2 parquet
components (official column names) of a scene whose depths are known analytically; ImageNet's
flat validation folder with the devkit's or Kaggle's labels, and per-class training tars; the
ImageNet-C sets of a validation folder, the same bytes whatever the worker count, resumed."""

from __future__ import annotations

import io
import json
import math
import tarfile

import numpy as np
import pytest
from PIL import Image

from evalkit.cli import main

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# --- Waymo Open v2 --------------------------------------------------------------------------

WALL_X, CAMERA_X = 12.0, 1.5  # a wall 12 m ahead of the vehicle; the camera 1.5 m forward
H, W = 16, 64
INCLINATIONS = np.linspace(-0.3, 0.05, H)  # as stored: lowest beam first
LIDAR_YAW, LIDAR_AT = 0.3, (0.5, 0.2, 2.0)


def wall_ranges() -> np.ndarray:
    """Each beam's range to the wall, from the layout's own conventions: row 0 the highest
    beam; column j looks along vehicle azimuth (2 (W - j - 0.5) / W - 1) π."""
    ranges = np.zeros((H, W))
    for i, incl in enumerate(INCLINATIONS[::-1]):
        for j in range(W):
            phi = (2 * (W - j - 0.5) / W - 1) * math.pi
            forward = math.cos(phi) * math.cos(incl)
            if forward > 0.05:
                ranges[i, j] = (WALL_X - LIDAR_AT[0]) / forward
    return ranges


def transform(yaw: float, at) -> list[float]:
    c, s = math.cos(yaw), math.sin(yaw)
    return [c, -s, 0, at[0], s, c, 0, at[1], 0, 0, 1, at[2], 0, 0, 0, 1]


def write_component(root, component: str, rows: list[dict]):
    folder = root / "training" / component
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "seg1.parquet")


def jpeg(width=96, height=64) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


def waymo_scene(root):
    key = {"key.segment_context_name": "seg1"}
    values = np.concatenate([wall_ranges()[..., None], np.zeros((H, W, 3))], -1)
    write_component(
        root,
        "lidar",
        [
            {
                **key,
                "key.frame_timestamp_micros": t,
                "key.laser_name": 1,
                "[LiDARComponent].range_image_return1.values": values.ravel().tolist(),
                "[LiDARComponent].range_image_return1.shape": [H, W, 4],
            }
            for t in (100, 200)
        ],
    )
    write_component(
        root,
        "lidar_calibration",
        [
            {
                **key,
                "key.laser_name": 1,
                "[LiDARCalibrationComponent].extrinsic.transform": transform(LIDAR_YAW, LIDAR_AT),
                "[LiDARCalibrationComponent].beam_inclination.values": INCLINATIONS.tolist(),
                "[LiDARCalibrationComponent].beam_inclination.min": -0.3,
                "[LiDARCalibrationComponent].beam_inclination.max": 0.05,
            }
        ],
    )
    calibration = {
        "[CameraCalibrationComponent].intrinsic.f_u": 60.0,
        "[CameraCalibrationComponent].intrinsic.f_v": 60.0,
        "[CameraCalibrationComponent].intrinsic.c_u": 48.0,
        "[CameraCalibrationComponent].intrinsic.c_v": 32.0,
        **{
            f"[CameraCalibrationComponent].intrinsic.{k}": 0.0
            for k in ("k1", "k2", "p1", "p2", "k3")
        },
        "[CameraCalibrationComponent].extrinsic.transform": transform(0.0, (CAMERA_X, 0.0, 1.8)),
        "[CameraCalibrationComponent].width": 96,
        "[CameraCalibrationComponent].height": 64,
    }
    write_component(
        root, "camera_calibration", [{**key, "key.camera_name": c, **calibration} for c in (1, 4)]
    )
    write_component(
        root,
        "camera_image",
        [
            {
                **key,
                "key.frame_timestamp_micros": t,
                "key.camera_name": c,
                "[CameraImageComponent].image": jpeg(),
            }
            for t in (100, 200, 300)
            for c in (1, 4)
        ],
    )  # t=300 has no LiDAR frame


def test_waymo_depths_equal_the_analytic_scene(tmp_path, capsys):
    waymo_scene(tmp_path / "v2")
    argv = [
        "prepare",
        "waymo",
        str(tmp_path / "v2"),
        str(tmp_path / "data"),
        "--splits",
        "training",
        "--quiet",
        "--depth",
        "forward",  # the wall's depth along the camera's axis is the analytic value
        "--allow-skips",  # t=300 has no LiDAR frame
    ]
    assert main(argv) == 0
    out = tmp_path / "data" / "waymo_depth" / "training"
    written = sorted(p.stem for p in (out / "depth").glob("*.png"))
    assert written == ["seg1_100_FRONT", "seg1_200_FRONT"]  # FRONT only; t=300 has no LiDAR
    depth = np.asarray(Image.open(out / "depth" / "seg1_100_FRONT.png")).astype(float) / 256
    mask = np.asarray(Image.open(out / "mask" / "seg1_100_FRONT.png")) > 0
    assert mask.sum() > 30 and ((depth > 0) == mask).all()
    assert np.abs(depth[mask] - (WALL_X - CAMERA_X)).max() <= 1 / 256 / 2
    report = capsys.readouterr().out
    assert "written: 2" in report and "no LiDAR frame at the camera's timestamp" in report
    provenance = json.loads((tmp_path / "data" / "waymo_depth" / "provenance.json").read_text())
    assert provenance["cameras"] == ["FRONT"] and provenance["options"]["max_depth"] == 80.0
    assert main(argv) == 0 and "kept: 2" in capsys.readouterr().out  # resumed: nothing redone


def test_waymo_depth_beyond_the_cap_is_dropped(tmp_path, capsys):
    waymo_scene(tmp_path / "v2")
    argv = [
        "prepare",
        "waymo",
        str(tmp_path / "v2"),
        str(tmp_path / "data"),
        "--splits",
        "training",
        "--quiet",
        "--max-depth",
        "10",
    ]
    assert main(argv) == 1  # frames were skipped and --allow-skips was not given
    out = capsys.readouterr().out
    assert "no LiDAR return in the image" in out and "pass --allow-skips" in out


def test_waymo_missing_components_are_one_line(tmp_path, capsys):
    (tmp_path / "v2" / "training" / "camera_image").mkdir(parents=True)
    assert (
        main(
            ["prepare", "waymo", str(tmp_path / "v2"), str(tmp_path / "d"), "--splits", "training"]
        )
        == 2
    )
    assert "lacks the Waymo Open v2 components lidar" in capsys.readouterr().err


# --- ImageNet -------------------------------------------------------------------------------

WNIDS = ("n01440764", "n01443537", "n01484850")


def source_images(n_per_class=4):
    rng = np.random.default_rng(1)
    for label in range(len(WNIDS)):
        for i in range(n_per_class):
            pixels = np.clip(rng.normal(60 + 70 * label, 20, (48, 48, 3)), 0, 255).astype(np.uint8)
            yield label, i, Image.fromarray(pixels)


def official_imagenet(root, *, labels: str):
    """A flat val with its labels as the devkit (or Kaggle) ships them, and per-class train tars."""
    from scipy.io import savemat

    (root / "ILSVRC2012_img_val").mkdir(parents=True)
    truth = []
    for number, (label, _, image) in enumerate(source_images(), start=1):
        image.save(root / "ILSVRC2012_img_val" / f"ILSVRC2012_val_{number:08d}.JPEG", format="JPEG")
        truth.append(label)
    if labels == "devkit":
        data = root / "ILSVRC2012_devkit_t12" / "data"
        data.mkdir(parents=True)
        ids = {0: 3, 1: 1, 2: 2}  # ILSVRC2012 ids are not folder order
        (data / "ILSVRC2012_validation_ground_truth.txt").write_text(
            "".join(f"{ids[t]}\n" for t in truth)
        )
        synsets = np.array(
            [(ids[k], WNIDS[k], "words", 0) for k in range(3)] + [(1001, "n00001740", "entity", 3)],
            dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")],
        )
        savemat(data / "meta.mat", {"synsets": synsets})
    else:
        rows = [
            f"ILSVRC2012_val_{n:08d},{WNIDS[t]} 1 2 30 40" for n, t in enumerate(truth, start=1)
        ]
        (root / "LOC_val_solution.csv").write_text(
            "ImageId,PredictionString\n" + "\n".join(rows) + "\n"
        )
    (root / "ILSVRC2012_img_train").mkdir()
    for label, wnid in enumerate(WNIDS):
        with tarfile.open(root / "ILSVRC2012_img_train" / f"{wnid}.tar", "w") as tar:
            for l2, i, image in source_images(6):
                if l2 == label:
                    buffer = io.BytesIO()
                    image.save(buffer, format="JPEG")
                    info = tarfile.TarInfo(f"{wnid}_{i}.JPEG")
                    info.size = buffer.tell()
                    buffer.seek(0)
                    tar.addfile(info, buffer)


def class_folders(root):
    """The same images, laid out by hand the way the tasks read them."""
    for number, (label, _, image) in enumerate(source_images(), start=1):
        folder = root / "imagenet" / "val" / WNIDS[label]
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"ILSVRC2012_val_{number:08d}.JPEG", format="JPEG")
    for label2, i, image in source_images(6):
        folder = root / "imagenet" / "train" / WNIDS[label2]
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{WNIDS[label2]}_{i}.JPEG", format="JPEG")


def knn_top1(data_root, tmp_path, name) -> float:
    out = tmp_path / f"rows-{name}"
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--data-dir",
        str(data_root),
        "--quiet",
        "--out",
        str(out),
        "--set",
        "ks=3",
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for f in out.rglob("*.jsonl") for line in f.open()]
    return next(r["value"] for r in rows if r["metric"].startswith("top1"))


@pytest.mark.parametrize("labels", ["devkit", "kaggle"])
def test_official_imagenet_scores_like_the_same_images_in_class_folders(tmp_path, cli_env, labels):
    official_imagenet(tmp_path / "official", labels=labels)
    assert (
        main(
            [
                "prepare",
                "imagenet",
                str(tmp_path / "official"),
                str(tmp_path / "prepared"),
                "--quiet",
            ]
        )
        == 0
    )
    val = tmp_path / "prepared" / "imagenet" / "val"
    assert sorted(p.name for p in val.iterdir()) == list(WNIDS)
    assert all(p.is_symlink() for p in val.rglob("*.JPEG"))  # linked, not copied
    assert len(list((tmp_path / "prepared" / "imagenet" / "train").rglob("*.JPEG"))) == 18
    class_folders(tmp_path / "by_hand")
    assert knn_top1(tmp_path / "prepared", tmp_path, "a") == knn_top1(
        tmp_path / "by_hand", tmp_path, "b"
    )


def test_a_val_without_labels_is_one_line(tmp_path, capsys):
    (tmp_path / "o" / "ILSVRC2012_img_val").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(
        tmp_path / "o" / "ILSVRC2012_img_val" / "ILSVRC2012_val_00000001.JPEG", format="JPEG"
    )
    assert main(["prepare", "imagenet", str(tmp_path / "o"), str(tmp_path / "p")]) == 2
    assert "LOC_val_solution.csv" in capsys.readouterr().err


# --- ImageNet-C -----------------------------------------------------------------------------


def test_imagenet_c_sets_are_the_same_bytes_for_any_worker_count_and_resume(tmp_path, capsys):
    clean = tmp_path / "val"
    for label, i, image in source_images(1):
        (clean / WNIDS[label]).mkdir(parents=True, exist_ok=True)
        image.resize((300, 260)).save(clean / WNIDS[label] / f"img{i}.JPEG", format="JPEG")
    base = [
        "prepare",
        "imagenet-c",
        "--from",
        str(clean),
        "--corruptions",
        "fog,gaussian_noise",
        "--quiet",
    ]
    assert main([*base, str(tmp_path / "one"), "--workers", "1"]) == 0
    assert main([*base, str(tmp_path / "two"), "--workers", "2"]) == 0
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.JPEG"))
    assert (
        len(files) == 3 * 2 * 5 and str(files[0]).count("/") == 3
    )  # <corruption>/<sev>/<wnid>/<img>
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()
    assert Image.open(tmp_path / "one" / files[0]).size == (224, 224)
    capsys.readouterr()
    assert main([*base, str(tmp_path / "one"), "--workers", "1"]) == 0
    assert "written: 0" in capsys.readouterr().out
    provenance = json.loads((tmp_path / "one" / "provenance.json").read_text())
    assert provenance["seed"] == 0 and provenance["corruptions"] == ["fog", "gaussian_noise"]


# --- ImageNet: what real downloads hold ------------------------------------------------------


def prepare_imagenet_cli(source, dest, *extra) -> int:
    return main(["prepare", "imagenet", str(source), str(dest), "--quiet", *extra])


def devkit_data(root):
    return root / "ILSVRC2012_devkit_t12" / "data"


def shift_ground_truth(root, change):
    path = devkit_data(root) / "ILSVRC2012_validation_ground_truth.txt"
    lines = path.read_text().split()
    path.write_text("".join(f"{change(int(v))}\n" for v in lines))


def garbage_meta(root):
    (devkit_data(root) / "meta.mat").write_bytes(b"MATLAB 5.0 garbage, not a mat file")


def fieldless_meta(root):
    from scipy.io import savemat

    savemat(devkit_data(root) / "meta.mat", {"other": np.zeros(3)})


def kaggle_rows(root, change):
    path = root / "LOC_val_solution.csv"
    path.write_text(change(path.read_text()))


MALFORMED = {
    "non-leaf synset id": (
        "devkit",
        lambda r: shift_ground_truth(r, lambda v: 1001),
        "'1001' is not the id",
    ),
    "0-based ids": ("devkit", lambda r: shift_ground_truth(r, lambda v: v - 1), "ids are 1-based"),
    "garbage meta.mat": ("devkit", garbage_meta, "is not the devkit's meta.mat"),
    "meta.mat without synsets": ("devkit", fieldless_meta, "is not the devkit's meta.mat"),
    "empty PredictionString": (
        "kaggle",
        lambda r: kaggle_rows(r, lambda t: t.replace(",n01443537 1 2 30 40", ",", 1)),
        "line ",
    ),
    "wrong CSV header": (
        "kaggle",
        lambda r: kaggle_rows(r, lambda t: t.replace("ImageId,", "Image,", 1)),
        "expected the header",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_imagenet_labels_file_is_one_line_naming_it(tmp_path, capsys, case):
    labels, damage, message = MALFORMED[case]
    official_imagenet(tmp_path / "o", labels=labels)
    damage(tmp_path / "o")
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and ("meta.mat" in err or ".txt" in err or ".csv" in err)
    assert "Traceback" not in err


def test_lower_case_jpeg_names_are_val_images_too(tmp_path, capsys):
    official_imagenet(tmp_path / "o", labels="kaggle")
    for path in (tmp_path / "o" / "ILSVRC2012_img_val").iterdir():
        path.rename(path.with_suffix(".jpeg"))
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p") == 0
    assert "val: 12" in capsys.readouterr().out


def test_the_shipped_outer_train_archive_is_read(tmp_path, capsys):
    official_imagenet(tmp_path / "o", labels="kaggle")
    folder = tmp_path / "o" / "ILSVRC2012_img_train"
    with tarfile.open(tmp_path / "o" / "ILSVRC2012_img_train.tar", "w") as outer:
        for archive in sorted(folder.glob("*.tar")):
            outer.add(archive, arcname=archive.name)
    for archive in folder.glob("*.tar"):
        archive.unlink()
    folder.rmdir()
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p") == 0
    assert "train: 18" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "p/imagenet/train").iterdir()) == list(WNIDS)


def test_kaggles_train_folders_are_read_and_no_train_at_all_is_one_line(tmp_path, capsys):
    official_imagenet(tmp_path / "o", labels="kaggle")
    kaggle = tmp_path / "o" / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    for archive in sorted((tmp_path / "o" / "ILSVRC2012_img_train").glob("*.tar")):
        (kaggle / archive.stem).mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(kaggle / archive.stem, filter="data")
        archive.unlink()
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p") == 0
    assert "train: 18" in capsys.readouterr().out
    for folder in kaggle.iterdir():
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "q") == 2
    assert "no training images" in capsys.readouterr().err
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "q", "--val-only") == 0


def test_a_copy_rerun_replaces_the_links_and_the_counts_say_so(tmp_path, capsys):
    official_imagenet(tmp_path / "o", labels="kaggle")
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p", "--val-only") == 0
    assert "val_written: 12" in capsys.readouterr().out
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p", "--val-only") == 0
    assert "val_kept: 12" in capsys.readouterr().out
    assert prepare_imagenet_cli(tmp_path / "o", tmp_path / "p", "--val-only", "--copy") == 0
    assert "val_written: 12" in capsys.readouterr().out
    images = list((tmp_path / "p" / "imagenet" / "val").rglob("*.JPEG"))
    assert len(images) == 12 and not any(p.is_symlink() for p in images)


def _clean_val(folder, per_class=1, size=(300, 260)):
    for label, i, image in source_images(per_class):
        (folder / WNIDS[label]).mkdir(parents=True, exist_ok=True)
        image.resize(size).save(folder / WNIDS[label] / f"img{i}.JPEG", format="JPEG")
    return folder


def _ended_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_imagenet_c_sweeps_what_killed_writers_left_and_counts_what_is_on_disk(tmp_path):
    """Temporaries of a dead writer (this version's and an earlier one's ``.partial``) are
    removed by the next run; provenance.json counts every output on disk after a resume."""
    clean = _clean_val(tmp_path / "val")
    base = ["prepare", "imagenet-c", "--from", str(clean), "--corruptions", "fog", "--quiet"]
    dest = tmp_path / "c"
    assert main([*base, str(dest), "--workers", "1"]) == 0
    finished = sorted(dest.rglob("*.JPEG"))
    for path in finished[::2]:  # as if the run had been killed half-way
        path.unlink()
    folder, dead = finished[0].parent, _ended_pid()
    stale = [folder / f".{finished[0].name}.{dead}.partial", folder / f".x.JPEG.tmp-{dead}"]
    for path in stale:
        path.write_bytes(b"half a JPEG")
    assert main([*base, str(dest), "--workers", "1"]) == 0
    assert not any(path.exists() for path in stale)
    assert sorted(dest.rglob("*.JPEG")) == finished
    provenance = json.loads((dest / "provenance.json").read_text())
    assert provenance["outputs"] == len(finished) == 3 * 5 and provenance["images"] == 3


def _children(pid: int) -> list[int]:
    from pathlib import Path

    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            found.append(int(status.parent.name))
    return found


def test_imagenet_c_workers_end_when_the_command_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    clean = _clean_val(tmp_path / "val", per_class=4)
    command = [
        sys.executable,
        "-m",
        "evalkit",
        "prepare",
        "imagenet-c",
        "--from",
        str(clean),
        str(tmp_path / "c"),
        "--workers",
        "2",
        "--quiet",
    ]
    main_process = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while len(workers := _children(main_process.pid)) < 2 and time.monotonic() < deadline:
        assert main_process.poll() is None, "the run ended before its workers started"
        time.sleep(0.2)
    assert len(workers) >= 2
    main_process.send_signal(signal.SIGKILL)
    main_process.wait()
    deadline = time.monotonic() + 20
    while (left := [p for p in workers if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"workers {left} outlived the killed command"


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever adopted it to reap it."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
