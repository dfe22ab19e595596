"""``timm/<name>``: any timm model as a frozen feature extractor.

Preprocessing comes from the model's ``pretrained_cfg``; features from ``forward_intermediates``
(normed intermediates, prefix tokens for ``cls`` pooling, the model's attention-pool head for
``map``). Without ``--weights`` the model is randomly initialised from the seed, and says so;
``--pretrained`` with ``timm/<model>.<tag>`` reads the tag's checkpoint from the Hugging Face
cache (``evalkit.backbones.hub``), its weights id the file's content id.
"""

from __future__ import annotations

import torch

from evalkit.backbones.base import (
    WEIGHTS_DRAW,
    BackboneInfo,
    Features,
    Preprocess,
    build_transform,
    count_params,
    model_input,
    pool_tokens,
    random_init_id,
    resolve_layers,
)
from evalkit.backbones.options import BackboneOptions, rejected_options
from evalkit.errors import EvalkitError, did_you_mean
from evalkit.seeds import seed_global
from evalkit.storage import checkpoints
from evalkit.storage.checkpoints import load_strict, read_state_dict

# Architecture and shape options of timm's ViT, ConvNeXt and ResNet constructors; everything
# that names weights (checkpoint_path, pretrained_cfg_overlay, cache_dir…) is refused.
MODEL_OPTIONS = frozenset(
    {
        "img_size",
        "patch_size",
        "global_pool",
        "class_token",
        "reg_tokens",
        "no_embed_class",
        "dynamic_img_size",
        "dynamic_img_pad",
        "pos_embed",
        "embed_dim",
        "depth",
        "num_heads",
        "num_classes",  # 1000 keeps the ImageNet head (model-vs-human's classifier=own)
        "mlp_ratio",
        "qkv_bias",
        "qk_norm",
        "proj_bias",
        "init_values",
        "pre_norm",
        "final_norm",
        "fc_norm",
        "pool_include_prefix",
        "drop_rate",
        "pos_drop_rate",
        "patch_drop_rate",
        "proj_drop_rate",
        "attn_drop_rate",
        "drop_path_rate",
        "drop_block_rate",
        "output_stride",
        "act_layer",
        "norm_layer",
        "ls_init_value",
        "head_hidden_size",
    }
)


class TimmBackbone:
    def __init__(self, model: torch.nn.Module, info: BackboneInfo):
        self.model = model
        self.info = info
        self._tokens = hasattr(model, "num_prefix_tokens") and hasattr(model, "blocks")

    def transform(self, train: bool = False):
        return build_transform(self.info.preprocess, train=train)

    def extract(self, images, *, layers=(-1,), pool="cls", dense=False) -> Features:
        indices = resolve_layers(self.info, layers, pool, map_head="attention-pool head")
        images = model_input(images, self.info.preprocess)
        final, intermediates = self._forward(images, indices, need_final=pool == "map")
        if self._tokens:
            grids = [grid for grid, _ in intermediates]
            prefixes = [prefix for _, prefix in intermediates]
        else:
            grids, prefixes = list(intermediates), [None] * len(intermediates)
        if pool == "map":
            pooled = self.model.forward_head(final, pre_logits=True)
        else:
            pooled = torch.cat(
                [pool_tokens(p, g, pool) for p, g in zip(prefixes, grids, strict=True)], dim=1
            )
        return Features(pooled=pooled, grids=grids if dense else None)

    @property
    def has_imagenet_head(self) -> bool:
        """Whether the model kept a 1000-class head (built with ``num_classes=1000``)."""
        return getattr(self.model, "num_classes", 0) == 1000

    def imagenet_logits(self, images) -> torch.Tensor:
        """The model's own ImageNet-1k logits (``has_imagenet_head``)."""
        return self.model(model_input(images, self.info.preprocess))

    def _forward(self, images, indices, *, need_final: bool):
        kwargs = {"indices": indices, "intermediates_only": not need_final}
        if self._tokens:
            kwargs |= {"return_prefix_tokens": True, "norm": True}
        out = self.model.forward_intermediates(images, **kwargs)
        return out if need_final else (None, out)


def check_model(variant: str) -> None:
    """``variant`` (``<model>`` or ``<model>.<tag>``) is a model timm can build."""
    import timm

    if not timm.is_model(variant):
        hint = did_you_mean(variant, timm.list_models(), "evalkit ls models timm")
        raise EvalkitError(f"unknown timm model {variant!r}: {hint}")


def build(variant: str, opts: BackboneOptions) -> TimmBackbone:
    import timm

    check_model(variant)
    model, weights_id = _create(timm, variant, opts)
    model.eval().requires_grad_(False).to(opts.device)
    return TimmBackbone(model, _info(timm, f"timm/{variant}", model, weights_id))


