"""Shared fixtures: offline environment, a session-wide embedded data cache, a fake backbone."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """Embedded stand-in data is generated once per session here."""
    return tmp_path_factory.mktemp("evalkit-data")


@pytest.fixture()
def ctx(data_cache, tmp_path):
    from evalkit.cache.settings import ExtractSettings
    from evalkit.core.task import TaskContext
    from evalkit.data import DataConfig

    return TaskContext(
        data=DataConfig(source="embedded", cache=data_cache),
        extract=ExtractSettings(cache_dir=tmp_path / "cache", batch_size=64, progress=False),
    )


@pytest.fixture()
def fake():
    from evalkit import load_backbone

    return load_backbone("fake")


@pytest.fixture()
def cli_env(monkeypatch, data_cache, tmp_path):
    """CLI runs write their cache and rows under tmp_path; embedded data is shared."""
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _randomised_timm_xp(**kwargs):
    import timm
    import torch

    torch.manual_seed(0)
    options = dict(embed_dim=64, depth=2, num_heads=4, num_classes=0) | kwargs
    model = timm.create_model("vit_base_patch16_xp_224", **options).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # timm inits norms to 1 and biases to 0: make them matter
                p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0, 0.1)
    return model


@pytest.fixture()
def randomised_timm_xp():
    """Builds a small timm ``vit_base_patch16_xp_224`` (width 64, 2 blocks; ``kwargs`` change
    it) with norms and biases randomised so that every parameter matters."""
    return _randomised_timm_xp


TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture()
def tiny_clip_registered(monkeypatch):
    """A tiny open_clip architecture ``Tiny-Test`` and a published tag ``hubtag`` for it
    (hub repository ``someorg/tiny-clip``), in open_clip's own registries."""
    import open_clip.factory
    import open_clip.pretrained

    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "Tiny-Test", TINY_CLIP)
    tags = {
        "hubtag": {
            "hf_hub": "someorg/tiny-clip/",
            "mean": (0.3, 0.3, 0.3),
            "std": (0.1, 0.1, 0.1),
            "interpolation": "bilinear",
        }
    }
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, "Tiny-Test", tags)


@pytest.fixture()
def dims_zoo(cli_env):
    """``evalkit run``'s arguments for a zoo of two setups of one backbone (``fake`` with
    dim 64 and with dim 128) on kNN over the stand-in, its zoo file written in ``cli_env``."""
    (cli_env / "zoo.toml").write_text(
        '[[backbone]]\nname = "fake"\nmodel_args = { dim = 64 }\n\n'
        '[[backbone]]\nname = "fake"\nmodel_args = { dim = 128 }\n'
    )
    return ["run", "--zoo", "zoo.toml", "--task", "imagenet-knn", "--data", "embedded"]
