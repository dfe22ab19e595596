"""Checkpoint conversion into the ViT-22B family's layout, with explicit key maps.

Sources: timm's parallel/QK-norm ViTs (``vit_*_xp_*``: fused ``in_proj`` = [MLP-in, Q, K, V],
RMSNorm, class token) and big_vision-style parameter trees saved as ``.npz`` (``/``-separated
names; Dense kernels stored (in, out); attention kernels (D, heads, head_dim); per-block or
scanned ``encoderblock``). Each converter also reads the model switches from the tree;
``evalkit.checkpoints.save_checkpoint`` writes them into the checkpoint's metadata, so
``--weights`` alone rebuilds the model.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.models.vit22b import ViTConfig

# --- timm vit_*_xp_* -------------------------------------------------------------------------


def timm_xp_config(state: dict[str, torch.Tensor]) -> ViTConfig:
    width = state["pos_embed"].shape[-1]
    patch = state["patch_embed.proj.weight"].shape[-1]
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    return ViTConfig(
        width=width,
        depth=depth,
        heads=width // state["blocks.0.q_norm.weight"].shape[0],
        mlp=state["blocks.0.mlp_bias"].shape[0],
        patch=patch,
        image=math.isqrt(state["pos_embed"].shape[1]) * patch,
        qkv_bias="blocks.0.qkv_bias" in state,
        pool="cls" if "cls_token" in state else "gap",
        norm="rms",  # every timm xp model uses RmsNorm
        pre_norm="norm_pre.weight" in state,
        patch_bias="patch_embed.proj.bias" in state,
    )


def from_timm_xp(state: dict[str, torch.Tensor]) -> tuple[dict, ViTConfig]:
    """A timm ``vit_*_xp_*`` state dict → (our state dict, config). The classifier is dropped."""
    if "blocks.0.in_proj.weight" not in state:
        raise EvalkitError(
            "not a timm parallel-block ViT checkpoint (no blocks.0.in_proj.weight): expected "
            "a vit_*_xp_* state dict"
        )
    cfg = timm_xp_config(state)
    renames = {
        "patch_embed.proj.weight": "patch_embed.weight",
        "patch_embed.proj.bias": "patch_embed.bias",
        "pos_embed": "pos_embed",
        "cls_token": "cls_token",
        "norm_pre.weight": "norm_pre.weight",
        "norm.weight": "norm.weight",
    }
    out = {new: state[old] for old, new in renames.items() if old in state}
    for i in range(cfg.depth):
        out |= _timm_xp_block(state, f"blocks.{i}.", cfg)
    return out, cfg


def _timm_xp_block(state: dict, p: str, cfg: ViTConfig) -> dict:
    mlp_in, q, k, v = torch.split(state[p + "in_proj.weight"], [cfg.mlp] + [cfg.width] * 3)
    out = {
        p + "norm1.weight": state[p + "in_norm.weight"],
        p + "mlp.fc1.weight": mlp_in,
        p + "mlp.fc1.bias": state[p + "mlp_bias"],
        p + "attn.q.weight": q,
        p + "attn.k.weight": k,
        p + "attn.v.weight": v,
        p + "attn.q_norm.weight": state[p + "q_norm.weight"],
        p + "attn.k_norm.weight": state[p + "k_norm.weight"],
        p + "attn.out.weight": state[p + "attn_out_proj.weight"],
        p + "attn.out.bias": state[p + "attn_out_proj.bias"],
        p + "mlp.fc2.weight": state[p + "mlp_out_proj.weight"],
        p + "mlp.fc2.bias": state[p + "mlp_out_proj.bias"],
    }
    if cfg.qkv_bias:
        q_bias, k_bias, v_bias = state[p + "qkv_bias"].chunk(3)
        out |= {p + "attn.q.bias": q_bias, p + "attn.k.bias": k_bias, p + "attn.v.bias": v_bias}
    return {k: t.contiguous() for k, t in out.items()}


# --- big_vision parameter trees ----------------------------------------------------------------

# How a big_vision array becomes ours; each entry is (to ours, back to big_vision).
_LAYOUTS = {
    "same": (lambda a, c: a, lambda t, c: t),
    "dense": (lambda a, c: a.T, lambda t, c: t.T),
    "conv": (lambda a, c: a.permute(3, 2, 0, 1), lambda t, c: t.permute(2, 3, 1, 0)),
    "heads_in": (
        lambda a, c: a.reshape(c.width, c.width).T,
        lambda t, c: t.T.reshape(c.width, c.heads, c.head_dim),
    ),
    "heads_bias": (lambda a, c: a.reshape(-1), lambda t, c: t.reshape(c.heads, c.head_dim)),
    "heads_out": (
        lambda a, c: a.reshape(c.width, c.width).T,
        lambda t, c: t.T.reshape(c.heads, c.head_dim, c.width),
    ),
}


def _norm_keys(bv: str, ours: str, cfg: ViTConfig, *, bias: bool) -> list:
    keys = [(f"{bv}/scale", f"{ours}.weight", "same")]
    return keys + [(f"{bv}/bias", f"{ours}.bias", "same")] if bias else keys


def _attention_keys(bv: str, ours: str, cfg: ViTConfig, *, qkv_bias: bool, qk_norm: bool):
    keys = [(f"{bv}/out/kernel", f"{ours}.out.weight", "heads_out")]
    keys.append((f"{bv}/out/bias", f"{ours}.out.bias", "same"))
    for bv_name, name in (("query", "q"), ("key", "k"), ("value", "v")):
        keys.append((f"{bv}/{bv_name}/kernel", f"{ours}.{name}.weight", "heads_in"))
        if qkv_bias:
            keys.append((f"{bv}/{bv_name}/bias", f"{ours}.{name}.bias", "heads_bias"))
    if qk_norm:
        for bv_name, name in (("query_ln", "q_norm"), ("key_ln", "k_norm")):
            keys += _norm_keys(f"{bv}/{bv_name}", f"{ours}.{name}", cfg, bias=cfg.ln_bias)
    return keys


def _mlp_keys(bv: str, ours: str) -> list:
    return [
        (f"{bv}/Dense_{i}/{leaf}", f"{ours}.fc{i + 1}.{name}", kind)
        for i in (0, 1)
        for leaf, name, kind in (("kernel", "weight", "dense"), ("bias", "bias", "same"))
    ]


def big_vision_keys(cfg: ViTConfig) -> list[tuple[str, str, str]]:
    """(big_vision name, our name, layout) for every parameter of ``cfg``'s model."""
    keys = [
        ("embedding/kernel", "patch_embed.weight", "conv"),
        ("pos_embedding", "pos_embed", "same"),
    ]
    if cfg.patch_bias:
        keys.append(("embedding/bias", "patch_embed.bias", "same"))
    if cfg.pool == "cls":
        keys.append(("cls", "cls_token", "same"))
    keys += _norm_keys("Transformer/encoder_norm", "norm", cfg, bias=cfg.ln_bias)
    for i in range(cfg.depth):
        bv, ours = f"Transformer/encoderblock_{i}", f"blocks.{i}"
        keys += _norm_keys(f"{bv}/LayerNorm_0", f"{ours}.norm1", cfg, bias=cfg.ln_bias)
        if not cfg.parallel:
            keys += _norm_keys(f"{bv}/LayerNorm_1", f"{ours}.norm2", cfg, bias=cfg.ln_bias)
        keys += _attention_keys(
            f"{bv}/MultiHeadDotProductAttention_0",
            f"{ours}.attn",
            cfg,
            qkv_bias=cfg.qkv_bias,
            qk_norm=cfg.qk_norm,
        )
        keys += _mlp_keys(f"{bv}/MlpBlock_0", f"{ours}.mlp")
    if cfg.pool == "map":
        keys.append(("MAPHead_0/probe", "head.probe", "same"))
        keys += _attention_keys(
            "MAPHead_0/MultiHeadDotProductAttention_0", "head", cfg, qkv_bias=True, qk_norm=False
        )
        keys += _norm_keys("MAPHead_0/LayerNorm_0", "head.norm", cfg, bias=True)
        keys += _mlp_keys("MAPHead_0/MlpBlock_0", "head.mlp")
    return keys


