"""The 15 ImageNet-C corruptions at 5 severities, for data without a pre-corrupted copy
(effect-table row 11; docs/protocols.md, "ImageNet-C").

Severity parameters are those of the original generation script; the operations are our own,
written with torch on whole batches (``(N, H, W, 3)`` uint8 in, the same out), seeded, and
usable at any image size (pixel-sized parameters are given for 224 px and scaled with the
image). Where the original needs something we do not have, we say what stands in for it:

- ``motion_blur`` and ``snow`` blur along a line with Gaussian weights on one side of each
  pixel, as ImageMagick's motion blur does (the original calls ImageMagick);
- ``glass_blur`` copies pixels in the original's sequential order (its "swap" of NumPy views
  copies one way), every image of a batch at once: a Python loop over the pixels, the slowest
  corruption;
- ``frost`` blends crops of the original's frost photographs when the ``imagecorruptions``
  package is installed (they are not redistributed here), else a procedural ice texture
  matched to their average brightness and tint;
Values are truncated to uint8, as the original script's ``np.uint8`` does.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from evalkit import seeds
from evalkit.errors import EvalkitError, did_you_mean

SEVERITIES = (1, 2, 3, 4, 5)
# 2: motion blur on whole-pixel taps, the fog fractal's wibble², elastic's reflecting
# smoothing, frost from the photographs or a texture of their brightness (stand-ins rewritten)
# 3: glass_blur's sequential swaps and SciPy's zoom geometry (zoom_blur, snow), as the original
CORRUPTIONS_VERSION = 3
REFERENCE_SIZE = 224  # the pixel-sized parameters are for 224-px images


# --- building blocks ---------------------------------------------------------------------------


def _gaussian_kernel(sigma: float, radius: int | None = None) -> torch.Tensor:
    radius = radius if radius is not None else max(1, math.ceil(4 * sigma))
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    return kernel / kernel.sum()


def _pad(x: torch.Tensor, pad: int) -> torch.Tensor:
    mode = "reflect" if pad < min(x.shape[-2:]) else "replicate"
    return F.pad(x, (pad, pad, pad, pad), mode=mode)


def filter2d(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Each channel of ``x`` (N, C, H, W) convolved with a square 2-D ``kernel``, borders
    reflected (OpenCV's default)."""
    channels, size = x.shape[1], kernel.shape[-1]
    weight = kernel.to(x)[None, None].expand(channels, 1, size, size)
    return F.conv2d(_pad(x, size // 2), weight, groups=channels)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    kernel = _gaussian_kernel(sigma).to(x)
    channels, size = x.shape[1], len(kernel)
    x = _pad(x, size // 2)
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, size), groups=channels)
    return F.conv2d(x, kernel.view(1, 1, -1, 1).expand(channels, 1, size, 1), groups=channels)


def _grid(n: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
    )
    return xs.expand(n, h, w), ys.expand(n, h, w)


def sample(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, padding: str = "reflection"):
    """``x`` read bilinearly at pixel coordinates (xs, ys), each (N, H, W)."""
    h, w = x.shape[-2:]
    grid = torch.stack([2 * xs / max(1, w - 1) - 1, 2 * ys / max(1, h - 1) - 1], dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=True)


def line_blur(x: torch.Tensor, radius: float, sigma: float, angles: torch.Tensor) -> torch.Tensor:
    """Motion blur as ImageMagick's (and the original's port of it): ``2·radius + 1`` taps
    with one-sided Gaussian weights, tap ``i`` the pixel ``i`` steps along ``angles``
    (degrees, one per image) rounded to whole pixels, borders repeated; taps that would leave
    the image stop the line."""
    n, _, h, w = x.shape
    taps = int(2 * round(radius) + 1)
    weights = torch.exp(-(torch.arange(taps, dtype=torch.float32) ** 2) / (2 * sigma**2))
    weights = weights / weights.sum()
    rows, cols = torch.arange(h), torch.arange(w)
    out = torch.zeros_like(x)
    for image in range(n):
        theta = math.radians(float(angles[image]))
        for i, weight in enumerate(weights):
            dy, dx = math.ceil(i * math.sin(theta) - 0.5), math.ceil(i * math.cos(theta) - 0.5)
            if abs(dy) >= h or abs(dx) >= w:
                break
            taken = x[image][:, (rows + dy).clamp(0, h - 1)][:, :, (cols + dx).clamp(0, w - 1)]
            out[image] += weight * taken
    return out


def clipped_zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The centre 1/factor of each image enlarged by ``factor`` and trimmed back to the full
    size, as the original does with SciPy's ``zoom`` (order 1): the enlarged crop has
    round(crop · factor) pixels with its corner pixels on the output's corners."""
    h, w = x.shape[-2:]
    ch, cw = max(1, math.ceil(h / factor)), max(1, math.ceil(w / factor))
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = x[..., top : top + ch, left : left + cw]
    big_h, big_w = max(h, round(ch * factor)), max(w, round(cw * factor))
    big = F.interpolate(crop, size=(big_h, big_w), mode="bilinear", align_corners=True)
    trim_h, trim_w = (big_h - h) // 2, (big_w - w) // 2
    return big[..., trim_h : trim_h + h, trim_w : trim_w + w]


def plasma_fractal(size: int, decay: float, generator: np.random.Generator) -> np.ndarray:
    """A square fractal height map in [0, 1] of side ``size`` (a power of two) by the
    diamond-square algorithm on a torus. As in the original, a level's random offsets are
    ``wibble · U(-wibble, wibble)`` (amplitude ``wibble²``) and ``wibble`` is divided by
    ``decay`` at each finer level, so the amplitude falls by ``decay²`` per level."""
    maps = np.zeros((size, size))
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = maps[0:size:step, 0:size:step].copy()
        offsets = wibble * generator.uniform(-wibble, wibble, (3, *corners.shape))
        right, below = np.roll(corners, -1, 1), np.roll(corners, -1, 0)
        diagonal = np.roll(below, -1, 1)
        maps[half::step, half::step] = (corners + right + below + diagonal) / 4 + offsets[0]
        centres = maps[half::step, half::step]
        maps[0::step, half::step] = (
            corners + right + centres + np.roll(centres, 1, 0)
        ) / 4 + offsets[1]
        maps[half::step, 0::step] = (
            corners + below + centres + np.roll(centres, 1, 1)
        ) / 4 + offsets[2]
        step, wibble = half, wibble / decay
    maps -= maps.min()
    return maps / maps.max()


def _random(shape, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator)


def _grey(x: torch.Tensor) -> torch.Tensor:
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)