def _create(timm, variant: str, opts: BackboneOptions):
    kwargs = {"num_classes": 0, **opts.model_kwargs}
    if opts.pretrained:
        return _from_hub(timm, variant, kwargs, opts.revision)
    with torch.random.fork_rng():
        seed_global(opts.seed, WEIGHTS_DRAW)
        with rejected_options(f"timm/{variant}", opts.model_kwargs):
            model = timm.create_model(variant, pretrained=False, **kwargs)
    if opts.weights is None:
        return model, random_init_id(f"timm/{variant}", opts.seed, opts.model_kwargs, WEIGHTS_DRAW)
    head = model.pretrained_cfg.get("classifier") or "head"
    heads = (head,) if isinstance(head, str) else tuple(head)
    # a model built with a head must get the checkpoint's head, never keep a random one
    skip = heads if kwargs["num_classes"] == 0 else ()
    load_strict(model, read_state_dict(opts.weights), source=opts.weights, skip=skip)
    return model, checkpoints.weights_id(opts.weights)


# What of a hub checkpoint's own ``config.json`` decides how images are prepared.
PREPROCESSING = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")


def _from_hub(timm, variant: str, kwargs: dict, revision: str | None = None):
    """``variant`` (``<model>.<tag>``) with the weights its hub repository holds, read from
    the cache through the safe reader and loaded by timm (its filters for the architecture
    and its classifier handling); preprocessing from the repository's ``config.json``."""
    from evalkit.backbones import hub

    cfg = timm.models.get_pretrained_cfg(variant)
    repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not repo:
        raise EvalkitError(
            f"timm/{variant} has no hub checkpoint: name one with its tag "
            f"(timm/<model>.<tag>, `timm.list_pretrained('{variant.split('.')[0]}*')`) "
            "or pass --weights PATH"
        )
    path = hub.cached_file(
        repo,
        ("model.safetensors", "pytorch_model.bin"),
        backbone=f"timm/{variant}",
        revision=revision,
    )
    own = hub.cached_json(repo, "config.json", revision).get("pretrained_cfg", {})
    overlay = {k: own[k] for k in PREPROCESSING if k in own}
    overlay["state_dict"] = read_state_dict(path)
    model = timm.create_model(variant, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    model.pretrained_cfg.pop("state_dict", None)
    return model, checkpoints.weights_id(path)


def _info(timm, name: str, model, weights_id: str) -> BackboneInfo:
    cfg = timm.data.resolve_data_config({}, model=model)
    pools = ("mean",)
    if getattr(model, "cls_token", None) is not None:
        pools = ("cls", "mean")
    if getattr(model, "attn_pool", None) is not None:
        pools += ("map",)
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", (0,))
    return BackboneInfo(
        name=name,
        weights_id=weights_id,
        embed_dim=model.num_features,
        patch_size=int(patch[0]) if isinstance(patch, tuple) else int(patch),
        depth=len(model.feature_info) if hasattr(model, "feature_info") else len(model.blocks),
        num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 0)),
        params=count_params(model),
        preprocess=timm_preprocess(name, cfg, _input_size(model, cfg)),
        pools=pools,
        random_init=weights_id.startswith("random-init"),
    )


def _input_size(model, cfg) -> tuple[int, int]:
    """The (height, width) the model was built for: ``img_size=`` overrides its pretrained
    config."""
    built = getattr(getattr(model, "patch_embed", None), "img_size", None)
    height, width = built[-2:] if built else cfg["input_size"][-2:]
    return int(height), int(width)


CROP_MODES = ("center", "squash")  # timm's eval transform modes evalkit's view reproduces


def timm_preprocess(name: str, cfg: dict, size: tuple[int, int]) -> Preprocess:
    """timm's eval transform for ``cfg`` (a resolved data config) at (height, width) ``size``
    as evalkit's view: the same resize, crop mode, crop fraction and interpolation, so the
    pixels equal ``timm.data.create_transform(**cfg)``'s. What the view cannot reproduce — a
    ``border`` crop (resize the longer side, pad), a non-square input, a border trim — is
    refused by name, never approximated."""
    mode = cfg.get("crop_mode") or "center"
    problem = None
    if mode not in CROP_MODES:
        problem = f"crop_mode={mode!r} (evalkit reproduces {' and '.join(CROP_MODES)})"
    elif size[0] != size[1]:
        problem = f"a non-square input {size[0]}×{size[1]} (evalkit's views are square)"
    elif cfg.get("crop_border_pixels"):
        problem = f"crop_border_pixels={cfg['crop_border_pixels']} (not reproduced)"
    if problem:
        raise EvalkitError(
            f"{name}: its preprocessing has {problem}, so evalkit cannot give the pixels timm's "
            "own transform gives: use another tag, or --model-arg img_size=N for a square size"
        )
    return Preprocess(
        size=size[0],
        crop_pct=float(cfg.get("crop_pct") or 0.875),
        interpolation=cfg["interpolation"],
        mean=tuple(cfg["mean"]),
        std=tuple(cfg["std"]),
        crop_mode=mode,
    )
