"""The size of a backbone as a plan sees it (``Shape``: width, depth, weight bytes per rank,
activation bytes and FLOPs per image): the built-in ViT-22B family sized on the meta device (no
weights), any other backbone from one forward pass of one image; and ``--batch-size auto``, the
batch whose activations fit the device by that estimate.
"""

from __future__ import annotations

import functools

import torch

from evalkit.core.task import BYTES, Shape
from evalkit.device import free_bytes
from evalkit.errors import EvalkitError


def backbone_shape(spec: str, *, tp: int, dtype: str) -> Shape:
    """vit22b sizes from the planner on the meta device; other backbones built once."""
    family, _, variant = spec.partition("/")
    if family == "vit22b":
        from evalkit.models import vit22b
        from evalkit.parallel.sizing import sizing

        size = variant or "22b"
        if size not in vit22b.SIZES:
            raise EvalkitError(f"unknown vit22b size {size!r}")
        cfg = vit22b.config(size)
        p = sizing(cfg, tp=tp, dtype=dtype)
        return Shape(
            spec,
            cfg.width,
            cfg.depth,
            cfg.patch,
            cfg.image,
            p.bytes_per_rank,
            p.activation_bytes_per_image,
            p.flops_per_image,
        )
    return measured_shape(planning_backbone(spec), dtype=dtype)


@functools.lru_cache(maxsize=1)
def planning_backbone(spec: str):
    """The backbone a plan sizes (random weights, on the CPU), built once per plan."""
    from evalkit.backbones import BackboneOptions, load_backbone

    return load_backbone(spec, BackboneOptions(random_init=True))


def measured_shape(backbone, *, dtype: str, tp: int = 1, flops: bool = True) -> Shape:
    """The shape of a loaded backbone from one forward pass of one image at its own size: the
    pooled width it really produces, the largest tensor any of its modules outputs (held four
    times over: the module's input and output and the buffers beside them) and, with
    ``flops``, the FLOPs torch counts (0 without: a run's fit check and batch size need none,
    and torch's FLOP counter loads its compiler, 1–2 CPU-seconds). CNNs, hybrids and
    transformers alike: nothing is inferred from a patch size. The built-in family (sharded,
    possibly huge) is sized from its config instead, as a ViT."""
    info = backbone.info
    module = getattr(backbone, "model", None)
    if info.name.startswith("vit22b") or not isinstance(module, torch.nn.Module):
        return shape_of(info, dtype=dtype, tp=tp)
    if getattr(backbone, "measured_shape", None) is None:
        backbone.measured_shape = _one_forward(backbone, module)
    if flops and getattr(backbone, "measured_flops", None) is None:
        backbone.measured_flops = _forward_flops(backbone, module)
    width, largest = backbone.measured_shape
    return Shape(
        info.name,
        width,
        info.depth,
        info.patch_size,
        info.preprocess.size,
        info.params * BYTES[dtype] // tp,
        4 * largest * BYTES[dtype],
        backbone.measured_flops if flops else 0,
    )


def _one_image(backbone, module) -> torch.Tensor:
    device = next(module.parameters(), torch.zeros(0)).device
    size = backbone.info.preprocess.size
    return torch.zeros(1, 3, size, size, device=device)


def _one_forward(backbone, module) -> tuple[int, int]:
    """(pooled width, elements of the largest module output) of one image."""
    largest = [0]

    def note(_module, _inputs, output):
        if isinstance(output, torch.Tensor):
            largest[0] = max(largest[0], output.numel())

    handles = [m.register_forward_hook(note) for m in module.modules()]
    try:
        with torch.inference_mode():
            out = backbone.extract(_one_image(backbone, module), pool=backbone.info.pools[0])
    finally:
        for handle in handles:
            handle.remove()
    return out.pooled.shape[-1], largest[0]


def _forward_flops(backbone, module) -> int:
    """The FLOPs torch counts for one image's forward pass."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        backbone.extract(_one_image(backbone, module), pool=backbone.info.pools[0])
    return counter.get_total_flops()


def shape_of(info, *, dtype: str, tp: int = 1) -> Shape:
    """The shape of a ViT-shaped backbone from its info (its weights split over ``tp`` ranks):
    tokens from the patch size, a block's live tensors and two FLOPs per weight per token."""
    tokens = (info.preprocess.size // max(info.patch_size, 1)) ** 2 + info.num_prefix_tokens
    activation = 16 * tokens * info.embed_dim * BYTES[dtype]  # a block's live tensors, roughly
    # Two FLOPs per weight per token: attention scores are left out, a few percent at ViT sizes
    return Shape(
        info.name,
        info.embed_dim,
        info.depth,
        info.patch_size,
        info.preprocess.size,
        info.params * BYTES[dtype] // tp,
        activation,
        2 * info.params * tokens,
    )


AUTO_BATCH_CAP = 1024
AUTO_MEMORY_SHARE = 0.5  # of the free memory: the rest for the loader, the task's own tensors


def auto_batch_size(backbone, device: str, dtype: str, tp: int = 1) -> int:
    """``--batch-size auto``: the largest power of two (at most ``AUTO_BATCH_CAP``) whose forward
    fits ``AUTO_MEMORY_SHARE`` of the device's free memory by the planner's estimate of one
    image's activations; a batch that still runs out of memory is halved (``evalkit.batching``)."""

    shape = measured_shape(backbone, dtype=dtype, tp=tp, flops=False)
    room = AUTO_MEMORY_SHARE * (free_bytes(device) or 0)
    per_image = max(shape.activation_bytes_per_image, 1)
    size = 1
    while size < AUTO_BATCH_CAP and 2 * size * per_image <= room:
        size *= 2
    return size
