"""``evalkit prepare waymo``: Waymo Open v2 parquet components → the depth layout the
``waymo-depth-*`` tasks read (effect-table row 9; docs/data.md, "Waymo Open").

Per frame and camera: the camera's JPEG as shipped, and a sparse depth map made by writing each
LiDAR return's depth at the pixel it projects to, nearest return winning; stored as uint16
metres × 256 with a validity mask. Depth is, by default, the Euclidean distance from the camera
centre (``range``, the convention of the dataset's own depth tools); ``forward`` stores the
distance along the camera's forward axis instead (KITTI's convention). The choice is recorded
in ``provenance.json`` and the depth task refuses data prepared with another convention than
its setting.

Geometry follows the dataset's own conventions: a range image row's inclination from the
LiDAR's ``beam_inclination`` values (top row highest), else spread evenly between its
``beam_inclination.min`` and ``.max``; a column's azimuth from the image's right edge, corrected
by the LiDAR extrinsic's yaw; sensor → vehicle by the LiDAR extrinsic, vehicle → camera by the
inverse camera extrinsic (camera frame: x forward, y left, z up), then the dataset's camera
model: a point at x ≤ 0 is behind the camera, and one whose radial distortion factor
1 + k1 r² + k2 r⁴ + k3 r⁶ leaves [0.8, 1.2] is outside the field of view (the polynomial turns
back there and would fold it into the image); the rest get the radial and tangential (p1, p2)
distortion and must land in [0, width) × [0, height). First returns only; the cameras' rolling
shutter and the top LiDAR's per-pixel poses are not applied (docs/data.md states the size).

Memory is bounded per frame whatever a segment's length: the LiDAR component is streamed a few
rows at a time (only the columns a frame needs), each laser's returns are projected at once,
and a frame's staged depth map is written to disk as soon as all its lasers are in.
"""

from __future__ import annotations

import io
import math
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from evalkit.errors import EvalkitError
from evalkit.storage.identity import write_json
from evalkit.storage.writes import replacing, sweep_stale

COMPONENTS = ("camera_image", "lidar", "lidar_calibration", "camera_calibration")
CAMERAS = {1: "FRONT", 2: "FRONT_LEFT", 3: "FRONT_RIGHT", 4: "SIDE_LEFT", 5: "SIDE_RIGHT"}
LASERS = {1: "TOP", 2: "FRONT", 3: "SIDE_LEFT", 4: "SIDE_RIGHT", 5: "REAR"}
SCALE = 256.0  # uint16 value = metres × 256, as KITTI's projected-LiDAR PNGs
# The dataset's camera model leaves a point out when its radial factor is outside these bounds.
RADIAL_BOUNDS = (0.8, 1.2)
BATCH_ROWS = 1  # rows decoded at a time: one real TOP range image is ~2.7 MB

SEGMENT, TIME = "key.segment_context_name", "key.frame_timestamp_micros"
CAMERA, LASER = "key.camera_name", "key.laser_name"
IMAGE = "[CameraImageComponent].image"
RANGE_VALUES = "[LiDARComponent].range_image_return1.values"
RANGE_SHAPE = "[LiDARComponent].range_image_return1.shape"
LIDAR_CAL = "[LiDARCalibrationComponent]"
CAMERA_CAL = "[CameraCalibrationComponent]"
INTRINSICS = ("f_u", "f_v", "c_u", "c_v", "k1", "k2", "p1", "p2", "k3")
# What each component must have; `beam_inclination.values` is optional (min/max lasers).
REQUIRED = {
    "camera_image": (TIME, CAMERA, IMAGE),
    "lidar": (TIME, LASER, RANGE_VALUES, RANGE_SHAPE),
    "lidar_calibration": (
        LASER,
        f"{LIDAR_CAL}.extrinsic.transform",
        f"{LIDAR_CAL}.beam_inclination.min",
        f"{LIDAR_CAL}.beam_inclination.max",
    ),
    "camera_calibration": (
        CAMERA,
        *(f"{CAMERA_CAL}.intrinsic.{name}" for name in INTRINSICS),
        f"{CAMERA_CAL}.extrinsic.transform",
        f"{CAMERA_CAL}.width",
        f"{CAMERA_CAL}.height",
    ),
}


