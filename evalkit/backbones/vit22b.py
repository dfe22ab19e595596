"""``vit22b`` / ``vit22b/<size>``: the built-in ViT-22B family as a frozen feature extractor.

Sizes come from ``evalkit.models.vit22b.SIZES`` (22b, e, g, l, b, s, ti, test); ablation
switches from ``model_kwargs`` (``qk_norm=False`` …). The model is built on the meta device,
sharded by the current process layout (``--tp``, ``--fsdp`` under torchrun), then each rank
fills only its slices, from ``--weights`` (safetensors, optionally sharded with an index JSON;
``evalkit convert`` makes one) or from a seeded random init that is identical on every layout.
There are no public ViT-22B weights, so the paper-scale sizes refuse random weights unless
``--random-init`` says so, and a size that cannot fit in memory stops before allocating.
"""

from __future__ import annotations

import dataclasses

import torch

from evalkit import distributed
from evalkit.backbones import DEFAULT_VARIANT
from evalkit.backbones.base import (
    BackboneInfo,
    Features,
    Preprocess,
    build_transform,
    model_input,
    random_init_id,
    resolve_layers,
)
from evalkit.backbones.options import BackboneOptions
from evalkit.device import free_bytes
from evalkit.errors import EvalkitError, did_you_mean
from evalkit.models import vit22b as vit

PAPER_SIZES = ("22b", "e", "g")
SMALL_SIZES = "vit22b/l, vit22b/b, vit22b/s, vit22b/ti, vit22b/test"
# The model config's own fields: sizes and the ablation switches (qk_norm, parallel, pool…).
MODEL_OPTIONS = frozenset(vit.ViTConfig.__dataclass_fields__)
POOLS_BY_HEAD = {"map": ("map", "mean"), "cls": ("cls", "mean"), "gap": ("mean",)}


def pools_of(cfg) -> tuple[str, ...]:
    """The model's own pooling first; a class token beside MAP or GAP pools too."""
    extra = ("cls",) if cfg.class_token and cfg.pool != "cls" else ()
    return POOLS_BY_HEAD[cfg.pool] + extra