def _scale(x: torch.Tensor) -> float:
    return min(x.shape[-2:]) / REFERENCE_SIZE


# --- the corruptions (x: (N, 3, H, W) in [0, 1]) --------------------------------------------


def gaussian_noise(x, c, gen):
    return x + c * torch.randn(x.shape, generator=gen)


def shot_noise(x, c, gen):
    return torch.poisson(x * c, generator=gen) / c


def impulse_noise(x, c, gen):
    hit, salt = _random(x.shape, gen) < c, _random(x.shape, gen) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


def defocus_blur(x, c, gen):
    radius, alias = c[0] * _scale(x), c[1]
    reach = max(8, math.ceil(radius))
    offsets = torch.arange(-reach, reach + 1, dtype=torch.float32)
    disk = ((offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius**2).float()
    smooth = _gaussian_kernel(alias, 1 if reach <= 8 else 2)  # anti-aliasing: 3×3 or 5×5
    disk = filter2d((disk / disk.sum())[None, None], smooth.outer(smooth))[0, 0]
    return filter2d(x, disk)


def glass_blur(x, c, gen):
    """The original's local shuffle: after a blur (kept to 8 bits, as the original's
    ``np.uint8`` does), every pixel of the inner region, from the last row and column back to
    the first, takes the value of the pixel at a random offset in [-delta, delta). The
    original writes this as a swap of two NumPy rows, ``x[a], x[b] = x[b], x[a]``, but the
    right-hand side holds views, so ``x[b]`` gets back its own value: each step copies one
    pixel, and a value copied backwards is met again and can travel further. The loop is the
    original's, run on every image of the batch at once."""
    sigma, delta, iterations = c[0] * _scale(x), max(1, round(c[1] * _scale(x))), c[2]
    x = torch.floor(gaussian_blur(x, sigma) * 255) / 255
    n, _, h, w = x.shape
    pixels = x.permute(0, 2, 3, 1).numpy().copy()  # (n, h, w, 3)
    offsets = torch.randint(-delta, delta, (iterations, h, w, 2, n), generator=gen).numpy()
    shuffle_like_original(pixels, offsets, delta)
    return gaussian_blur(torch.from_numpy(pixels).permute(0, 3, 1, 2), sigma)


def shuffle_like_original(pixels: np.ndarray, offsets: np.ndarray, delta: int):
    """Glass blur's pixel loop, in place on ``pixels`` (N, H, W, 3): per iteration, rows and
    columns from H - delta and W - delta down to delta + 1, pixel (row, col) of every image
    takes the value at (row + dy, col + dx), with ``offsets`` (iterations, H, W, 2 (dy, dx), N)."""
    n, h, w, _ = pixels.shape
    images = np.arange(n)
    for step in offsets:
        for row in range(h - delta, delta, -1):
            for col in range(w - delta, delta, -1):
                dy, dx = step[row, col]
                pixels[images, row, col] = pixels[images, row + dy, col + dx]


def motion_blur(x, c, gen):
    angles = _random(len(x), gen) * 90 - 45
    return line_blur(x, c[0] * _scale(x), c[1] * _scale(x), angles)


def zoom_blur(x, zooms, gen):
    out = x.clone()
    for zoom in zooms:
        out += clipped_zoom(x, zoom)
    return out / (len(zooms) + 1)


def snow(x, c, gen):
    n, _, h, w = x.shape
    flakes = c[0] + c[1] * torch.randn((n, 1, h, w), generator=gen)
    flakes = clipped_zoom(flakes, c[2])
    flakes = torch.where(flakes < c[3], 0.0, flakes).clamp(0, 1)
    angles = _random(n, gen) * 90 - 135
    flakes = line_blur(flakes, c[4] * _scale(x), c[5] * _scale(x), angles)
    x = c[6] * x + (1 - c[6]) * torch.maximum(x, _grey(x) * 1.5 + 0.5)
    return x + flakes + flakes.flip(-1, -2)


def frost(x, c, gen):
    photos = frost_photos()
    texture = frost_crops(x.shape, photos, gen) if photos else frost_texture(x.shape, gen)
    return c[0] * x + c[1] * texture


def frost_photos() -> list:
    """The original's frost photographs, where the ``imagecorruptions`` package is installed
    (it is found, not imported); as the original, only the first five are drawn from."""
    import importlib.util

    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "frost"
    names = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")
    return [folder / name for name in names if (folder / name).is_file()]


def frost_crops(shape, photos: list, gen: torch.Generator) -> torch.Tensor:
    """Per image a random photograph, cropped at a random place to the image's size; a
    photograph smaller than the image is first enlarged (bicubic) to cover it, by 10% more."""
    n, _, h, w = shape
    crops = []
    for _ in range(n):
        photo = Image.open(photos[int(torch.randint(len(photos), (1,), generator=gen))]).convert(
            "RGB"
        )
        if photo.height < h or photo.width < w:
            scale = 1.1 * max(h / photo.height, w / photo.width)
            photo = photo.resize(
                (math.ceil(photo.width * scale), math.ceil(photo.height * scale)), Image.BICUBIC
            )
        top = int(torch.randint(photo.height - h, (1,), generator=gen)) if photo.height > h else 0
        left = int(torch.randint(photo.width - w, (1,), generator=gen)) if photo.width > w else 0
        crops.append(np.asarray(photo.crop((left, top, left + w, top + h))))
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float() / 255


def frost_texture(shape, gen: torch.Generator) -> torch.Tensor:
    """Without the photographs: ice on glass, a fractal haze with bright crystal streaks,
    bluish white, its brightness and tint set to the five photographs' average (mean 0.64;
    red, green, blue 0.57, 0.66, 0.70)."""
    n, _, h, w = shape
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    size = 2 ** math.ceil(math.log2(max(h, w, 8)))
    haze = torch.tensor(np.stack([plasma_fractal(size, 2.0, rng)[:h, :w] for _ in range(n)]))
    streaks = (torch.rand((n, 1, h, w), generator=gen) > 0.985).float()
    angles = torch.rand(n, generator=gen) * 180
    streaks = line_blur(streaks, 6 * max(1.0, h / REFERENCE_SIZE), 3.0, angles) * 6
    ice = (FROST_BASE + FROST_SPREAD * haze[:, None].float() + 0.3 * streaks).clamp(0, 1)
    return (ice * FROST_TINT.view(1, 3, 1, 1)).clamp(0, 1)


FROST_BASE, FROST_SPREAD = 0.38, 0.5
FROST_TINT = torch.tensor([0.87, 1.0, 1.07])


def fog(x, c, gen):
    n, _, h, w = x.shape
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    size = 2 ** math.ceil(math.log2(max(h, w, 256)))
    maps = torch.tensor(np.stack([plasma_fractal(size, c[1], rng)[:h, :w] for _ in range(n)]))
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + c[0] * maps[:, None].float()) * peak / (peak + c[0])


