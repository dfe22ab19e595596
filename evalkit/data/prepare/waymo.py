"""``evalkit prepare waymo``: Waymo Open v2 parquet components → the depth layout the
``waymo-depth-*`` tasks read (effect-table row 9; docs/data.md, "Waymo Open").

Per frame and camera: the camera's JPEG as shipped, and a sparse depth map made by writing each
LiDAR return's camera-frame depth (metres along the camera's forward axis) at the pixel it
projects to, nearest return winning; stored as uint16 metres × 256 with a validity mask.

Geometry follows the dataset's own conventions: a range image row's inclination from the
LiDAR's ``beam_inclination`` values (top row highest), else spread evenly between its
``beam_inclination.min`` and ``.max``; a column's azimuth from the image's right edge, corrected
by the LiDAR extrinsic's yaw; sensor → vehicle by the LiDAR extrinsic, vehicle → camera by the
inverse camera extrinsic (camera frame: x forward, y left, z up), then Waymo's pinhole model
with its radial (k1, k2, k3) and tangential (p1, p2) distortion. First returns only; the
per-pixel vehicle poses of the top LiDAR's rolling shutter are not applied (a return on a
moving car lands up to a few pixels off); returns beyond ``max_depth`` are dropped.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from evalkit.errors import EvalkitError

COMPONENTS = ("camera_image", "lidar", "lidar_calibration", "camera_calibration")
SPLITS = {"training": "training", "validation": "validation"}
CAMERAS = {1: "FRONT", 2: "FRONT_LEFT", 3: "FRONT_RIGHT", 4: "SIDE_LEFT", 5: "SIDE_RIGHT"}
SCALE = 256.0  # uint16 value = metres × 256, as KITTI's projected-LiDAR PNGs

SEGMENT, TIME = "key.segment_context_name", "key.frame_timestamp_micros"
CAMERA, LASER = "key.camera_name", "key.laser_name"
IMAGE = "[CameraImageComponent].image"
RANGE = "[LiDARComponent].range_image_return1"
LIDAR_CAL = "[LiDARCalibrationComponent]"
CAMERA_CAL = "[CameraCalibrationComponent]"


@dataclass(frozen=True)
class WaymoOptions:
    cameras: tuple[int, ...] = (1,)  # FRONT, as monocular depth evaluations use
    max_depth: float = 80.0
    splits: tuple[str, ...] = ("training", "validation")


# --- geometry ------------------------------------------------------------------------------


def inclinations(height: int, calibration: dict) -> np.ndarray:
    """Per range-image row, top first: the beam inclinations, or even steps in [min, max]."""
    values = calibration.get(f"{LIDAR_CAL}.beam_inclination.values")
    if values is not None and len(values):
        return np.asarray(values, dtype=np.float64)[::-1]
    low = calibration[f"{LIDAR_CAL}.beam_inclination.min"]
    high = calibration[f"{LIDAR_CAL}.beam_inclination.max"]
    return (low + (np.arange(height) + 0.5) / height * (high - low))[::-1]


def range_image_points(ranges: np.ndarray, calibration: dict) -> np.ndarray:
    """The vehicle-frame points (N, 3) of a range image's returns (range > 0)."""
    height, width = ranges.shape
    extrinsic = np.asarray(calibration[f"{LIDAR_CAL}.extrinsic.transform"], np.float64).reshape(
        4, 4
    )
    yaw = math.atan2(extrinsic[1, 0], extrinsic[0, 0])
    azimuth = ((width - np.arange(width) - 0.5) / width * 2 - 1) * math.pi - yaw
    rows, cols = np.nonzero(ranges > 0)
    r, incl, az = ranges[rows, cols], inclinations(height, calibration)[rows], azimuth[cols]
    sensor = np.stack([np.cos(az) * np.cos(incl), np.sin(az) * np.cos(incl), np.sin(incl)], 1)
    return (sensor * r[:, None]) @ extrinsic[:3, :3].T + extrinsic[:3, 3]


