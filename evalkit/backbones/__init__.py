"""Backbone families and ``load_backbone``: ``<family>/<variant>`` → a Backbone.

Families are registry entries, so listing them imports nothing heavy; plugins add families
through the ``evalkit.backbones`` entry-point group (a callable ``build(variant, opts)``).

Modules: ``base`` (the Backbone and text-tower protocols, features, preprocessing), ``options``
(what every adapter accepts), ``timm_backbone``, ``open_clip_backbone``, ``vit22b`` (the
built-in family), ``fake`` (tests and demos), ``none`` (tasks that train their own models) and
``hub`` (checkpoints from the Hugging Face cache)."""

from __future__ import annotations

from dataclasses import replace

from evalkit.backbones.options import BackboneOptions, check_model_options, declared_options
from evalkit.errors import EvalkitError
from evalkit.registry import Registry

BACKBONES = Registry("backbone family", "evalkit.backbones")
BACKBONES.add("timm", "evalkit.backbones.timm_backbone:build", "any timm model: timm/<model_name>")
BACKBONES.add(
    "open_clip",
    "evalkit.backbones.open_clip_backbone:build",
    "an open_clip image tower, text tower exposed: open_clip/<arch>",
)
BACKBONES.add(
    "vit22b",
    "evalkit.backbones.vit22b:build",
    "built-in ViT-22B family, shardable with --tp: vit22b or vit22b/<size>",
)
BACKBONES.add("fake", "evalkit.backbones.fake:build", "tiny deterministic backbone for tests")
BACKBONES.add(
    "none", "evalkit.backbones.none:build", "no backbone: for tasks that train their own models"
)

EXAMPLES = {
    "timm": "timm/vit_tiny_patch16_224, timm/vit_small_patch16_224, timm/resnet50",
    "open_clip": "open_clip/ViT-B-32, open_clip/ViT-B-16",
    "vit22b": "vit22b (22b), vit22b/e, vit22b/g, vit22b/l, vit22b/b, vit22b/s, vit22b/test",
    "fake": "fake",
    "none": "none",
}
NEEDS_VARIANT = ("timm", "open_clip")
DEFAULT_VARIANT = {"vit22b": "22b"}  # the variant a spec without one gets


def row_weights_id(spec: str, path) -> str:
    """The weights id a run's rows carry for ``spec`` loading ``path``: the built-in family
    reads safetensors checkpoints (a file, a folder or a shard index) and ids them over every
    file; the other families load one file and id its bytes."""
    from evalkit.storage import checkpoints

    if spec.partition("/")[0] == "vit22b":
        return checkpoints.SafetensorsSource(path).weights_id()
    return checkpoints.weights_id(path)


def row_name(spec: str) -> str:
    """The backbone name a run's rows carry for ``spec`` (``vit22b`` → ``vit22b/22b``)."""
    family, _, variant = spec.partition("/")
    variant = variant or DEFAULT_VARIANT.get(family, "")
    return f"{family}/{variant}" if variant else family


BUILT_FROM_SEED = frozenset({"fake", "none"})  # backbones with no weights file to read


def check_backbone_name(spec: str) -> tuple[str, str]:
    """(family, variant) of ``spec``: a registered family, with a variant where the family
    needs one. Nothing is imported, so a typo is refused before torch loads."""
    family, _, variant = spec.partition("/")
    BACKBONES.get(family)
    if family in NEEDS_VARIANT and not variant.partition("@")[0]:
        raise EvalkitError(
            f"backbone {spec!r} needs a variant: {family}/<name>, e.g. {EXAMPLES.get(family, '')}"
        )
    return family, variant


def check_backbone_model(spec: str) -> None:
    """That the model ``spec`` names exists where its family can tell without building it
    (timm's list of models), so a misspelt model fails before any data is written."""
    family, variant = check_backbone_name(spec)
    if family == "timm":
        from evalkit.backbones.timm_backbone import check_model

        check_model(variant.partition("@")[0])


def load_backbone(spec: str, opts: BackboneOptions | None = None):
    """Build the backbone named ``spec`` (e.g. ``timm/vit_tiny_patch16_224``)."""
    family, variant = check_backbone_name(spec)
    variant, pinned, revision = variant.partition("@")
    build = BACKBONES.get(family).load()
    from evalkit import distributed

    if distributed.current().tp_size > 1 and family != "vit22b":
        raise EvalkitError(
            f"--tp shards the built-in vit22b family only; {spec} runs data-parallel (drop --tp)"
        )
    opts = opts or BackboneOptions()
    if pinned:
        opts = replace(opts, revision=_checked_revision(spec, family, revision, opts))
    if opts.weights and family in BUILT_FROM_SEED:
        raise EvalkitError(
            f"{spec} loads no weights (it is built from the seed): drop --weights, or name a "
            "backbone that takes them (timm/…, open_clip/…, vit22b/…)"
        )
    check_model_options(family, declared_options(build), opts.model_kwargs)
    backbone = build(variant, opts)
    # The options reach every key through the info, whatever the adapter does with them.
    backbone.info = replace(
        backbone.info,
        options=dict(sorted(opts.model_kwargs.items())),
        source=_source(backbone.info, opts),
    )
    if pinned:
        backbone.info = replace(backbone.info, name=f"{backbone.info.name}@{revision}")
    return backbone


def _checked_revision(spec: str, family: str, revision: str, opts: BackboneOptions) -> str:
    """``NAME@REVISION`` pins hub weights: only with --pretrained, only where the hub has them."""
    if family not in ("timm", "open_clip") or not revision:
        raise EvalkitError(
            f"{spec}: @REVISION pins the hub weights of timm/… and open_clip/… "
            "backbones, e.g. timm/vit_base_patch16_224.augreg_in21k@main"
        )
    if not opts.pretrained:
        raise EvalkitError(
            f"{spec}: @{revision} names a hub revision of the published weights: add --pretrained"
        )
    return revision


def _source(info, opts: BackboneOptions) -> str:
    """Where the weights came from, as the row records it (``weights_source``)."""
    from evalkit.backbones import hub

    if opts.pretrained:
        return hub.resolved(info.name) or "hub"
    if opts.weights:
        return f"local file {opts.weights}"
    return "random init" if info.random_init else info.source
