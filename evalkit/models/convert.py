"""Checkpoint conversion into and out of the ViT-22B family's layout, with explicit key maps
that account for every key.

Sources: timm's parallel/QK-norm ViTs (``vit_*_xp_*``: fused ``in_proj`` = [MLP-in, Q, K, V],
RMSNorm, class token; MAP pooling ``attn_pool.*``, ``fc_norm``, ``norm_pre``) and big_vision-style
parameter trees saved as ``.npz`` (``/``-separated names; Dense kernels stored (in, out);
attention kernels (D, heads, head_dim); per-block or scanned ``encoderblock``). Each converter
reads the model switches from the tree; ``evalkit.storage.checkpoints.save_checkpoint`` writes them into
the checkpoint's metadata, so ``--weights`` alone rebuilds the model.

Every source key is mapped, or named on the converter's short list of keys dropped on purpose
(``TIMM_DROPPED``, ``BIG_VISION_DROPPED``: classifiers, which a feature extractor does not use);
any other key is an error naming it, and so is a parameter the target needs that the source
lacks. What a big_vision tree has no names for (norm kind, pooling) travels in the ``.npz`` as a JSON
string under ``CONFIG_ENTRY``; what cannot travel (a pre-norm, a norm after pooling) makes the
export refuse, naming the parameter.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from evalkit.errors import EvalkitError
from evalkit.models.vit22b import ViTConfig

TIMM_DROPPED = ("head.weight", "head.bias")  # the classifier
BIG_VISION_DROPPED = ("head/kernel", "head/bias")  # the classifier
CONFIG_ENTRY = "evalkit/config"


class Converted(NamedTuple):
    state: dict[str, torch.Tensor]
    config: ViTConfig
    dropped: list[str]  # source keys left out on purpose


class Ledger:
    """The keys of a source, and which of them a converter has used."""

    def __init__(self, source: dict, *, name: str, dropped: tuple[str, ...]):
        self.source, self.name, self.used = source, name, set()
        self.dropped = sorted(k for k in source if k in dropped)

    def take(self, key: str):
        if key not in self.source:
            raise EvalkitError(f"{self.name} lacks {key}, which the converted model needs")
        self.used.add(key)
        return self.source[key]

    def check_all_used(self):
        left = sorted(set(self.source) - self.used - set(self.dropped))
        if left:
            raise EvalkitError(
                f"{self.name} has {len(left)} keys the family cannot express: "
                f"{', '.join(left[:4])}{' …' if len(left) > 4 else ''} (nothing was written)"
            )


def check_produces(state: dict, cfg: ViTConfig, *, name: str):
    """Every parameter of ``cfg``'s model is in ``state``, with its shape."""
    from evalkit.models.vit22b import ViT

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in ViT(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(state))
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    if missing or wrong:
        raise EvalkitError(
            f"{name}: the converted model misses {missing[:3]} ({len(missing)}) and has "
            f"wrong shapes for {wrong[:3]} ({len(wrong)})"
        )


# --- timm vit_*_xp_* -------------------------------------------------------------------------


def timm_xp_config(state: dict[str, torch.Tensor], pool_include_prefix: bool | None) -> ViTConfig:
    """The switches a timm xp state dict shows. Pooling: ``attn_pool`` → MAP; ``fc_norm`` →
    average (timm puts the final norm after an average pool); else a class token → that
    token; else average. Whether a MAP or average pool takes the class token in (timm's
    ``pool_include_prefix``) no state dict shows: with a class token it must be said."""
    width = state["pos_embed"].shape[-1]
    patch = state["patch_embed.proj.weight"].shape[-1]
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    has_cls, fc_norm = "cls_token" in state, "fc_norm.weight" in state
    pool = "cls" if has_cls and not fc_norm else "gap"
    pool = "map" if "attn_pool.latent" in state else pool
    if has_cls and pool != "cls" and pool_include_prefix is None:
        raise EvalkitError(
            f"this timm checkpoint pools ({pool}) beside a class token, and its state dict cannot "
            "show whether the pool takes that token in (timm's pool_include_prefix): pass "
            "--pool-include-prefix no (timm's default) or yes"
        )
    return ViTConfig(
        width=width,
        depth=depth,
        heads=width // state["blocks.0.q_norm.weight"].shape[0],
        mlp=state["blocks.0.in_proj.weight"].shape[0] - 3 * width,
        patch=patch,
        image=math.isqrt(state["pos_embed"].shape[1]) * patch,
        qkv_bias="blocks.0.in_proj.bias" in state,
        pool=pool,
        norm="rms",  # every timm xp model uses RmsNorm
        pre_norm="norm_pre.weight" in state,
        patch_bias="patch_embed.proj.bias" in state,
        class_token=has_cls,
        fc_norm=fc_norm,
        pool_prefix=bool(has_cls and pool != "cls" and pool_include_prefix),
    )


