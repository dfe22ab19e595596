"""Memory and compute sizing of the ViT-22B family: built on the meta device, so it reports
the full 22B model without allocating a byte of weights (``evalkit backbones info vit22b``).

Counts follow docs/protocols.md, "Architecture": the paper's 21,743M is the blocks' weight matrices;
embeddings, norms and biases are listed on top, and the MAP head separately. Per-rank bytes
use the tensor-parallel plan of ``evalkit.parallel.sharding``. Activation memory is an estimate of
the inference peak inside one block (tensors alive at once, attention scores materialised, as
without a fused kernel); FLOPs count multiply-adds as two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.parallel.sharding import check_divisible, sharded_dim

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Sizing:
    block_matrices: int
    encoder: int
    head: int
    bytes_total: int
    bytes_per_rank: int
    activation_bytes_per_image: int
    flops_per_image: int
    tp: int
    dtype: str


def sizing(cfg, *, tp: int = 1, dtype: str = "bf16") -> Sizing:
    from evalkit.models.vit22b import ViT

    check_divisible(cfg, tp)
    with torch.device("meta"):
        model = ViT(cfg)
    params = dict(model.named_parameters())
    size = DTYPE_BYTES[dtype]
    per_rank = sum(
        p.numel() // (tp if sharded_dim(name) is not None else 1) for name, p in params.items()
    )
    return Sizing(
        block_matrices=sum(
            p.numel() for n, p in params.items() if n.startswith("blocks.") and p.dim() == 2
        ),
        encoder=sum(p.numel() for n, p in params.items() if not n.startswith("head.")),
        head=sum(p.numel() for n, p in params.items() if n.startswith("head.")),
        bytes_total=size * sum(p.numel() for p in params.values()),
        bytes_per_rank=size * per_rank,
        activation_bytes_per_image=size * activation_elements(cfg, tp),
        flops_per_image=forward_flops(cfg),
        tp=tp,
        dtype=dtype,
    )


def activation_elements(cfg, tp: int) -> int:
    """Peak elements alive in one block per image: residual, normed input and branch sum
    (replicated); Q, K, V, attention output, scores and the MLP hidden (split over ranks)."""
    n = cfg.grid**2 + cfg.prefix_tokens
    replicated = 3 * n * cfg.width
    sharded = 4 * n * cfg.width + cfg.heads * n * n + 2 * n * cfg.mlp
    return replicated + sharded // tp


def forward_flops(cfg) -> int:
    n = cfg.grid**2 + cfg.prefix_tokens
    per_block = 2 * n * (4 * cfg.width**2 + 2 * cfg.width * cfg.mlp) + 4 * n * n * cfg.width
    patch = 2 * cfg.grid**2 * 3 * cfg.patch**2 * cfg.width
    return cfg.depth * per_block + patch


def training_flops(cfg, images: int) -> int:
    """FLOPs of training on ``images`` images: forward and backward, about 3 forward passes."""
    return 3 * images * forward_flops(cfg)


def human(value: float, unit: str = "") -> str:
    for scale, suffix in (
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {suffix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def count(n: int) -> str:
    short = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    return f"{short}  ({n:,})"


def report(name: str, cfg, p: Sizing) -> list[tuple[str, str]]:
    """(label, value) lines for the CLI."""
    lines = [
        (
            "model",
            f"{name}: width {cfg.width}, depth {cfg.depth}, heads {cfg.heads}, "
            f"MLP {cfg.mlp}, patch {cfg.patch}, {cfg.image} px ({cfg.grid**2} tokens)",
        ),
        ("blocks' weight matrices", count(p.block_matrices)),
        ("encoder (+ embeddings, norms, biases)", count(p.encoder)),
        ("MAP head", count(p.head) if p.head else "none"),
        (f"weights, {p.dtype}", human(p.bytes_total, "B")),
        (f"weights per rank, tp={p.tp}", human(p.bytes_per_rank, "B")),
        ("activations per image (est.)", human(p.activation_bytes_per_image, "B")),
        (f"forward FLOPs per image at {cfg.image} px", human(p.flops_per_image, "FLOP")),
    ]
    return lines