def brightness(x, c, gen):
    value = x.amax(dim=1, keepdim=True)
    brighter = (value + c).clamp(max=1.0)
    return torch.where(value > 0, x * brighter / value.clamp(min=1e-12), brighter.expand_as(x))


def contrast(x, c, gen):
    means = x.mean(dim=(2, 3), keepdim=True)
    return (x - means) * c + means


def elastic_transform(x, c, gen):
    n, _, h, w = x.shape
    alpha, sigma, jitter = (v * _scale(x) for v in c)
    x = _random_affine(x, jitter, gen)
    noise = torch.rand((2, n, h, w), generator=gen) * 2 - 1
    dx, dy = (reflect_gaussian(field, sigma).float() * alpha for field in noise)
    xs, ys = _grid(n, h, w)
    return sample(x, xs + dx, ys + dy)


def _random_affine(x, jitter: float, gen) -> torch.Tensor:
    """The affine map that moves three points around the centre by up to ``jitter`` px."""
    n, _, h, w = x.shape
    centre, reach = torch.tensor([w / 2, h / 2]), min(h, w) // 3
    source = torch.stack([centre + reach, centre + torch.tensor([reach, -reach]), centre - reach])
    out = []
    for i in range(n):
        target = source + (torch.rand(source.shape, generator=gen) * 2 - 1) * jitter
        solve = torch.linalg.lstsq(torch.cat([target, torch.ones(3, 1)], 1), source).solution
        xs, ys = _grid(1, h, w)
        points = torch.stack([xs[0], ys[0], torch.ones(h, w)], -1) @ solve
        out.append(sample(x[i : i + 1], points[None, ..., 0], points[None, ..., 1]))
    return torch.cat(out)