@dataclass(frozen=True)
class WaymoOptions:
    cameras: tuple[int, ...] = (1,)  # FRONT, as monocular depth evaluations use
    max_depth: float = 80.0
    splits: tuple[str, ...] = ("training", "validation")
    depth: str = "range"  # or "forward" (the command line names the choices)


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
    extrinsic = np.asarray(calibration[f"{LIDAR_CAL}.extrinsic.transform"], np.float64)
    extrinsic = extrinsic.reshape(4, 4)
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
        intrinsic = tuple(float(row[f"{CAMERA_CAL}.intrinsic.{n}"]) for n in INTRINSICS)
        extrinsic = np.asarray(row[f"{CAMERA_CAL}.extrinsic.transform"], np.float64).reshape(4, 4)
        return cls(
            int(row[f"{CAMERA_CAL}.width"]), int(row[f"{CAMERA_CAL}.height"]), intrinsic, extrinsic
        )

    def project(self, points: np.ndarray, convention: str = "range"):
        """(column, row, depth) of the vehicle-frame points the camera model keeps: in front
        of the camera, inside the radial bounds, and landing inside the image."""
        inverse = np.linalg.inv(self.extrinsic)
        local = points @ inverse[:3, :3].T + inverse[:3, 3]
        local = local[local[:, 0] > 0]
        f_u, f_v, c_u, c_v, k1, k2, p1, p2, k3 = self.intrinsic
        u, v = -local[:, 1] / local[:, 0], -local[:, 2] / local[:, 0]
        r2 = u * u + v * v
        radial = 1 + k1 * r2 + k2 * r2**2 + k3 * r2**3
        kept = (radial >= RADIAL_BOUNDS[0]) & (radial <= RADIAL_BOUNDS[1])
        local, u, v, r2, radial = local[kept], u[kept], v[kept], r2[kept], radial[kept]
        ud = u * radial + 2 * p1 * u * v + p2 * (r2 + 2 * u * u)
        vd = v * radial + p1 * (r2 + 2 * v * v) + 2 * p2 * u * v
        x, y = f_u * ud + c_u, f_v * vd + c_v
        inside = (x >= 0) & (x < self.width) & (y >= 0) & (y < self.height)
        depth = np.linalg.norm(local, axis=1) if convention == "range" else local[:, 0]
        return x[inside].astype(np.int64), y[inside].astype(np.int64), depth[inside]


@dataclass
class StagedDepth:
    """A frame's depth map while its lasers come in: the nearest return per pixel so far."""

    height: int
    width: int
    nearest: np.ndarray = field(init=False)

    def __post_init__(self):
        self.nearest = np.full(self.height * self.width, np.inf, np.float32)

    def add(self, col, row, depth, max_depth: float):
        keep = depth <= max_depth
        np.minimum.at(self.nearest, row[keep] * self.width + col[keep], depth[keep])

    def image(self) -> np.ndarray:
        out = self.nearest.reshape(self.height, self.width).astype(np.float64)
        out[np.isinf(out)] = 0.0
        return out


def encode_depth(depth: np.ndarray) -> np.ndarray:
    """uint16 metres × 256; a valid return never rounds to 0 (the no-return value)."""
    value = np.round(depth * SCALE)
    value[(depth > 0) & (value < 1)] = 1
    return np.clip(value, 0, 65535).astype(np.uint16)


# --- reading the components --------------------------------------------------------------


