"""``none``: the backbone of tasks that train their own models (the stability and efficiency
ablations); ``evalkit run`` uses it when such tasks are run without ``--backbone``. It has no
weights and no features: a task that asks it for features gets a one-line error."""

from __future__ import annotations

from evalkit.backbones.base import BackboneInfo
from evalkit.backbones.options import BackboneOptions
from evalkit.errors import EvalkitError

MODEL_OPTIONS = frozenset()  # no model to build


class NoBackbone:
    info = BackboneInfo(
        name="none",
        weights_id="none",
        embed_dim=0,
        patch_size=0,
        depth=0,
        num_prefix_tokens=0,
        params=0,
        pools=(),
    )

    def transform(self, train: bool = False):
        raise EvalkitError("backbone none has no preprocessing: this task needs --backbone")

    def extract(self, images, *, layers=(-1,), pool="cls", dense=False):
        raise EvalkitError("backbone none has no features: this task needs --backbone")


def build(variant: str, opts: BackboneOptions) -> NoBackbone:
    if variant:
        raise EvalkitError(f"backbone none takes no variant, got none/{variant}")
    return NoBackbone()