def reflect_gaussian(field: torch.Tensor, sigma: float, truncate: float = 3.0) -> torch.Tensor:
    """Gaussian smoothing of (N, H, W) fields as scikit-image's ``gaussian(mode="reflect",
    truncate=3)`` does: the kernel cut at ``truncate`` σ and the borders mirrored
    (``d c b a | a b c d | d c b a``) as often as a kernel wider than the image needs."""
    rows, cols = (_reflect_matrix(n, sigma, truncate) for n in field.shape[-2:])
    return rows @ field.double() @ cols.T


def _reflect_matrix(n: int, sigma: float, truncate: float) -> torch.Tensor:
    """The (n, n) matrix of 1-D smoothing with mirrored borders."""
    radius = int(truncate * sigma + 0.5)
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    kernel /= kernel.sum()
    source = np.arange(n)[:, None] + offsets[None, :]
    period = 2 * n
    folded = np.mod(source, period)
    folded = np.where(folded >= n, period - 1 - folded, folded)
    matrix = np.zeros((n, n))
    np.add.at(matrix, (np.repeat(np.arange(n), len(offsets)), folded.ravel()), np.tile(kernel, n))
    return torch.from_numpy(matrix)


def pixelate(x, c, gen):
    return _per_image(x, lambda image: _box_resample(image, c))