@dataclass(frozen=True)
class Camera:
    width: int
    height: int
    intrinsic: tuple[float, ...]  # f_u, f_v, c_u, c_v, k1, k2, p1, p2, k3
    extrinsic: np.ndarray  # camera → vehicle, 4 × 4

    @classmethod
    def from_row(cls, row: dict) -> Camera:
        names = ("f_u", "f_v", "c_u", "c_v", "k1", "k2", "p1", "p2", "k3")
        intrinsic = tuple(float(row.get(f"{CAMERA_CAL}.intrinsic.{n}") or 0.0) for n in names)
        extrinsic = np.asarray(row[f"{CAMERA_CAL}.extrinsic.transform"], np.float64).reshape(4, 4)
        return cls(
            int(row[f"{CAMERA_CAL}.width"]), int(row[f"{CAMERA_CAL}.height"]), intrinsic, extrinsic
        )

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(column, row, depth) of the vehicle-frame points in front of the camera and
        inside the image."""
        inverse = np.linalg.inv(self.extrinsic)
        local = points @ inverse[:3, :3].T + inverse[:3, 3]
        local = local[local[:, 0] > 1e-3]
        f_u, f_v, c_u, c_v, k1, k2, p1, p2, k3 = self.intrinsic
        u, v = -local[:, 1] / local[:, 0], -local[:, 2] / local[:, 0]
        r2 = u * u + v * v
        radial = 1 + k1 * r2 + k2 * r2**2 + k3 * r2**3
        ud = u * radial + 2 * p1 * u * v + p2 * (r2 + 2 * u * u)
        vd = v * radial + p1 * (r2 + 2 * v * v) + 2 * p2 * u * v
        col, row = np.floor(f_u * ud + c_u), np.floor(f_v * vd + c_v)
        inside = (col >= 0) & (col < self.width) & (row >= 0) & (row < self.height)
        return col[inside].astype(int), row[inside].astype(int), local[inside, 0]


def depth_map(camera: Camera, points: np.ndarray, max_depth: float) -> np.ndarray:
    """The sparse depth image (metres, 0 = no return): the nearest return in each pixel."""
    col, row, depth = camera.project(points)
    keep = depth <= max_depth
    col, row, depth = col[keep], row[keep], depth[keep]
    out = np.full((camera.height, camera.width), np.inf)
    np.minimum.at(out, (row, col), depth)
    out[np.isinf(out)] = 0.0
    return out


def encode_depth(depth: np.ndarray) -> np.ndarray:
    """uint16 metres × 256; a valid return never rounds to 0 (the no-return value)."""
    value = np.round(depth * SCALE)
    value[(depth > 0) & (value < 1)] = 1
    return np.clip(value, 0, 65535).astype(np.uint16)


# --- reading the components --------------------------------------------------------------


def segments(source: Path, split: str) -> list[str]:
    """The segment names of a split that has every component."""
    folder = source / split
    missing = [c for c in COMPONENTS if not (folder / c).is_dir()]
    if missing:
        raise EvalkitError(
            f"{folder} lacks the Waymo Open v2 components {', '.join(missing)} (expected "
            f"{folder}/<component>/<segment>.parquet for {', '.join(COMPONENTS)})"
        )
    return sorted(p.stem for p in (folder / "camera_image").glob("*.parquet"))


def read_component(source: Path, split: str, component: str, segment: str) -> list[dict]:
    import pyarrow.parquet as pq

    path = source / split / component / f"{segment}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{component} missing")
    return pq.read_table(path).to_pylist()


def segment_frames(source: Path, split: str, segment: str, options: WaymoOptions):
    """(frame id, camera row, camera, vehicle points) for each chosen camera of each frame."""
    lidar_cal = {
        row[LASER]: row for row in read_component(source, split, "lidar_calibration", segment)
    }
    cameras = {row[CAMERA]: Camera.from_row(row)
               for row in read_component(source, split, "camera_calibration", segment)}  # fmt: skip
    points: dict[int, list[np.ndarray]] = {}
    for row in read_component(source, split, "lidar", segment):
        shape = row[f"{RANGE}.shape"]
        ranges = np.asarray(row[f"{RANGE}.values"], np.float64).reshape(shape)[..., 0]
        points.setdefault(row[TIME], []).append(range_image_points(ranges, lidar_cal[row[LASER]]))
    for row in read_component(source, split, "camera_image", segment):
        if row[CAMERA] not in options.cameras:
            continue
        frame = f"{segment}_{row[TIME]}_{CAMERAS.get(row[CAMERA], row[CAMERA])}"
        cloud = points.get(row[TIME])
        yield frame, row, cameras.get(row[CAMERA]), np.concatenate(cloud) if cloud else None


# --- writing the layout ------------------------------------------------------------------


def prepare_waymo(source: Path, dest: Path, options: WaymoOptions, progress) -> dict:
    """Every chosen camera image of every frame into ``dest/waymo_depth/<split>/``; frames
    already written are kept (the run resumes). Returns what was written and skipped."""
    report = {"written": 0, "kept": 0, "skipped": {}, "options": asdict(options)}
    for split in options.splits:
        names = segments(Path(source), split)
        out = Path(dest) / "waymo_depth" / SPLITS[split]
        for name in ("image", "depth", "mask"):
            (out / name).mkdir(parents=True, exist_ok=True)
        for segment in progress(names, f"waymo {split}"):
            _prepare_segment(Path(source), split, segment, out, options, report)
    provenance = {k: v for k, v in report.items() if k != "kept"}
    provenance["cameras"] = [CAMERAS.get(c, c) for c in options.cameras]
    provenance["geometry"] = "first returns, calibration projection, no rolling-shutter poses"
    (Path(dest) / "waymo_depth" / "provenance.json").write_text(json.dumps(provenance, indent=1))
    return report


def _prepare_segment(source, split, segment, out: Path, options, report):
    def skip(why: str):
        report["skipped"][why] = report["skipped"].get(why, 0) + 1

    try:
        frames = list(segment_frames(source, split, segment, options))
    except (FileNotFoundError, KeyError, ValueError) as exc:
        return skip(f"segment unreadable ({exc.__class__.__name__}: {exc})")
    for frame, row, camera, cloud in frames:
        if (out / "mask" / f"{frame}.png").is_file():  # the mask is written last
            report["kept"] += 1
            continue
        if camera is None:
            skip("no camera calibration")
            continue
        if cloud is None:
            skip("no LiDAR frame at the camera's timestamp")
            continue
        depth = depth_map(camera, cloud, options.max_depth)
        if not (depth > 0).any():
            skip("no LiDAR return in the image")
            continue
        try:
            _write_frame(out, frame, row[IMAGE], depth)
        except OSError:  # PIL's errors for a corrupt JPEG are OSErrors
            skip("corrupt camera image")
            continue
        report["written"] += 1


def _write_frame(out: Path, frame: str, jpeg: bytes, depth: np.ndarray):
    Image.open(io.BytesIO(jpeg)).verify()  # a corrupt JPEG fails here, before anything is written
    (out / "image" / f"{frame}.jpg").write_bytes(jpeg)
    Image.fromarray(encode_depth(depth)).save(out / "depth" / f"{frame}.png")
    Image.fromarray(((depth > 0) * 255).astype(np.uint8)).save(out / "mask" / f"{frame}.png")
