"""How fast a machine runs a backbone: the rate ``evalkit plan`` turns its FLOPs into an
expected time. On this machine the rate is measured (a second of forward passes of the
backbone itself, or for the built-in family, too large to build for a plan, of the matrix
product that dominates a ViT block); on a named target it is assumed, a share of the
accelerator's data-sheet peak. The time counts compute only: data loading is not in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from evalkit.core.task import Shape

MEASURE_SECONDS = 1.0  # of timed forwards, after one warm-up
ASSUMED_MFU = 0.4  # a ViT forward in bf16 on a recent GPU reaches about this much of its peak


@dataclass(frozen=True)
class Rate:
    flops_per_s: float
    how: str  # how the rate was found, shown beside the time


def measured_forward(backbone, shape: Shape, device: str, dtype: str) -> Rate:
    """Forward passes of one image at the backbone's own size, timed for about a second."""
    module = getattr(backbone, "model", None)
    if isinstance(module, torch.nn.Module):
        module.to(device)
    image = torch.zeros(1, 3, shape.image, shape.image, device=device)
    pool = backbone.info.pools[0]

    def forward():
        with torch.inference_mode(), _autocast(device, dtype):
            _synchronised(backbone.extract(image, pool=pool).pooled, device)

    images, seconds = _timed(forward)
    rate = images / seconds
    return Rate(rate * shape.flops_per_image, f"forward measured here at {rate:,.1f} img/s")


def measured_matmul(shape: Shape, device: str, dtype: str) -> Rate:
    """The (tokens × width) · (width × 4·width) product of a ViT block's MLP, timed."""
    # a ViT-B/16's block where the backbone has no shape of its own (the ablations train theirs)
    tokens = (shape.image // shape.patch) ** 2 if shape.patch and shape.image else 196
    width = min(shape.embed_dim or 768, 4096)  # the product's rate, not the model's memory
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    left = torch.randn(tokens, width, device=device, dtype=kind)
    right = torch.randn(width, 4 * width, device=device, dtype=kind)
    products, seconds = _timed(lambda: _synchronised(left @ right, device))
    flops = 2 * tokens * width * 4 * width * products / seconds
    return Rate(flops, f"a {tokens}×{width}·{width}×{4 * width} matrix product measured here")


def assumed(peak_tflops: float, gpus: int, name: str) -> Rate:
    """All ``gpus`` of a target at an assumed share of each one's data-sheet peak."""
    share = f"an assumed {ASSUMED_MFU:.0%} of {gpus} × {peak_tflops:,.0f} TFLOP/s bf16 peak"
    return Rate(gpus * peak_tflops * 1e12 * ASSUMED_MFU, f"{name} at {share}")


def expected_time(flops: float, rate: Rate | None) -> str:
    """One line for ``evalkit plan``: the time ``flops`` take at ``rate``, and how it was found."""
    from evalkit.progress import duration

    if rate is None or rate.flops_per_s <= 0:
        return "expected time: unknown (no rate for this target: add tflops=T to --target)"
    seconds = flops / rate.flops_per_s
    return (
        f"expected time: about {duration(seconds)} of compute ({rate.flops_per_s / 1e12:,.3g} "
        f"TFLOP/s: {rate.how}; data loading not counted)"
    )


SAMPLE_PHOTO = "sample_data/grace_hopper.jpg"  # a 512×600 JPEG photo matplotlib ships
DECODE_SECONDS = 0.5


@dataclass(frozen=True)
class DecodeRate:
    per_core: float  # images a second one core prepares
    decoder: str  # the one the view resolved to


def measured_decoding(decoder: str, size: int, interpolation: str = "bicubic") -> DecodeRate:
    """Images per CPU-second the evaluation view of ``decoder`` prepares on this machine, on
    ImageNet-sized JPEGs cut from a photo that ships inside matplotlib (one thread)."""
    from evalkit.data.views import eval_view
    from evalkit.device import threads

    view = eval_view(size, 0.875, interpolation, decoder=decoder)
    photos = _sample_jpegs()
    prepare = view.from_jpeg if view.decoder == "tensor" else lambda data: view(_opened(data))
    with threads(1):
        prepare(photos[0])
        count, start = 0, time.process_time()
        while time.process_time() - start < DECODE_SECONDS or count < len(photos):
            prepare(photos[count % len(photos)])
            count += 1
        seconds = time.process_time() - start
    return DecodeRate(count / seconds, view.decoder)


def _sample_jpegs() -> list[bytes]:
    """Crops of matplotlib's sample photo at ImageNet's sizes (about 500×375, both ways), as
    JPEG files of quality 90."""
    import io
    import os

    import matplotlib
    from PIL import Image

    photo = Image.open(os.path.join(matplotlib.get_data_path(), SAMPLE_PHOTO)).convert("RGB")
    crops = []
    for box in ((0, 0, 512, 384), (0, 100, 384, 600), (50, 50, 500, 450), (0, 200, 512, 580)):
        buffer = io.BytesIO()
        photo.crop(box).save(buffer, "JPEG", quality=90)
        crops.append(buffer.getvalue())
    return crops


def _opened(data: bytes):
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def _timed(step) -> tuple[int, float]:
    step()  # warm-up: first-call allocations and kernel choices are not the rate
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < MEASURE_SECONDS or count == 0:
        step()
        count += 1
    return count, elapsed


def _synchronised(result: torch.Tensor, device: str) -> torch.Tensor:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return result


def _autocast(device: str, dtype: str):
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=dtype == "bf16")
