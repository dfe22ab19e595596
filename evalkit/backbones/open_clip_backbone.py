"""``open_clip/<arch>``: an open_clip image tower as the backbone, its text tower exposed.

``open_clip/<arch>:<tag> --pretrained`` reads the tag's published checkpoint from the Hugging
Face cache (``evalkit.backbones.hub``); ``--weights PATH`` a local file; else random weights.

Pools: ``cls`` and ``mean`` over normed intermediates, and ``embed``: the model's own image
embedding (pooled + projected), the space its text tower shares for zero-shot tasks.
"""

from __future__ import annotations

import functools

import torch

from evalkit.backbones.base import (
    WEIGHTS_DRAW,
    BackboneInfo,
    Features,
    Preprocess,
    absolute_layers,
    build_transform,
    check_pool,
    count_params,
    model_input,
    pool_tokens,
    random_init_id,
)
from evalkit.backbones.options import BackboneOptions, rejected_options
from evalkit.errors import EvalkitError, did_you_mean
from evalkit.seeds import seed_global
from evalkit.storage import checkpoints
from evalkit.storage.checkpoints import load_strict, read_state_dict


class OpenClipText:
    """open_clip's tokenizer and text encoder as a ``TextTower``; ``encode`` returns
    L2-normalised embeddings in the space of the image tower's ``embed`` pool. Its zero-shot
    prompts are CLIP's published ones: OpenAI's 80 ImageNet templates filled verbatim."""

    prompt_style = "verbatim"
    default_templates = "openai"

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    @functools.cached_property
    def embed_dim(self) -> int:
        # CLIP and CustomTextCLIP keep the projection in different places; one encode is exact.
        with torch.no_grad():
            return int(self.encode(self.tokenize([""])).shape[-1])

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(next(self.model.parameters()).device)  # the tokenizer gives CPU ids
        return torch.nn.functional.normalize(self.model.encode_text(tokens), dim=-1)


class OpenClipBackbone:
    def __init__(self, model, info: BackboneInfo, text: OpenClipText):
        self.model = model
        self.visual = model.visual
        self.info = info
        self.text = text

    def transform(self, train: bool = False):
        return build_transform(self.info.preprocess, train=train)

    def extract(self, images, *, layers=(-1,), pool="cls", dense=False) -> Features:
        check_pool(self.info, pool)
        images = model_input(images, self.info.preprocess)
        indices = absolute_layers(tuple(layers), self.info.depth)
        out = self.visual.forward_intermediates(
            images,
            indices=indices,
            normalize_intermediates=True,
            output_extra_tokens=True,
            intermediates_only=pool != "embed",
        )
        grids = out["image_intermediates"]
        if pool == "embed":
            pooled = out["image_features"]
        else:
            prefixes = out.get("image_intermediates_prefix") or [None] * len(grids)
            pooled = torch.cat(
                [pool_tokens(p, g, pool) for p, g in zip(prefixes, grids, strict=True)], dim=1
            )
        return Features(pooled=pooled, grids=grids if dense else None)


# open_clip's shape switches; its loader options (pretrained*, load_weights, cache_dir,
# weights_only…) and device/precision/jit (set by evalkit) are refused.
MODEL_OPTIONS = frozenset(
    {
        "force_image_size",
        "force_patch_dropout",
        "force_quick_gelu",
        "force_custom_text",
        "force_context_length",
    }
)


def build(variant: str, opts: BackboneOptions) -> OpenClipBackbone:
    try:
        import open_clip
    except ImportError as exc:
        raise EvalkitError(
            "open_clip backbones need open_clip_torch: pip install 'evalkit[clip]'"
        ) from exc
    arch = variant.partition(":")[0]
    if arch not in open_clip.list_models():
        hint = did_you_mean(arch, open_clip.list_models(), "evalkit ls models open_clip")
        raise EvalkitError(f"unknown open_clip model {arch!r}: {hint}")
    model, weights_id = _create(open_clip, variant, opts)
    if not hasattr(model.visual, "forward_intermediates"):
        raise EvalkitError(f"open_clip/{variant}: its image tower has no forward_intermediates")
    model.eval().requires_grad_(False).to(opts.device)
    info = _info(f"open_clip/{variant}", model, weights_id)
    return OpenClipBackbone(model, info, OpenClipText(model, open_clip.get_tokenizer(arch)))


