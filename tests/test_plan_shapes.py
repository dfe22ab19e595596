"""The planner sizes any backbone from what it really produces: one forward pass of one image
gives the pooled width, the largest activation and the FLOPs, so a CNN is not sized as a
transformer with one token per pixel."""

from __future__ import annotations

import pytest
import torch

from evalkit.backbones import load_backbone
from evalkit.backbones.options import BackboneOptions
from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.core.costs import unfit
from evalkit.core.shapes import measured_shape
from evalkit.core.task import PlanInputs, extraction_stage
from evalkit.data import DataConfig
from evalkit.data.resolve import open_dataset

ROWS = 48


@pytest.mark.parametrize(
    "spec",
    ["timm/resnet18", "timm/convnext_atto", "timm/vit_tiny_patch16_224", "open_clip/Tiny-Test"],
)
def test_predicted_feature_bytes_match_what_extraction_writes(
    spec, tiny_clip_registered, data_cache, tmp_path
):
    backbone = load_backbone(spec, BackboneOptions(random_init=True))
    shape = measured_shape(backbone, dtype="fp32")
    predicted = extraction_stage(PlanInputs(shape, {"train": ROWS}, 2), ROWS).cache_bytes
    dataset = open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache),
        transform=backbone.transform(),
    )
    settings = ExtractSettings(cache_dir=tmp_path, batch_size=16, shard_size=32, progress=False)
    request = FeatureRequest(pool=backbone.info.pools[0])
    feats = extract_features(
        backbone, dataset, request=request, settings=settings, split="val", subset=range(ROWS)
    )
    written = sum(chunk.nbytes for chunk in feats.chunks("pooled"))
    assert abs(predicted - written) <= 0.1 * written, (predicted, written)


def test_a_cnn_is_sized_from_its_own_activations(ctx):
    from evalkit.core.shapes import shape_of

    resnet = load_backbone("timm/resnet18", BackboneOptions(random_init=True))
    measured = measured_shape(resnet, dtype="fp32")
    guessed = shape_of(resnet.info, dtype="fp32")  # one token per pixel: the old guess
    # resnet18 at 224 px: 1.8 G multiply-adds, its largest map 64 × 112 × 112
    assert 3.3e9 < measured.flops_per_image < 4.0e9
    assert measured.activation_bytes_per_image == 4 * 64 * 112 * 112 * 4
    assert guessed.activation_bytes_per_image > 100 * measured.activation_bytes_per_image
    from evalkit.core.runner import resolve_task

    assert unfit(resolve_task("imagenet-linear"), resnet, ctx) == []


def test_the_measured_shape_is_taken_once_per_backbone(monkeypatch):

    from evalkit.core import shapes

    backbone = load_backbone("fake")
    calls = []
    real = shapes._one_forward
    monkeypatch.setattr(shapes, "_one_forward", lambda *a: calls.append(1) or real(*a))
    first = measured_shape(backbone, dtype="fp32")
    assert measured_shape(backbone, dtype="bf16").weight_bytes_per_rank * 2 == (
        first.weight_bytes_per_rank
    )
    assert (
        calls == [1]
        and first.embed_dim == backbone.extract(torch.zeros(1, 3, 32, 32)).pooled.shape[-1]
    )