def _box_resample(image: Image.Image, factor: float) -> Image.Image:
    w, h = image.size
    small = image.resize((max(1, int(w * factor)), max(1, int(h * factor))), Image.BOX)
    return small.resize((w, h), Image.BOX)


def jpeg_compression(x, quality, gen):
    def compress(image: Image.Image) -> Image.Image:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
        return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")

    return _per_image(x, compress)


def _per_image(x: torch.Tensor, fn) -> torch.Tensor:
    arrays = (x.clamp(0, 1) * 255).permute(0, 2, 3, 1).to(torch.uint8).numpy()
    done = np.stack([np.asarray(fn(Image.fromarray(a))) for a in arrays])
    return torch.from_numpy(done).permute(0, 3, 1, 2).float() / 255


# Severity 1 → 5 parameters of the original generation script (for 224-px images).
CORRUPTIONS = {
    "gaussian_noise": (gaussian_noise, (0.08, 0.12, 0.18, 0.26, 0.38)),
    "shot_noise": (shot_noise, (60, 25, 12, 5, 3)),
    "impulse_noise": (impulse_noise, (0.03, 0.06, 0.09, 0.17, 0.27)),
    "defocus_blur": (defocus_blur, ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))),
    "glass_blur": (glass_blur, ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2))),
    "motion_blur": (motion_blur, ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))),
    "zoom_blur": (
        zoom_blur,
        tuple(
            tuple(np.arange(1, stop, step).tolist())
            for stop, step in ((1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03))
        ),
    ),
    "snow": (
        snow,
        (
            (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
            (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
            (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
            (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
            (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
        ),
    ),
    "frost": (frost, ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))),
    "fog": (fog, ((1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4))),
    "brightness": (brightness, (0.1, 0.2, 0.3, 0.4, 0.5)),
    "contrast": (contrast, (0.4, 0.3, 0.2, 0.1, 0.05)),
    "elastic_transform": (
        elastic_transform,
        tuple(
            tuple(244 * v for v in c)
            for c in (
                (2, 0.7, 0.1),
                (2, 0.08, 0.2),
                (0.05, 0.01, 0.02),
                (0.07, 0.01, 0.02),
                (0.12, 0.01, 0.02),
            )
        ),
    ),
    "pixelate": (pixelate, (0.6, 0.5, 0.4, 0.3, 0.25)),
    "jpeg_compression": (jpeg_compression, (25, 18, 15, 10, 7)),
}
NAMES = tuple(CORRUPTIONS)


def corrupt(images: np.ndarray, name: str, severity: int, *, seed: int = 0) -> np.ndarray:
    """``images`` (N, H, W, 3) or (H, W, 3) uint8 with corruption ``name`` at ``severity``
    (1–5), the same shape and dtype; the same seed gives the same output."""
    if name not in CORRUPTIONS:
        raise EvalkitError(
            f"unknown corruption {name!r}: {did_you_mean(name, NAMES, listing=None)}"
        )
    if severity not in SEVERITIES:
        raise EvalkitError(f"corruption severity must be 1 to 5, got {severity}")
    single = images.ndim == 3
    batch = images[None] if single else images
    if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[-1] != 3:
        raise EvalkitError(f"corrupt() expects uint8 RGB images (N, H, W, 3), got {images.shape}")
    fn, levels = CORRUPTIONS[name]
    generator = seeds.generator(seed, name, severity)
    x = torch.from_numpy(np.array(batch, copy=True)).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        y = fn(x, levels[severity - 1], generator)
    out = (y.clamp(0, 1) * 255).floor().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out[0] if single else out
