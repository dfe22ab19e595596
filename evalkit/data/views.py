"""The evaluation view of an image: 8-bit RGB pixels (3, size, size) after the resize and centre
crop of a backbone's preprocessing, by one of two decoders, normalised later on the device
(``normalise``).

- ``pil``: Pillow decodes, torchvision resizes and crops the PIL image. The reference: what the
  backbones' own eval transforms (timm, open_clip) do.
- ``tensor``: for 8-bit RGB or greyscale JPEGs, torchvision's ``decode_jpeg`` (the same
  libjpeg-turbo arithmetic, identical pixels) and an antialiased resize on the uint8 tensor
  (PIL's filter, computed in float and rounded): within ``TENSOR_BOUND_LEVELS`` 8-bit levels of
  the reference per pixel, about 2.5× as many images per CPU core. Every other image (PNG,
  CMYK or 16-bit files, palettes, a JPEG ``decode_jpeg`` refuses) takes the ``pil`` path, so
  its pixels are the reference's. Neither decoder applies EXIF rotation.
- ``auto``: ``tensor`` where its bound holds (bicubic or bilinear resizing that keeps the
  aspect: a squashing resize of both sides can be 8 levels apart), else ``pil``.

Sending uint8 and normalising on the device moves a quarter of the bytes and takes
``ToTensor`` and ``Normalize`` off the decoding cores; the arithmetic is theirs, so features
equal the float path's bit for bit.
"""

from __future__ import annotations

import dataclasses
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from evalkit.data import DECODERS, DEFAULT_DECODER
from evalkit.data.folder import load_rgb, pixel_limit
from evalkit.data.jpeg_ops import center_crop_square, decode_jpeg_rgb, resize_shorter_side
from evalkit.device import threads
from evalkit.errors import EvalkitError

TENSOR_BOUND_LEVELS = 2  # the largest per-pixel difference from ``pil`` on ImageNet-sized photos
TENSOR_INTERPOLATIONS = ("bicubic", "bilinear")  # where the uint8 resize matches PIL's filter
TENSOR_MODES = ("RGB", "L")  # what decode_jpeg turns into the RGB PIL would

# torchvision 0.29 marks its image decoders deprecated in favour of TorchCodec; they are
# what this version ships, and the tests pin their pixels to PIL's.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)


@dataclass(frozen=True)
class EvalView:
    """Resize (the shorter side to ``side``, or both sides when ``square``), centre-crop
    ``size``; uint8 (3, size, size). Its ``repr`` is the geometry and the decoder: what the
    pixels depend on, and so part of a data set's identity (and of the pixel cache's key)."""

    size: int
    side: int
    interpolation: str = "bicubic"
    square: bool = False
    decoder: str = DEFAULT_DECODER

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise EvalkitError(f"decoder {self.decoder!r}: expected one of {', '.join(DECODERS)}")
        if self.decoder == "auto":
            object.__setattr__(self, "decoder", _resolved(self.interpolation, self.square))
        if self.decoder == "tensor" and self.interpolation not in TENSOR_INTERPOLATIONS:
            raise EvalkitError(
                f"decoder=tensor reproduces PIL's {' and '.join(TENSOR_INTERPOLATIONS)} resizing, "
                f"not {self.interpolation}: use decoder=pil or auto"
            )
        if self.decoder == "tensor" and self.square:
            raise EvalkitError(
                "decoder=tensor keeps within its bound of PIL's pixels where a resize keeps the "
                "aspect; this view resizes both sides (a squashing preprocessing, or "
                "resize=square), where it can be 8 levels apart: use decoder=pil or auto"
            )

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """The view of a decoded PIL image (the ``pil`` path)."""
        from torchvision.transforms import functional as F

        image = F.resize(image, self._target(), interpolation=self._mode())
        image = F.center_crop(image, self.size)
        return F.pil_to_tensor(image)

    def read(self, path: Path) -> torch.Tensor:
        """The view of the image file at ``path``, by this view's decoder, on one thread: one
        image is too little work to split, and a split waits for cores a busy machine lacks."""
        with threads(1):
            return self._read(path)

    def _read(self, path: Path) -> torch.Tensor:
        if self.decoder == "tensor":
            data = _plain_jpeg(path)
            if data is not None:
                try:
                    return self.from_jpeg(data)
                except RuntimeError:
                    pass  # decode_jpeg refuses it: PIL reads it, or says why it cannot
        return self(load_rgb(path))

    def from_jpeg(self, data: bytes) -> torch.Tensor:
        """The ``tensor`` path of an 8-bit RGB or greyscale JPEG's bytes."""
        image = decode_jpeg_rgb(data)
        image = resize_shorter_side(image, self.side, self.interpolation)
        # the resize leaves channels innermost in memory: numpy's copy to channels-first is a
        # third of torch's uint8 one (the same bytes)
        crop = center_crop_square(image, self.size).numpy()
        return torch.from_numpy(np.ascontiguousarray(crop))

    def geometry(self) -> dict:
        return {
            "size": self.size,
            "side": self.side,
            "interpolation": self.interpolation,
            "square": self.square,
            "decoder": self.decoder,
        }

    def _target(self) -> list[int]:
        return [self.side, self.side] if self.square else [self.side]

    def _mode(self):
        from torchvision.transforms import InterpolationMode

        return InterpolationMode(self.interpolation)


