"""A Waymo Open v2 release written as the dataset ships it, for the preparer's tests and its
memory benchmark: the official layout (``<split>/<component>/<segment>.parquet``), column names
and arrow types; real-size sensors (the TOP LiDAR 64 × 2650 with uneven beam inclinations, a
FRONT LiDAR 200 × 600 with only its min/max inclinations, a 1920 × 1280 FRONT camera with the
calibration of the dataset's own camera-model test: k1 = 0.032, k2 = −0.321, non-zero p1/p2,
rotated extrinsic); and a scene whose depth is known everywhere.

The scene, around the FRONT camera's centre C: a sphere of radius ``FAR`` m over the directions
within ``CONE_DEG`` of the camera's optical axis, and one of radius ``NEAR`` m everywhere else.
Every pixel of the camera therefore sees the far patch (range exactly ``FAR``); a return from
the near patch (outside the field of view) that lands in the image is a projection error."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

FAR, NEAR, CONE_DEG = 15.0, 6.0, 40.0
SEGMENT = "seg-official"
# The FRONT camera of the dataset's own camera-model test.
FRONT_INTRINSIC = {
    "f_u": 2055.55614936,
    "f_v": 2055.55614936,
    "c_u": 939.657469886,
    "c_v": 641.072182194,
    "k1": 0.032316008498,
    "k2": -0.321412482553,
    "p1": 0.000793258395371,
    "p2": -0.000625749354133,
    "k3": 0.0,
}
FRONT_EXTRINSIC = [
    0.999892684989,
    -0.00599320840002,
    0.0133678704017,
    1.53891424471,
    0.00604223652133,
    0.999975156055,
    -0.0036302411765,
    -0.0236339408393,
    -0.0133457814992,
    0.00371062343188,
    0.999904056092,
    2.11527057298,
    0.0,
    0.0,
    0.0,
    1.0,
]
TOP_AT, FRONT_LIDAR_AT = (1.43, 0.0, 2.184), (4.07, 0.0, 0.689)
TOP_SHAPE, FRONT_LIDAR_SHAPE = (64, 2650), (200, 600)
# Uneven, as the TOP LiDAR's are: denser near the horizon (stored lowest beam first).
TOP_INCLINATIONS = np.sort(-0.31 + 0.35 * (np.linspace(0, 1, 64) ** 0.6))
FRONT_LIDAR_MIN_MAX = (-math.pi / 2, math.pi / 6)

KEY = "key.segment_context_name", "key.frame_timestamp_micros"


def schemas():
    """The official arrow types of the four components the preparer reads."""
    import pyarrow as pa

    segment, time = pa.field(KEY[0], pa.string()), pa.field(KEY[1], pa.int64())
    camera, laser = pa.field("key.camera_name", pa.int8()), pa.field("key.laser_name", pa.int8())
    floats = pa.list_(pa.float64())
    lidar = "[LiDARComponent]"
    lidar_cal, camera_cal = "[LiDARCalibrationComponent]", "[CameraCalibrationComponent]"
    returns = [
        pa.field(f"{lidar}.range_image_return{r}.{part}", kind)
        for r in (1, 2)
        for part, kind in (("values", pa.list_(pa.float32())), ("shape", pa.list_(pa.int32())))
    ]
    return {
        "lidar": pa.schema([segment, time, laser, *returns]),
        "lidar_calibration": pa.schema(
            [
                segment,
                laser,
                pa.field(f"{lidar_cal}.extrinsic.transform", floats),
                pa.field(f"{lidar_cal}.beam_inclination.min", pa.float64()),
                pa.field(f"{lidar_cal}.beam_inclination.max", pa.float64()),
                pa.field(f"{lidar_cal}.beam_inclination.values", floats),
            ]
        ),
        "camera_calibration": pa.schema(
            [
                segment,
                camera,
                *(pa.field(f"{camera_cal}.intrinsic.{k}", pa.float64()) for k in FRONT_INTRINSIC),
                pa.field(f"{camera_cal}.extrinsic.transform", floats),
                pa.field(f"{camera_cal}.width", pa.int32()),
                pa.field(f"{camera_cal}.height", pa.int32()),
                pa.field(f"{camera_cal}.rolling_shutter_direction", pa.int8()),
            ]
        ),
        "camera_image": pa.schema(
            [
                segment,
                time,
                camera,
                pa.field("[CameraImageComponent].image", pa.binary()),
                pa.field("[CameraImageComponent].pose.transform", floats),
            ]
        ),
    }


def transform(yaw: float, at) -> list[float]:
    c, s = math.cos(yaw), math.sin(yaw)
    return [c, -s, 0, at[0], s, c, 0, at[1], 0, 0, 1, at[2], 0, 0, 0, 1]


def camera_pose() -> tuple[np.ndarray, np.ndarray]:
    """The FRONT camera's centre and optical axis in the vehicle frame."""
    matrix = np.asarray(FRONT_EXTRINSIC).reshape(4, 4)
    return matrix[:3, 3], matrix[:3, 0]