def sensor_id(value, names: dict[int, str]) -> int | None:
    """A camera or laser name as the release stores it: its enum number, or (as the official
    repository's own test data does) its name or number as a string."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        return {name: number for number, name in names.items()}.get(text.upper())
    return int(value)


def component_path(source: Path, split: str, component: str, segment: str) -> Path:
    return source / split / component / f"{segment}.parquet"


def segments(source: Path, split: str) -> list[str]:
    """The segment names of a split that has every component."""
    folder = source / split
    if not folder.is_dir():
        raise EvalkitError(
            f"no split folder {folder} (expected {source}/<split>/<component>/<segment>.parquet; "
            f"splits there: {', '.join(sorted(p.name for p in source.iterdir() if p.is_dir())) or 'none'})"
        )
    missing = [c for c in COMPONENTS if not (folder / c).is_dir()]
    if missing:
        raise EvalkitError(
            f"{folder} lacks the Waymo Open v2 components {', '.join(missing)} (expected "
            f"{folder}/<component>/<segment>.parquet for {', '.join(COMPONENTS)})"
        )
    return sorted(p.stem for p in (folder / "camera_image").glob("*.parquet"))


def unreadable_components(source: Path, split: str, segment: str) -> str | None:
    """Checks every component file of a segment before any work: a missing column is a
    one-line error (the release's schema is not what this reader knows, so every segment
    would be wrong); a missing, unreadable or empty file is the reason to skip the segment."""
    import pyarrow.parquet as pq

    for component in COMPONENTS:
        path = component_path(source, split, component, segment)
        if not path.is_file():
            return f"segment lacks its {component} file"
        try:
            meta = pq.read_metadata(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
            return f"unreadable parquet file {component}/{path.name} ({type(exc).__name__})"
        names = meta.schema.to_arrow_schema().names
        for column in REQUIRED[component]:
            if column not in names:
                raise EvalkitError(
                    f"{path}: no column {column!r} (expected the Waymo Open v2 {component} "
                    f"schema; columns there: {', '.join(names)})"
                )
        if meta.num_rows == 0 and component in ("camera_image", "lidar", "camera_calibration"):
            return f"{component} file has no rows ({component}/{path.name})"
    return None


def read_rows(path: Path, columns) -> list[dict]:
    """Small tables (calibrations, keys) as rows: only the named columns are read."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in present]).to_pylist()


def streamed(path: Path):
    """A parquet file read page by page, one thread, one row a batch: otherwise pyarrow loads
    much of a row group's column chunk (a segment's range images, or its JPEGs) at once
    (measured: 70 MB of arrow memory for 8 real-size frames against 12 MB this way)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, buffer_size=1 << 16, pre_buffer=False)


def lidar_rows(path: Path, wanted: set[int]) -> Iterator[tuple[int, int | None, np.ndarray | None]]:
    """(timestamp, laser, first-return ranges or None when null) for the wanted timestamps,
    decoded one row at a time."""

    columns = [TIME, LASER, RANGE_VALUES, RANGE_SHAPE]
    for batch in streamed(path).iter_batches(
        batch_size=BATCH_ROWS, columns=columns, use_threads=False
    ):
        times = batch.column(TIME).to_pylist()
        lasers = batch.column(LASER).to_pylist()
        values, shapes = batch.column(RANGE_VALUES), batch.column(RANGE_SHAPE)
        for i, time in enumerate(times):
            if time not in wanted:
                continue
            laser = sensor_id(lasers[i], LASERS)
            if not values[i].is_valid or not shapes[i].is_valid:
                yield time, laser, None
                continue
            flat = values[i].values.to_numpy(zero_copy_only=False)
            yield time, laser, flat.reshape(shapes[i].as_py())[..., 0]


# --- writing the layout ------------------------------------------------------------------


@dataclass
class Report:
    written: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str, count: int = 1):
        self.skipped[why] = self.skipped.get(why, 0) + count


def prepare_waymo(source: Path, dest: Path, options: WaymoOptions, progress) -> dict:
    """Every chosen camera image of every frame into ``dest/waymo_depth/<split>/``; frames
    already written are kept (the run resumes). Returns what was written and skipped."""
    source, root = Path(source), Path(dest) / "waymo_depth"
    plan = {split: segments(source, split) for split in options.splits}
    report, unreadable = Report(), {}
    for split, names in plan.items():  # every file's columns checked before any work
        for segment in names:
            if why := unreadable_components(source, split, segment):
                unreadable[(split, segment)] = why
    for split, names in plan.items():
        out = root / split
        for name in ("image", "depth", "mask", ".staged"):
            (out / name).mkdir(parents=True, exist_ok=True)
            sweep_stale(out / name)  # what a killed run was writing
        for segment in progress(names, f"waymo {split}"):
            if why := unreadable.get((split, segment)):
                report.skip(why)
                continue
            SegmentWriter(source, split, segment, out, options, report).run()
        shutil.rmtree(out / ".staged", ignore_errors=True)  # each map was written or dropped
    result = {"written": report.written, "kept": report.kept, "skipped": report.skipped}
    _write_provenance(root, options, result)
    return {**result, "options": asdict(options)}


def _write_provenance(root: Path, options: WaymoOptions, result: dict):
    """What was prepared: ``frames`` counts the finished frames on disk per split, whichever
    runs wrote them; ``written`` and ``skipped`` are this run's."""
    provenance = {**result, "options": asdict(options)}
    provenance.pop("kept")
    provenance["frames"] = {
        split: sum(1 for _ in (root / split / "mask").glob("*.png")) for split in options.splits
    }
    provenance["cameras"] = [CAMERAS.get(c, c) for c in options.cameras]
    provenance["depth"] = options.depth
    provenance["geometry"] = (
        "first returns; the dataset's camera model (radial factor in [0.8, 1.2], x > 0, "
        "inside the image); no rolling-shutter or per-pixel LiDAR poses"
    )
    write_json(root / "provenance.json", provenance)