TIMM_RENAMES = {
    "patch_embed.proj.weight": "patch_embed.weight",
    "patch_embed.proj.bias": "patch_embed.bias",
    "pos_embed": "pos_embed",
    "cls_token": "cls_token",
    "norm_pre.weight": "norm_pre.weight",
    "norm.weight": "norm.weight",
    "fc_norm.weight": "fc_norm.weight",
    "attn_pool.latent": "head.probe",
    "attn_pool.q.weight": "head.q.weight",
    "attn_pool.q.bias": "head.q.bias",
    "attn_pool.proj.weight": "head.out.weight",
    "attn_pool.proj.bias": "head.out.bias",
    "attn_pool.norm.weight": "head.norm.weight",
    "attn_pool.mlp.fc1.weight": "head.mlp.fc1.weight",
    "attn_pool.mlp.fc1.bias": "head.mlp.fc1.bias",
    "attn_pool.mlp.fc2.weight": "head.mlp.fc2.weight",
    "attn_pool.mlp.fc2.bias": "head.mlp.fc2.bias",
}


def from_timm_xp(
    state: dict[str, torch.Tensor], *, pool_include_prefix: bool | None = None
) -> Converted:
    """A timm ``vit_*_xp_*`` state dict → our state dict, config and the keys dropped;
    ``pool_include_prefix`` is the timm model's switch of that name (see ``timm_xp_config``)."""
    if "blocks.0.in_proj.weight" not in state:
        raise EvalkitError(
            "not a timm parallel-block ViT checkpoint (no blocks.0.in_proj.weight): expected "
            "a vit_*_xp_* state dict"
        )
    cfg = timm_xp_config(state, pool_include_prefix)
    ledger = Ledger(state, name="timm checkpoint", dropped=TIMM_DROPPED)
    out = {new: ledger.take(old) for old, new in TIMM_RENAMES.items() if old in state}
    for prefix in ("weight", "bias"):
        if f"attn_pool.kv.{prefix}" in state:  # fused [K, V]
            key, value = ledger.take(f"attn_pool.kv.{prefix}").chunk(2)
            out |= {f"head.k.{prefix}": key, f"head.v.{prefix}": value}
    for i in range(cfg.depth):
        out |= _timm_xp_block(ledger, f"blocks.{i}.", cfg)
    ledger.check_all_used()
    out = {k: t.contiguous() for k, t in out.items()}
    check_produces(out, cfg, name="timm checkpoint")
    return Converted(out, cfg, ledger.dropped)


def _timm_xp_block(ledger: Ledger, p: str, cfg: ViTConfig) -> dict:
    """One ParallelScalingBlock: ``in_proj`` = [MLP-in, Q, K, V]; with QKV biases its bias is
    [MLP-in, Q, K, V] too, otherwise the MLP-in bias is ``mlp_bias``."""
    take, split = ledger.take, [cfg.mlp] + [cfg.width] * 3
    mlp_in, q, k, v = torch.split(take(p + "in_proj.weight"), split)
    out = {
        p + "norm1.weight": take(p + "in_norm.weight"),
        p + "mlp.fc1.weight": mlp_in,
        p + "attn.q.weight": q,
        p + "attn.k.weight": k,
        p + "attn.v.weight": v,
        p + "attn.q_norm.weight": take(p + "q_norm.weight"),
        p + "attn.k_norm.weight": take(p + "k_norm.weight"),
        p + "attn.out.weight": take(p + "attn_out_proj.weight"),
        p + "attn.out.bias": take(p + "attn_out_proj.bias"),
        p + "mlp.fc2.weight": take(p + "mlp_out_proj.weight"),
        p + "mlp.fc2.bias": take(p + "mlp_out_proj.bias"),
    }
    if cfg.qkv_bias:
        mlp_bias, q_bias, k_bias, v_bias = torch.split(take(p + "in_proj.bias"), split)
        out |= {p + "attn.q.bias": q_bias, p + "attn.k.bias": k_bias, p + "attn.v.bias": v_bias}
    else:
        mlp_bias = take(p + "mlp_bias")
    return out | {p + "mlp.fc1.bias": mlp_bias}


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
    if cfg.prefix_tokens:
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
        keys += _norm_keys("MAPHead_0/LayerNorm_0", "head.norm", cfg, bias=cfg.norm == "layer")
        keys += _mlp_keys("MAPHead_0/MlpBlock_0", "head.mlp")
    return keys