def scene_ranges(origin: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Distance along each unit ray from ``origin`` to the scene (both patches are spheres
    about the camera centre; the origin lies inside both)."""
    centre, axis = camera_pose()
    offset = origin - centre
    best = np.full(len(directions), np.inf)
    for radius, in_cone in ((FAR, True), (NEAR, False)):
        b = directions @ offset
        t = -b + np.sqrt(b * b - (offset @ offset - radius**2))
        hit = origin + t[:, None] * directions
        cosine = (hit - centre) @ axis / radius
        inside = cosine > math.cos(math.radians(CONE_DEG))
        valid = inside if in_cone else ~inside
        best = np.where(valid & (t < best), t, best)
    return best


def range_image(at, yaw: float, inclinations_top_first: np.ndarray, width: int) -> np.ndarray:
    """The scene's range image for a LiDAR at ``at`` yawed by ``yaw``, by the layout's own
    conventions: row 0 the highest beam; column j at sensor azimuth (2 (W − j − 0.5)/W − 1) π."""
    azimuth = (2 * (width - np.arange(width) - 0.5) / width - 1) * math.pi
    incl, az = np.meshgrid(inclinations_top_first, azimuth, indexing="ij")
    sensor = np.stack([np.cos(az) * np.cos(incl), np.sin(az) * np.cos(incl), np.sin(incl)], -1)
    rotation = np.asarray(transform(yaw, at)).reshape(4, 4)[:3, :3]
    directions = sensor.reshape(-1, 3) @ rotation.T
    ranges = scene_ranges(np.asarray(at, float), directions).reshape(incl.shape)
    return np.where(np.isfinite(ranges) & (ranges < 75), ranges, -1.0).astype(np.float32)


def jpeg(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


def lidar_rows(frames: int, top_yaw: float = 0.02) -> list[dict]:
    """Both lasers' rows for each frame (the scene is static, so one range image each)."""
    top_rows = TOP_INCLINATIONS[::-1]
    low, high = FRONT_LIDAR_MIN_MAX
    height = FRONT_LIDAR_SHAPE[0]
    front_rows = (low + (np.arange(height) + 0.5) / height * (high - low))[::-1]
    images = {
        1: (range_image(TOP_AT, top_yaw, top_rows, TOP_SHAPE[1]), TOP_SHAPE),
        2: (range_image(FRONT_LIDAR_AT, 0.0, front_rows, FRONT_LIDAR_SHAPE[1]), FRONT_LIDAR_SHAPE),
    }
    rows, rng = [], np.random.default_rng(0)
    for frame in range(frames):
        for laser, (ranges, (h, w)) in images.items():
            # intensity, elongation and the no-label flag as real returns carry them, and a
            # sub-millimetre jitter: real ranges are unique floats, not a dictionary's few
            values = rng.uniform(0, 1, (h, w, 4)).astype(np.float32)
            jitter = rng.uniform(-5e-4, 5e-4, (h, w)).astype(np.float32)
            values[..., 0] = np.where(ranges > 0, ranges + jitter, -1.0)
            rows.append(
                {
                    KEY[0]: SEGMENT,
                    KEY[1]: 100 * (frame + 1),
                    "key.laser_name": laser,
                    **{
                        f"[LiDARComponent].range_image_return{r}.{part}": value
                        for r in (1, 2)
                        for part, value in (("values", values.ravel()), ("shape", [h, w, 4]))
                    },
                }
            )
    return rows


def calibration_rows() -> dict[str, list[dict]]:
    lidar_cal, camera_cal = "[LiDARCalibrationComponent]", "[CameraCalibrationComponent]"
    lasers = [
        {
            KEY[0]: SEGMENT,
            "key.laser_name": 1,
            f"{lidar_cal}.extrinsic.transform": transform(0.02, TOP_AT),
            f"{lidar_cal}.beam_inclination.min": float(TOP_INCLINATIONS[0]),
            f"{lidar_cal}.beam_inclination.max": float(TOP_INCLINATIONS[-1]),
            f"{lidar_cal}.beam_inclination.values": TOP_INCLINATIONS.tolist(),
        },
        {
            KEY[0]: SEGMENT,
            "key.laser_name": 2,
            f"{lidar_cal}.extrinsic.transform": transform(0.0, FRONT_LIDAR_AT),
            f"{lidar_cal}.beam_inclination.min": FRONT_LIDAR_MIN_MAX[0],
            f"{lidar_cal}.beam_inclination.max": FRONT_LIDAR_MIN_MAX[1],
            f"{lidar_cal}.beam_inclination.values": None,
        },
    ]
    camera = {
        KEY[0]: SEGMENT,
        "key.camera_name": 1,
        **{f"{camera_cal}.intrinsic.{k}": v for k, v in FRONT_INTRINSIC.items()},
        f"{camera_cal}.extrinsic.transform": FRONT_EXTRINSIC,
        f"{camera_cal}.width": 1920,
        f"{camera_cal}.height": 1280,
        f"{camera_cal}.rolling_shutter_direction": 2,
    }
    return {"lidar_calibration": lasers, "camera_calibration": [camera]}


def write_release(root: Path, frames: int = 1, split: str = "training") -> Path:
    """Writes the release under ``root``; returns ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = jpeg(1920, 1280)
    rows = {
        **calibration_rows(),
        "lidar": lidar_rows(frames),
        "camera_image": [
            {
                KEY[0]: SEGMENT,
                KEY[1]: 100 * (f + 1),
                "key.camera_name": 1,
                "[CameraImageComponent].image": image,
                "[CameraImageComponent].pose.transform": transform(0, (0, 0, 0)),
            }
            for f in range(frames)
        ],
    }
    for component, schema in schemas().items():
        folder = root / split / component
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(rows[component], schema=schema)
        pq.write_table(table, folder / f"{SEGMENT}.parquet")
    return root