class ViT22BBackbone:
    def __init__(self, model: vit.ViT, info: BackboneInfo, *, sharded: bool = False):
        self.model = model
        self.info = info
        self.sharded = sharded
        self.rebuild = None  # (size, options): how to build a fresh copy of this backbone

    def trainable(self) -> ViT22BBackbone:
        """A fresh copy with gradients on, built as this one was (sharded the same way, weights
        read again) but with fp32 parameters: sharded modules are rebuilt rather than
        deep-copied, and a bf16 run trains under autocast with fp32 master weights (bf16
        weights would drop the small, layer-decayed updates of the lower blocks)."""
        size, opts = self.rebuild
        fresh = build(size, dataclasses.replace(opts, dtype="fp32"))
        fresh.model.requires_grad_(True)
        fresh.info = self.info
        return fresh

    def transform(self, train: bool = False):
        return build_transform(self.info.preprocess, train=train)

    def extract(self, images, *, layers=(-1,), pool="map", dense=False) -> Features:
        indices = resolve_layers(self.info, layers, pool, map_head="MAP head")
        images = model_input(images, self.info.preprocess)
        images = images.to(next(self.model.parameters()).dtype)
        tokens = self._forward(images, indices)
        prefix = self.model.cfg.prefix_tokens
        h, w = (s // self.info.patch_size for s in images.shape[-2:])
        grids = [t[:, prefix:].transpose(1, 2).unflatten(2, (h, w)) for t in tokens]
        how = "gap" if pool == "mean" else pool
        pooled = torch.cat([self.model.pool(t, how) for t in tokens], dim=1)
        return Features(pooled=pooled, grids=grids if dense else None)

    def _forward(self, images, indices) -> list[torch.Tensor]:
        if not self.sharded:
            return self.model.forward_layers(images, indices)
        if torch.is_grad_enabled():  # fine-tuning: the sharded matmuls with autograd
            with torch.inference_mode(False):
                return self.model.forward_layers(images, indices)
        # Under inference_mode DTensor dispatches the undecomposed aten.linear and all-gathers
        # the sharded weights; under no_grad it runs the sharded matmuls as planned.
        with torch.inference_mode(False), torch.no_grad():
            return self.model.forward_layers(images.clone(), indices)


def build(variant: str, opts: BackboneOptions) -> ViT22BBackbone:
    from evalkit.parallel.load import RandomSource
    from evalkit.storage.checkpoints import SafetensorsSource

    size = variant or DEFAULT_VARIANT["vit22b"]
    if size not in vit.SIZES:
        raise EvalkitError(f"unknown vit22b size {size!r}: {did_you_mean(size, list(vit.SIZES))}")
    source = SafetensorsSource(opts.weights) if opts.weights else None
    saved = _dims_free(source.config()) if source else {}
    cfg = _config(size, saved | opts.model_kwargs)
    layout = distributed.current()
    _check_can_run(size, cfg, opts, layout, has_weights=source is not None)
    model = _build_sharded(cfg, opts, layout)
    from evalkit.parallel.load import materialize

    materialize(model, source or RandomSource(vit.init_value, opts.seed))
    model.eval().requires_grad_(False)
    name = f"vit22b/{size}"
    weights_id = source.weights_id() if source else random_init_id(_id_name(name, cfg), opts.seed)
    sharded = layout.tp_size > 1 or opts.fsdp
    backbone = ViT22BBackbone(model, _info(name, cfg, weights_id, model), sharded=sharded)
    backbone.rebuild = (variant, opts)
    return backbone


def _config(size: str, switches: dict) -> vit.ViTConfig:
    valid = list(vit.ViTConfig.__dataclass_fields__)
    unknown = [k for k in switches if k not in valid]
    if unknown:
        raise EvalkitError(
            f"vit22b has no model option {unknown[0]!r}: {did_you_mean(unknown[0], valid)}"
        )
    try:
        return vit.config(size, **switches)
    except ValueError as exc:  # e.g. pool=foo, a width the heads do not divide
        raise EvalkitError(f"vit22b/{size} model options {switches}: {exc}") from exc


def _dims_free(switches: dict) -> dict:
    """A checkpoint's saved config fixes the switches; the size fixes the dimensions (a
    mismatch then shows as a shape error naming the key). ``model_kwargs`` override both."""
    return {k: v for k, v in switches.items() if k not in ("width", "depth", "heads", "mlp")}


def _id_name(name: str, cfg) -> str:
    """Random weights differ with the switches too: fold them into the id."""
    return f"{name}:{sorted(cfg.as_dict().items())}"


def _build_sharded(cfg, opts: BackboneOptions, layout) -> vit.ViT:
    dtype = torch.bfloat16 if opts.dtype == "bf16" else torch.float32
    with torch.device("meta"):
        model = vit.ViT(cfg).to(dtype)
    if layout.tp_size > 1:
        from evalkit.parallel.sharding import apply_tensor_parallel

        apply_tensor_parallel(model, layout.mesh["tp"])
    if opts.fsdp:
        if layout.dp_size == 1:
            raise EvalkitError(
                "--fsdp shards over data-parallel ranks: launch more processes than --tp"
            )
        from evalkit.parallel.sharding import apply_fsdp

        apply_fsdp(model, layout.mesh["dp"])
    return model.to_empty(device=opts.device)


def _check_can_run(size: str, cfg, opts: BackboneOptions, layout, *, has_weights: bool):
    from evalkit.parallel.sizing import sizing

    if not has_weights and size in PAPER_SIZES and not opts.random_init:
        raise EvalkitError(
            f"vit22b/{size} has no public weights: pass --weights PATH (safetensors or an index "
            f"JSON; `evalkit convert` makes one), add --random-init to run it untrained, or pick "
            f"a smaller size ({SMALL_SIZES})"
        )
    shards = layout.tp_size * (layout.dp_size if opts.fsdp else 1)
    need = sizing(cfg, tp=layout.tp_size, dtype=opts.dtype).bytes_total // shards
    have = free_bytes(opts.device)
    if have is not None and need > 0.9 * have:
        raise EvalkitError(
            f"vit22b/{size} needs {need / 2**30:.1f} GiB per rank for its {opts.dtype} weights, "
            f"this device has {have / 2**30:.1f} GiB: shard it (torchrun --nproc-per-node N -m "
            f"evalkit run ... --tp N [--fsdp]), use --dtype bf16, or pick a smaller size "
            f"({SMALL_SIZES})"
        )


def _info(name: str, cfg, weights_id: str, model: vit.ViT) -> BackboneInfo:
    return BackboneInfo(
        name=name,
        weights_id=weights_id,
        embed_dim=cfg.width,
        patch_size=cfg.patch,
        depth=cfg.depth,
        num_prefix_tokens=cfg.prefix_tokens,
        params=sum(p.numel() for p in model.parameters()),  # global sizes, also when sharded
        preprocess=Preprocess(size=cfg.image, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
        pools=pools_of(cfg),
        random_init=weights_id.startswith("random-init"),
    )