@dataclass
class SegmentWriter:
    source: Path
    split: str
    segment: str
    out: Path
    options: WaymoOptions
    report: Report

    def frame_id(self, time: int, camera: int) -> str:
        return f"{self.segment}_{time}_{CAMERAS.get(camera, camera)}"

    def path(self, kind: str, time: int, camera: int) -> Path:
        suffix = ".jpg" if kind == "image" else ".png"
        return self.out / kind / f"{self.frame_id(time, camera)}{suffix}"

    def staged_mask(self, time: int, camera: int) -> Path:
        return self.out / ".staged" / f"{self.frame_id(time, camera)}-mask.png"

    def run(self):
        todo = self.frames_to_do()
        if not todo:
            return
        cameras = self.cameras()
        staged = self.stage_depths(todo, cameras)
        self.write_frames(todo, staged, cameras)

    def read(self, component: str, columns) -> list[dict]:
        return read_rows(component_path(self.source, self.split, component, self.segment), columns)

    def frames_to_do(self) -> dict[int, set[int]]:
        """Per timestamp, the chosen cameras whose frame is not finished (the mask is written
        last and marks a finished frame)."""
        todo: dict[int, set[int]] = {}
        for row in self.read("camera_image", [TIME, CAMERA]):
            camera = sensor_id(row[CAMERA], CAMERAS)
            if camera not in self.options.cameras:
                if camera is None:
                    self.report.skip(
                        f"camera name {row[CAMERA]!r} is not one of {list(CAMERAS.values())}"
                    )
                continue
            if self.path("mask", row[TIME], camera).is_file():
                self.report.kept += 1
            else:
                todo.setdefault(row[TIME], set()).add(camera)
        return todo

    def cameras(self) -> dict[int, Camera]:
        rows = self.read("camera_calibration", REQUIRED["camera_calibration"])
        return {sensor_id(row[CAMERA], CAMERAS): Camera.from_row(row) for row in rows}

    def lidar_calibrations(self) -> dict[int, dict]:
        columns = [*REQUIRED["lidar_calibration"], f"{LIDAR_CAL}.beam_inclination.values"]
        rows = self.read("lidar_calibration", columns)
        return {sensor_id(row[LASER], LASERS): row for row in rows}

    def stage_depths(self, todo: dict[int, set[int]], cameras) -> set[tuple[int, int]]:
        """Streams the LiDAR component once, projecting each laser's returns into the frame's
        cameras; a frame's depth map is staged on disk once all its lasers are in. Returns the
        (timestamp, camera) pairs staged."""
        calibrations = self.lidar_calibrations()
        lidar = component_path(self.source, self.split, "lidar", self.segment)
        expected = self.lasers_per_frame(lidar, set(todo))
        pending: dict[int, dict[int, StagedDepth]] = {}
        seen: dict[int, int] = {}
        staged = set()
        for time, laser, ranges in lidar_rows(lidar, set(todo)):
            frame = pending.setdefault(time, self.empty_maps(todo[time], cameras))
            self.add_laser(frame, cameras, calibrations, laser, ranges)
            seen[time] = seen.get(time, 0) + 1
            if seen[time] == expected[time]:
                staged |= self.stage(time, pending.pop(time))
        for time in set(todo) - set(expected):
            self.report.skip(
                "no LiDAR frame at the camera's timestamp", len(todo[time] & set(cameras))
            )
        return staged

    def lasers_per_frame(self, lidar: Path, wanted: set[int]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for row in read_rows(lidar, [TIME]):
            if row[TIME] in wanted:
                counts[row[TIME]] = counts.get(row[TIME], 0) + 1
        return counts

    def empty_maps(self, wanted: set[int], cameras: dict[int, Camera]) -> dict[int, StagedDepth]:
        return {c: StagedDepth(cameras[c].height, cameras[c].width) for c in wanted if c in cameras}

    def add_laser(self, frame, cameras, calibrations, laser, ranges):
        if ranges is None:
            return self.report.skip(
                f"null range image (laser {LASERS.get(laser, laser)}), that laser left out of its frame"
            )
        calibration = calibrations.get(laser)
        if calibration is None:
            return self.report.skip(
                f"no LiDAR calibration for laser {LASERS.get(laser, laser)}, that laser left out of its frame"
            )
        points = range_image_points(ranges, calibration)
        for camera, depth in frame.items():
            projected = cameras[camera].project(points, self.options.depth)
            depth.add(*projected, self.options.max_depth)

    def stage(self, time: int, frame: dict[int, StagedDepth]) -> set[tuple[int, int]]:
        done = set()
        for camera, depth in frame.items():
            image = depth.image()
            if not (image > 0).any():
                self.report.skip("no LiDAR return in the image")
                continue
            with replacing(self.path(".staged", time, camera)) as tmp:
                Image.fromarray(encode_depth(image)).save(tmp, format="PNG")
            with replacing(self.staged_mask(time, camera)) as tmp:
                Image.fromarray(((image > 0) * 255).astype(np.uint8)).save(tmp, format="PNG")
            done.add((time, camera))
        return done

    def write_frames(self, todo: dict[int, set[int]], staged: set[tuple[int, int]], cameras):
        """Streams the camera images; each staged frame gets its JPEG (checked to decode
        whole), its depth map and, last, its mask."""
        path = component_path(self.source, self.split, "camera_image", self.segment)
        columns = [TIME, CAMERA, IMAGE]
        for batch in streamed(path).iter_batches(
            batch_size=BATCH_ROWS, columns=columns, use_threads=False
        ):
            for row in batch.to_pylist():
                time, camera = row[TIME], sensor_id(row[CAMERA], CAMERAS)
                if camera not in todo.get(time, ()):
                    continue
                self.write_frame(time, camera, row[IMAGE], cameras.get(camera), staged)

    def write_frame(self, time, camera, jpeg, calibration, staged):
        name = CAMERAS.get(camera, camera)
        if calibration is None:
            return self.report.skip(f"no calibration for camera {name}")
        if (time, camera) not in staged:  # counted when its LiDAR frame was staged
            return
        size, expected = decoded_size(jpeg), (calibration.width, calibration.height)
        if size != expected:
            self.path(".staged", time, camera).unlink()
            self.staged_mask(time, camera).unlink()
            return self.report.skip(
                "camera image does not decode whole (truncated or corrupt JPEG)"
                if size is None
                else f"camera {name} image is {size[0]}×{size[1]}, its calibration says {expected[0]}×{expected[1]}"
            )
        with replacing(self.path("image", time, camera)) as tmp:
            tmp.write_bytes(jpeg)
        self.path(".staged", time, camera).replace(self.path("depth", time, camera))
        self.staged_mask(time, camera).replace(self.path("mask", time, camera))  # last: done
        self.report.written += 1


def decoded_size(jpeg: bytes) -> tuple[int, int] | None:
    """The image's size when it decodes to the last byte (a truncated JPEG passes PIL's
    ``verify`` but fails to load), else None."""
    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            image.load()
            return image.size
    except (OSError, SyntaxError, ValueError):
        return None
