"""Backbone families and ``load_backbone``: ``<family>/<variant>`` → a Backbone.

Families are registry entries, so listing them imports nothing heavy; plugins add families
through the ``evalkit.backbones`` entry-point group (a callable ``build(variant, opts)``).
"""

from __future__ import annotations

from evalkit.backbones.options import BackboneOptions
from evalkit.errors import EvalkitError
from evalkit.registry import Registry

BACKBONES = Registry("backbone family", "evalkit.backbones")
BACKBONES.add("timm", "evalkit.backbones.timm_backbone:build", "any timm model: timm/<model_name>")
BACKBONES.add(
    "open_clip",
    "evalkit.backbones.open_clip_backbone:build",
    "an open_clip image tower, text tower exposed: open_clip/<arch>",
)
BACKBONES.add("fake", "evalkit.backbones.fake:build", "tiny deterministic backbone for tests")

EXAMPLES = {
    "timm": "timm/vit_tiny_patch16_224, timm/vit_small_patch16_224, timm/resnet50",
    "open_clip": "open_clip/ViT-B-32, open_clip/ViT-B-16",
    "fake": "fake",
}


def load_backbone(spec: str, opts: BackboneOptions | None = None):
    """Build the backbone named ``spec`` (e.g. ``timm/vit_tiny_patch16_224``)."""
    family, _, variant = spec.partition("/")
    build = BACKBONES.get(family).load()
    if family != "fake" and not variant:
        raise EvalkitError(
            f"backbone {spec!r} needs a variant: {family}/<name>, e.g. {EXAMPLES.get(family, '')}"
        )
    return build(variant, opts or BackboneOptions())