def big_vision_config(tree: dict) -> ViTConfig:
    """The switches a tree shows, and those its ``CONFIG_ENTRY`` states (the norm kind, and
    the pooling where a class token could be pooled or averaged over)."""
    saved = json.loads(tree.get(CONFIG_ENTRY, "{}"))
    block = "Transformer/encoderblock_0/"
    attn = block + "MultiHeadDotProductAttention_0/"
    kernel = tree["embedding/kernel"]
    width = kernel.shape[-1]
    pool = "map" if "MAPHead_0/probe" in tree else "cls" if "cls" in tree else "gap"
    pool = saved.get("pool", pool)  # a class token may be there and still be averaged over
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
        norm=saved.get("norm", "layer"),
        class_token="cls" in tree,
    )


def read_npz(path: str | Path) -> dict:
    """A big_vision ``.npz`` as {name: tensor} (and ``CONFIG_ENTRY`` as its JSON string); a
    leading ``params/`` is dropped and a scanned ``encoderblock`` (stacked along axis 0) is
    split into ``encoderblock_<i>``. Never unpickles."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as npz:
            raw = {k.removeprefix("params/"): npz[k].copy() for k in npz.files}
    except (OSError, ValueError) as exc:
        raise EvalkitError(f"cannot read {path} as a big_vision .npz: {exc}") from exc
    tree = {}
    for key, value in raw.items():
        if key == CONFIG_ENTRY:
            tree[key] = str(value)
        elif key.startswith("Transformer/encoderblock/"):
            rest = key.removeprefix("Transformer/encoderblock/")
            tree |= {
                f"Transformer/encoderblock_{i}/{rest}": torch.from_numpy(v.copy())
                for i, v in enumerate(value)
            }
        else:
            tree[key] = torch.from_numpy(value)
    return tree


def write_npz(tree: dict, path: str | Path) -> Path:
    """The inverse of ``read_npz`` for a tree of per-block keys."""
    import numpy as np

    arrays = {k: np.array(v) if isinstance(v, str) else v.numpy() for k, v in tree.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def from_big_vision(tree: dict, *, norm: str | None = None) -> Converted:
    """A big_vision tree → our state dict, config and the keys dropped. A tree does not show
    whether its norms centre: ``norm`` says so (else the tree's ``CONFIG_ENTRY``, else
    ``layer``, big_vision's LayerNorm)."""
    cfg = big_vision_config(tree)
    if norm is not None:
        cfg = replace(cfg, norm=norm)
    ledger = Ledger(tree, name="big_vision tree", dropped=BIG_VISION_DROPPED)
    if CONFIG_ENTRY in tree:
        ledger.take(CONFIG_ENTRY)
    state = {
        ours: _LAYOUTS[kind][0](ledger.take(bv), cfg).contiguous()
        for bv, ours, kind in big_vision_keys(cfg)
    }
    ledger.check_all_used()
    return Converted(state, cfg, ledger.dropped)


# What a big_vision tree cannot hold: the export refuses, naming the parameter.
NOT_IN_BIG_VISION = {
    "pre_norm": "norm_pre.weight",
    "fc_norm": "fc_norm.weight",
    "pool_prefix": "a pool over the class token",
}


def to_big_vision(state: dict[str, torch.Tensor], cfg: ViTConfig) -> dict:
    """The inverse of ``from_big_vision``: every parameter of ``state`` gets a big_vision
    name, the norm kind and pooling go into ``CONFIG_ENTRY``; a model with a parameter a big_vision tree
    has no place for is refused."""
    for switch, parameter in NOT_IN_BIG_VISION.items():
        if getattr(cfg, switch):
            raise EvalkitError(
                f"a big_vision tree has no place for {parameter} ({switch}=true): export refused"
            )
    ledger = Ledger(state, name="evalkit checkpoint", dropped=())
    tree = {
        bv: _LAYOUTS[kind][1](ledger.take(ours), cfg).contiguous()
        for bv, ours, kind in big_vision_keys(cfg)
    }
    ledger.check_all_used()
    return tree | {CONFIG_ENTRY: json.dumps({"norm": cfg.norm, "pool": cfg.pool})}
