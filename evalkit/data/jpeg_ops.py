"""The ``tensor`` decoder's steps (``evalkit.data.views``) without importing torchvision's
Python package: its JPEG decoder, the operator its image library registers with torch, and the
uint8 resize and centre crop of its ``resize`` and ``center_crop``, as the calls those
functions make.

Importing torchvision imports torch's compiler (``torch._dynamo``, through
``torchvision.ops``): about 1.3 CPU-seconds and 170 MB at the start of every run that decodes
a JPEG. Each step here is the call torchvision's own function makes for this input (an 8-bit
CHW image, its shorter side resized with antialiasing, a square crop), so the pixels are the
same bits; ``tests/test_feeding_views.py`` compares them with torchvision's functions. Where
torchvision's image library cannot be loaded alone, or a case lies beyond these calls (a crop
larger than the image), torchvision's functions do the work.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
from pathlib import Path

import torch

RGB = 3  # torchvision.io.ImageReadMode.RGB
IMAGE_LIBRARIES = ("image_stable", "image")  # the file's stem, newer torchvision first


@functools.cache
def image_operators():
    """``torch.ops.image`` with torchvision's image library loaded on its own; None where the
    library is not found or does not load (torchvision's own import then loads it)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    for stem in IMAGE_LIBRARIES:
        for library in sorted(folder.glob(f"{stem}.*")):
            if library.suffix not in (".so", ".pyd"):
                continue
            try:
                torch.ops.load_library(str(library))
            except (OSError, RuntimeError):
                continue
            if hasattr(torch.ops.image, "decode_jpeg"):
                return torch.ops.image
    return None


def decode_jpeg_rgb(data: bytes) -> torch.Tensor:
    """The JPEG's pixels as uint8 RGB (3, H, W): torchvision's ``decode_jpeg`` with
    ``ImageReadMode.RGB`` and no EXIF rotation. Raises RuntimeError where it refuses the file."""
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    operators = image_operators()
    if operators is None:
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(encoded, mode=ImageReadMode.RGB)
    return operators.decode_jpeg(encoded, RGB, False)


def resize_shorter_side(image: torch.Tensor, side: int, interpolation: str) -> torch.Tensor:
    """A uint8 (C, H, W) image with its shorter side resized to ``side`` (the longer in
    proportion, rounded down), antialiased: torchvision's ``resize(image, [side],
    interpolation, antialias=True)`` for ``bicubic`` or ``bilinear``."""
    channels, height, width = image.shape
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = side, int(side * long / short)
    new_width, new_height = (new_short, new_long) if width <= height else (new_long, new_short)
    if (new_height, new_width) == (height, width):
        return image
    native = _native_uint8_resize(interpolation)
    batch = _channels_last_kept(image.reshape(1, channels, height, width))
    resized = torch.nn.functional.interpolate(
        batch if native else batch.to(torch.float32),
        size=[new_height, new_width],
        mode=interpolation,
        align_corners=False,
        antialias=True,
    )
    if not native:  # torchvision's float path: bilinear where ATen has no vector uint8 kernel
        resized = resized.round_().to(torch.uint8)
    return resized.reshape(channels, new_height, new_width)


def _channels_last_kept(batch: torch.Tensor) -> torch.Tensor:
    """torchvision's re-stride of a channels-last (1, C, H, W) batch, so ``interpolate``
    allocates its output channels-last too (torch issue 68430): the same pixels, laid out as
    the copy to channels-first after the crop reads them fastest."""
    strides = batch.stride()
    if batch.is_contiguous(memory_format=torch.channels_last) and batch.numel() != strides[0]:
        return batch.as_strided(batch.shape, (batch.numel(), *strides[1:]))
    return batch


def _native_uint8_resize(interpolation: str) -> bool:
    """Whether torchvision resizes this uint8 image on the CPU as uint8 (its choice: bicubic
    always, bilinear with ATen's AVX2 or AVX-512 kernels or on ARM)."""
    if interpolation == "bicubic":
        return True
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def center_crop_square(image: torch.Tensor, size: int) -> torch.Tensor:
    """The centred ``size`` × ``size`` crop: torchvision's ``center_crop(image, [size])``
    (its anchor rounds half to even, as Python's ``round``)."""
    height, width = image.shape[-2:]
    if size > height or size > width:  # torchvision pads: its own function does it
        from torchvision.transforms.v2 import functional

        return functional.center_crop(image, [size])
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return image[..., top : top + size, left : left + size]
