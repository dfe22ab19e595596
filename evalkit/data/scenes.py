"""Procedural 3-D scenes for the dense tasks' embedded stand-ins: ray-cast planes, spheres and
boxes with textures and Lambert lighting, giving exact per-pixel class labels and camera-frame
depth (z, in metres) at any resolution.

Two scene kinds: ``indoor`` (floor, walls, furniture-like boxes and balls, clutter labelled 0 =
"other", as ADE20k's ignore label) and ``street`` (road, pavement, buildings, cars, poles, sky;
a simulated LiDAR keeps depth only on scan lines, sparsely, within range, never on the sky).
Every scene is a pure function of (seed, split, index): byte-identical files on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Class ids as written to annotation PNGs (0 = other/ignore, as in ADE20k).
CLASSES = {
    "indoor": ("other", "floor", "wall", "ceiling", "table", "cabinet", "ball", "lamp"),
    "street": ("other", "road", "sidewalk", "building", "car", "pole", "sky", "tree"),
}
SKY = -1  # a surface id with no depth return


@dataclass
class Surface:
    kind: str  # plane | sphere | box
    params: tuple
    label: int
    colour: np.ndarray
    texture: str = "plain"  # plain | checker | stripes | noise


def camera_rays(height: int, width: int, fov_deg: float) -> np.ndarray:
    """Unit-z ray directions (H, W, 3) of a pinhole camera at the origin looking along +z."""
    focal = 0.5 * width / np.tan(np.radians(fov_deg) / 2)
    ys, xs = np.mgrid[:height, :width].astype(np.float64)
    dirs = np.stack([(xs + 0.5 - width / 2) / focal, -(ys + 0.5 - height / 2) / focal], -1)
    return np.concatenate([dirs, np.ones((height, width, 1))], axis=-1)


def intersect(surface: Surface, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ray parameter t (= depth, since rays have unit z) and normals; inf where missed."""
    if surface.kind == "plane":
        point, normal = (np.asarray(p, float) for p in surface.params)
        denom = rays @ normal
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (point @ normal) / denom
        t = np.where((denom != 0) & (t > 1e-6), t, np.inf)
        return t, np.broadcast_to(normal, rays.shape)
    if surface.kind == "sphere":
        centre, radius = np.asarray(surface.params[0], float), surface.params[1]
        a = np.einsum("hwc,hwc->hw", rays, rays)
        b = -2 * rays @ centre
        c = centre @ centre - radius**2
        disc = b * b - 4 * a * c
        t = np.where(disc >= 0, (-b - np.sqrt(np.maximum(disc, 0))) / (2 * a), np.inf)
        t = np.where(t > 1e-6, t, np.inf)
        hit = rays * t[..., None] - centre
        return t, hit / radius
    low, high = (np.asarray(p, float) for p in surface.params)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (low - 0) / rays, (high - 0) / rays
    t_near = np.nanmax(np.minimum(t1, t2), axis=-1)
    t_far = np.nanmin(np.maximum(t1, t2), axis=-1)
    t = np.where((t_near <= t_far) & (t_near > 1e-6), t_near, np.inf)
    hit = rays * t[..., None]
    centre, half = (low + high) / 2, (high - low) / 2
    local = (hit - centre) / half
    axis = np.abs(local).argmax(-1)
    normal = np.zeros_like(hit)
    np.put_along_axis(
        normal, axis[..., None], np.sign(np.take_along_axis(local, axis[..., None], -1)), -1
    )
    return t, normal