def eval_view(size: int, crop_pct: float, interpolation: str, **options) -> EvalView:
    """The view of a preprocessing given as (size, crop fraction, interpolation)."""
    return EvalView(size, math.floor(size / crop_pct), interpolation, **options)


def _resolved(interpolation: str, square: bool) -> str:
    """``auto``: the tensor decoder where its bound holds (a bicubic or bilinear resize that
    keeps the aspect), else PIL."""
    return "tensor" if interpolation in TENSOR_INTERPOLATIONS and not square else "pil"


def _plain_jpeg(path: Path) -> bytes | None:
    """The file's bytes when its header says an 8-bit RGB or greyscale JPEG; None otherwise
    (or when it cannot be read: the PIL path then names the problem)."""
    pixel_limit()
    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            plain = image.format == "JPEG" and image.mode in TENSOR_MODES
    except (OSError, UnidentifiedImageError, SyntaxError, Image.DecompressionBombError):
        return None
    return data if plain else None


class Normalised:
    """A view followed by the normalisation of ``normalise``: float tensors, for the readers
    whose images never reach a backbone's ``extract`` (a fine-tuned model's own forward)."""

    def __init__(self, view: EvalView, mean, std):
        self.view, self.mean, self.std = view, tuple(mean), tuple(std)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return normalise(self.view(image), self.mean, self.std)

    def read(self, path: Path) -> torch.Tensor:
        return normalise(self.view.read(path), self.mean, self.std)

    def __repr__(self) -> str:
        return f"Normalised({self.view!r}, mean={self.mean}, std={self.std})"


def normalise(images: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 pixels → float32 normalised as ``ToTensor`` then ``Normalize`` compute it (divide
    by 255, subtract the mean, divide by the std, in that order: the same bits); a float tensor
    is taken as already normalised and returned as it is."""
    if images.dtype != torch.uint8:
        return images
    mean = torch.tensor(mean, dtype=torch.float32, device=images.device).view(3, 1, 1)
    std = torch.tensor(std, dtype=torch.float32, device=images.device).view(3, 1, 1)
    return (
        images.to(torch.float32).div_(255).sub_(mean).div_(std)
    )  # in place: one tensor, same bits


def with_decoder(transform, decoder: str):
    """``transform`` decoding by ``decoder`` when it is an evaluation view (plain or
    ``Normalised``); any other transform as it is."""
    if isinstance(transform, Normalised):
        return Normalised(with_decoder(transform.view, decoder), transform.mean, transform.std)
    if isinstance(transform, EvalView):
        return dataclasses.replace(transform, decoder=decoder)
    return transform


def decoder_of(transform) -> str | None:
    """The decoder of an evaluation view (plain or ``Normalised``); None for other transforms."""
    view = transform.view if isinstance(transform, Normalised) else transform
    return view.decoder if isinstance(view, EvalView) else None