def _create(open_clip, variant: str, opts: BackboneOptions):
    arch, _, tag = variant.partition(":")
    with torch.random.fork_rng():
        seed_global(opts.seed, WEIGHTS_DRAW)
        with rejected_options(f"open_clip/{arch}", opts.model_kwargs):
            model = open_clip.create_model(arch, pretrained=None, **opts.model_kwargs)
    if opts.pretrained:
        return model, _load_from_hub(open_clip, model, arch, tag, opts.revision)
    if tag:
        raise EvalkitError(
            f"open_clip/{variant} names hub weights: add --pretrained (or drop :{tag})"
        )
    if opts.weights is None:
        return model, random_init_id(
            f"open_clip/{variant}", opts.seed, opts.model_kwargs, WEIGHTS_DRAW
        )
    load_strict(model, read_state_dict(opts.weights), source=opts.weights)
    return model, checkpoints.weights_id(opts.weights)


def _load_from_hub(open_clip, model, arch: str, tag: str, revision: str | None = None) -> str:
    """The weights of open_clip's ``<arch>:<tag>`` from its hub repository in the cache,
    through the safe reader; preprocessing from the repository's ``open_clip_config.json``,
    else open_clip's record of the tag. Returns the weights id."""
    from evalkit.backbones import hub

    cfg = open_clip.get_pretrained_cfg(arch, tag) if tag else {}
    if not cfg.get("hf_hub"):
        known = ", ".join(open_clip.list_pretrained_tags_by_model(arch)) or "none"
        raise EvalkitError(
            f"open_clip/{arch}:{tag or '<tag>'} is not a hub checkpoint open_clip knows "
            f"(tags of {arch}: {known}); or pass --weights PATH"
        )
    parts = cfg["hf_hub"].split("/")  # "<org>/<name>/" or "<org>/<name>/<file>"
    repo, named = "/".join(parts[:2]), "/".join(parts[2:])
    files = (named,) if named else ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    path = hub.cached_file(repo, files, backbone=f"open_clip/{arch}:{tag}", revision=revision)
    load_strict(model, read_state_dict(path), source=path)
    own = hub.cached_json(repo, "open_clip_config.json", revision).get("preprocess_cfg", {})
    preprocessing = {k: cfg[k] for k in ("mean", "std", "interpolation") if k in cfg} | own
    model.visual.preprocess_cfg = {**getattr(model.visual, "preprocess_cfg", {}), **preprocessing}
    return checkpoints.weights_id(path)


def _info(name: str, model, weights_id: str) -> BackboneInfo:
    visual = model.visual
    cfg = getattr(visual, "preprocess_cfg", {})
    size = visual.image_size if isinstance(visual.image_size, int) else visual.image_size[-1]
    patch = getattr(visual, "patch_size", (0, 0))
    has_cls = getattr(visual, "class_embedding", None) is not None
    return BackboneInfo(
        name=name,
        weights_id=weights_id,
        embed_dim=visual.transformer.width,
        patch_size=int(patch[0]) if isinstance(patch, tuple) else int(patch),
        depth=len(visual.transformer.resblocks),
        num_prefix_tokens=1 if has_cls else 0,
        params=count_params(visual),
        preprocess=open_clip_preprocess(name, cfg, int(size)),
        pools=(("cls",) if has_cls else ()) + ("mean", "embed"),
        random_init=weights_id.startswith("random-init"),
    )


RESIZE_MODES = {"shortest": "center", "squash": "squash"}  # open_clip's → evalkit's crop mode


def open_clip_preprocess(name: str, cfg: dict, size: int) -> Preprocess:
    """open_clip's eval transform (``image_transform``) as evalkit's view: ``shortest`` resizes
    the shorter side and centre-crops, ``squash`` resizes both sides; its ``longest`` (resize
    the longer side, then pad) is refused by name. Interpolation other than ``bilinear`` is
    bicubic there (``random`` included)."""
    mode = cfg.get("resize_mode") or "shortest"
    if mode not in RESIZE_MODES:
        raise EvalkitError(
            f"{name}: its preprocessing has resize_mode={mode!r} (evalkit reproduces "
            f"{' and '.join(RESIZE_MODES)}), so evalkit cannot give the pixels open_clip's own "
            "transform gives"
        )
    return Preprocess(
        size=size,
        crop_pct=1.0,
        interpolation="bilinear" if cfg.get("interpolation") == "bilinear" else "bicubic",
        mean=tuple(cfg.get("mean", (0.48145466, 0.4578275, 0.40821073))),
        std=tuple(cfg.get("std", (0.26862954, 0.26130258, 0.27577711))),
        crop_mode=RESIZE_MODES[mode],
    )