def texture(surface: Surface, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if surface.texture == "checker":
        cells = np.floor(points[..., 0] * 2) + np.floor(points[..., 2] * 2)
        return np.where(cells % 2 == 0, 1.0, 0.6)
    if surface.texture == "stripes":
        return 0.75 + 0.25 * np.sign(np.sin(points[..., 1] * 6 + points[..., 0] * 3))
    if surface.texture == "noise":
        return 0.8 + 0.2 * np.sin(points[..., 0] * 13.1) * np.cos(
            points[..., 1] * 7.7 + points[..., 2]
        )
    return np.ones(points.shape[:-1])


def render(surfaces: list[Surface], rays: np.ndarray, rng: np.random.Generator):
    """(RGB uint8 (H, W, 3), labels (H, W) int, depth (H, W) float; inf where nothing/sky)."""
    height, width = rays.shape[:2]
    depth = np.full((height, width), np.inf)
    labels = np.zeros((height, width), dtype=np.int64)
    colour = np.zeros((height, width, 3))
    light = np.array([0.4, 0.8, -0.45])
    light /= np.linalg.norm(light)
    for surface in surfaces:
        t, normal = intersect(surface, rays)
        closer = t < depth
        if not closer.any():
            continue
        points = rays * np.where(np.isfinite(t), t, 0)[..., None]
        shade = 0.35 + 0.65 * np.clip(np.abs(np.einsum("hwc,c->hw", normal, light)), 0, 1)
        fill = surface.colour[None, None] * (shade * texture(surface, points, rng))[..., None]
        depth = np.where(closer, t, depth)
        labels = np.where(closer, surface.label, labels)
        colour = np.where(closer[..., None], fill, colour)
    colour += rng.normal(0, 4, colour.shape)
    return np.clip(colour, 0, 255).astype(np.uint8), labels, depth


def _rgb(rng, base) -> np.ndarray:
    return np.clip(np.asarray(base, float) + rng.normal(0, 18, 3), 20, 250)


def indoor_scene(rng: np.random.Generator) -> list[Surface]:
    room = rng.uniform(3.0, 6.0)
    floor_y, ceiling_y = -1.5, rng.uniform(1.2, 1.8)
    surfaces = [
        Surface("plane", ((0, floor_y, 0), (0, 1, 0)), 1, _rgb(rng, (150, 110, 70)), "checker"),
        Surface("plane", ((0, ceiling_y, 0), (0, -1, 0)), 3, _rgb(rng, (225, 225, 215))),
        Surface("plane", ((0, 0, room + 2), (0, 0, -1)), 2, _rgb(rng, (190, 180, 160)), "stripes"),
        Surface("plane", ((-room / 2 - 1, 0, 0), (1, 0, 0)), 2, _rgb(rng, (180, 175, 160))),
        Surface("plane", ((room / 2 + 1, 0, 0), (-1, 0, 0)), 2, _rgb(rng, (175, 170, 165))),
    ]
    for _ in range(rng.integers(1, 4)):
        x, z = rng.uniform(-room / 2, room / 2), rng.uniform(1.8, room + 1)
        w, d, h = rng.uniform(0.4, 1.2), rng.uniform(0.4, 1.0), rng.uniform(0.4, 1.4)
        label, base = (4, (120, 70, 40)) if h < 0.9 else (5, (90, 90, 120))
        box = ((x - w, floor_y, z - d), (x + w, floor_y + h, z + d))
        surfaces.append(Surface("box", box, label, _rgb(rng, base), "noise"))
    for _ in range(rng.integers(1, 4)):
        r = rng.uniform(0.2, 0.5)
        centre = (rng.uniform(-room / 2, room / 2), floor_y + r, rng.uniform(1.5, room))
        surfaces.append(Surface("sphere", (centre, r), 6, _rgb(rng, (200, 60, 50))))
    lamp = (rng.uniform(-1.5, 1.5), ceiling_y - 0.3, rng.uniform(2, room))
    surfaces.append(Surface("sphere", (lamp, 0.25), 7, _rgb(rng, (250, 240, 160))))
    for _ in range(rng.integers(0, 3)):  # clutter: ADE20k's "other"
        x, z, s = rng.uniform(-2, 2), rng.uniform(1.5, room), rng.uniform(0.1, 0.3)
        clutter = ((x - s, floor_y, z - s), (x + s, floor_y + 2 * s, z + s))
        surfaces.append(Surface("box", clutter, 0, _rgb(rng, (90, 140, 90)), "stripes"))
    return surfaces


def street_scene(rng: np.random.Generator) -> list[Surface]:
    camera_height = 1.6
    ground = -camera_height
    road = rng.uniform(3.5, 6.0)
    surfaces = [
        Surface("plane", ((0, ground, 0), (0, 1, 0)), 1, _rgb(rng, (90, 90, 95)), "noise"),
        Surface(
            "box",
            ((-60, ground - 1, 0), (-road, ground + 0.15, 200)),
            2,
            _rgb(rng, (160, 155, 150)),
            "checker",
        ),
        Surface(
            "box",
            ((road, ground - 1, 0), (60, ground + 0.15, 200)),
            2,
            _rgb(rng, (160, 150, 150)),
            "checker",
        ),
    ]
    for side in (-1, 1):
        z = rng.uniform(3, 10)
        while z < 90:
            length, height = rng.uniform(6, 18), rng.uniform(5, 20)
            near = road + rng.uniform(2, 5)
            x0, x1 = sorted((side * near, side * (near + rng.uniform(6, 12))))
            box = ((x0, ground, z), (x1, ground + height, z + length))
            surfaces.append(Surface("box", box, 3, _rgb(rng, (150, 120, 100)), "stripes"))
            z += length + rng.uniform(1, 6)
    for _ in range(rng.integers(1, 5)):
        x, z = rng.uniform(-road + 1, road - 1), rng.uniform(5, 45)
        car = ((x - 0.9, ground, z), (x + 0.9, ground + 1.4, z + 4.2))
        surfaces.append(
            Surface(
                "box",
                car,
                4,
                _rgb(rng, rng.choice([(200, 30, 30), (30, 60, 190), (220, 220, 220)])),
                "plain",
            )
        )
    for _ in range(rng.integers(1, 4)):
        x, z = rng.choice([-1, 1]) * (road + 0.8), rng.uniform(4, 50)
        surfaces.append(
            Surface(
                "box",
                ((x - 0.12, ground, z - 0.12), (x + 0.12, ground + 6, z + 0.12)),
                5,
                _rgb(rng, (60, 60, 60)),
            )
        )
    for _ in range(rng.integers(0, 3)):
        centre = (rng.choice([-1, 1]) * (road + 2), ground + 4, rng.uniform(8, 40))
        surfaces.append(
            Surface("sphere", (centre, rng.uniform(1.5, 2.5)), 7, _rgb(rng, (50, 130, 50)), "noise")
        )
    return surfaces


def lidar_mask(
    depth: np.ndarray, labels: np.ndarray, rng: np.random.Generator, *, max_range: float
) -> np.ndarray:
    """Sparse returns: ~64 scan lines over the lower two thirds of the image, points dropped
    at random along each line, nothing on the sky or beyond range."""
    height, width = depth.shape
    mask = np.zeros_like(depth, dtype=bool)
    rows = np.unique(np.linspace(height // 3, height - 1, 64).astype(int))
    keep = rng.random((len(rows), width)) < 0.6
    mask[rows] = keep
    return (
        mask & np.isfinite(depth) & (depth < max_range) & (labels != CLASSES["street"].index("sky"))
    )


def scene(kind: str, seed: int, split: str, index: int, size: tuple[int, int]):
    """(image, labels, depth, valid) for one scene; depth in metres."""
    rng = np.random.default_rng([seed, ("train", "val").index(split), index, len(kind)])
    height, width = size
    surfaces = indoor_scene(rng) if kind == "indoor" else street_scene(rng)
    image, labels, depth = render(
        surfaces, camera_rays(height, width, 70 if kind == "indoor" else 80), rng
    )
    if kind == "street":
        sky = ~np.isfinite(depth)
        labels[sky] = CLASSES["street"].index("sky")
        sky_colour = np.array([135, 180, 235]) - np.linspace(0, 40, height)[:, None, None]
        image = np.where(sky[..., None], sky_colour.astype(np.uint8), image)
        valid = lidar_mask(depth, labels, rng, max_range=75.0)
    else:
        valid = np.isfinite(depth)
    return image, labels, np.where(np.isfinite(depth), depth, 0.0), valid