def big_vision_config(tree: dict) -> ViTConfig:
    block = "Transformer/encoderblock_0/"
    attn = block + "MultiHeadDotProductAttention_0/"
    kernel = tree["embedding/kernel"]
    width = kernel.shape[-1]
    pool = "map" if "MAPHead_0/probe" in tree else "cls" if "cls" in tree else "gap"
    return ViTConfig(
        width=width,
        depth=len({k.split("/")[1] for k in tree if k.startswith("Transformer/encoderblock_")}),
        heads=tree[attn + "query/kernel"].shape[1],
        mlp=tree[block + "MlpBlock_0/Dense_0/kernel"].shape[1],
        patch=kernel.shape[0],
        image=math.isqrt(tree["pos_embedding"].shape[1]) * kernel.shape[0],
        qk_norm=attn + "query_ln/scale" in tree,
        qkv_bias=attn + "query/bias" in tree,
        ln_bias=block + "LayerNorm_0/bias" in tree,
        parallel=block + "LayerNorm_1/scale" not in tree,
        pool=pool,
        patch_bias="embedding/bias" in tree,
    )


def read_npz(path: str | Path) -> dict[str, torch.Tensor]:
    """A big_vision ``.npz`` as {name: tensor}; a leading ``params/`` is dropped and a scanned
    ``encoderblock`` (stacked along axis 0) is split into ``encoderblock_<i>``."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as npz:
            raw = {k.removeprefix("params/"): torch.from_numpy(npz[k].copy()) for k in npz.files}
    except (OSError, ValueError) as exc:
        raise EvalkitError(f"cannot read {path} as a big_vision .npz: {exc}") from exc
    tree = {}
    for key, value in raw.items():
        if key.startswith("Transformer/encoderblock/"):
            rest = key.removeprefix("Transformer/encoderblock/")
            tree |= {f"Transformer/encoderblock_{i}/{rest}": v for i, v in enumerate(value)}
        else:
            tree[key] = value
    return tree


def from_big_vision(tree: dict[str, torch.Tensor]) -> tuple[dict, ViTConfig]:
    cfg = big_vision_config(tree)
    missing = [bv for bv, _, _ in big_vision_keys(cfg) if bv not in tree]
    if missing:
        raise EvalkitError(f"big_vision tree lacks {missing[:3]} ({len(missing)} keys missing)")
    state = {
        ours: _LAYOUTS[kind][0](tree[bv], cfg).contiguous()
        for bv, ours, kind in big_vision_keys(cfg)
    }
    return state, cfg


def to_big_vision(state: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """The inverse of ``from_big_vision`` (export, and the round-trip test)."""
    return {
        bv: _LAYOUTS[kind][1](state[ours], cfg).contiguous()
        for bv, ours, kind in big_vision_keys(cfg)
    }
