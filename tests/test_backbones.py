import pytest
import torch
from safetensors.torch import save_file

from evalkit import load_backbone
from evalkit.backbones.base import Backbone
from evalkit.errors import EvalkitError

TINY_VIT = {"img_size": 32, "depth": 3}


@pytest.fixture(scope="module")
def vit():
    return load_backbone("timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT)


def test_timm_backbone_protocol_and_shapes(vit):
    assert isinstance(vit, Backbone)
    info = vit.info
    assert (info.embed_dim, info.depth, info.patch_size, info.num_prefix_tokens) == (192, 3, 16, 1)
    assert info.random_init and info.weights_id.startswith("random-init")
    assert info.preprocess.size == 32 and info.preprocess.mean == (0.5, 0.5, 0.5)
    x = torch.randn(2, 3, 32, 32)
    feats = vit.extract(x, layers=(-1, 0), pool="cls", dense=True)
    assert feats.pooled.shape == (2, 384)
    assert [g.shape for g in feats.grids] == [(2, 192, 2, 2)] * 2


def test_timm_cls_pool_is_the_normed_class_token(vit):
    x = torch.randn(2, 3, 32, 32)
    tokens = vit.model.forward_features(x)  # norm applied, class token first
    pooled = vit.extract(x, layers=(-1,), pool="cls").pooled
    torch.testing.assert_close(pooled, tokens[:, 0])
    mean = vit.extract(x, layers=(-1,), pool="mean").pooled
    torch.testing.assert_close(mean, tokens[:, 1:].mean(1))


def test_random_init_is_deterministic_per_seed():
    a = load_backbone("timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, seed=1)
    b = load_backbone("timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, seed=1)
    c = load_backbone("timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, seed=2)
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(
        a.extract(x, layers=(-1,), pool="cls").pooled, b.extract(x, layers=(-1,), pool="cls").pooled
    )
    assert a.info.weights_id == b.info.weights_id != c.info.weights_id


def test_local_weights_load_and_change_the_id(vit, tmp_path):
    state = {k: v.clone() + 0.01 for k, v in vit.model.state_dict().items()}
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    loaded = load_backbone("timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, weights=str(path))
    assert not loaded.info.random_init and loaded.info.weights_id.startswith("sha256:")
    torch.testing.assert_close(loaded.model.state_dict()["pos_embed"], state["pos_embed"])
    torch.save(state, tmp_path / "w.pt")
    again = load_backbone(
        "timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, weights=str(tmp_path / "w.pt")
    )
    torch.testing.assert_close(again.model.state_dict()["pos_embed"], state["pos_embed"])


def test_checkpoint_with_mismatched_shapes_names_key_and_shapes(vit, tmp_path):
    state = dict(vit.model.state_dict())
    state["pos_embed"] = torch.zeros(1, 17, 100)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(EvalkitError, match=r"pos_embed has shape \(1, 17, 100\).*\(1, 5, 192\)"):
        load_backbone(
            "timm/vit_tiny_patch16_224",
            model_kwargs=TINY_VIT,
            weights=str(tmp_path / "bad.safetensors"),
        )


def test_missing_weights_file_and_unknown_model_are_clear():
    with pytest.raises(EvalkitError, match="weights file not found"):
        load_backbone(
            "timm/vit_tiny_patch16_224", model_kwargs=TINY_VIT, weights="/nope.safetensors"
        )
    with pytest.raises(EvalkitError, match="vit_tiny_patch16_224"):
        load_backbone("timm/vit_tiny_patch16_22")
    with pytest.raises(EvalkitError, match="unknown backbone family 'timmm'.*'timm'"):
        load_backbone("timmm/vit_tiny_patch16_224")


def test_unsupported_pool_is_an_error(vit):
    with pytest.raises(EvalkitError, match="pool='map'"):
        vit.extract(torch.randn(1, 3, 32, 32), layers=(-1,), pool="map")


def test_cnn_backbone_uses_mean_pool():
    bb = load_backbone("timm/resnet18")
    assert bb.info.pools == ("mean",)
    feats = bb.extract(torch.randn(1, 3, 64, 64), layers=(-1,), pool="mean", dense=True)
    assert feats.pooled.shape == (1, 512) and feats.grids[0].shape == (1, 512, 2, 2)


def test_open_clip_image_and_text_towers():
    pytest.importorskip("open_clip")
    bb = load_backbone("open_clip/ViT-B-32", model_kwargs={"force_image_size": 64})
    assert bb.info.pools == ("cls", "mean", "embed")
    x = torch.randn(2, 3, 64, 64)
    assert bb.extract(x, layers=(-1,), pool="cls").pooled.shape == (2, 768)
    embed = bb.extract(x, layers=(-1,), pool="embed").pooled
    text = bb.text.encode(bb.text.tokenize(["a photo of a cat", "a dog"]))
    assert embed.shape == text.shape == (2, 512)
    torch.testing.assert_close(text.norm(dim=-1), torch.ones(2))


def test_the_fake_backbone_keeps_a_frame_aspect():
    """Waymo frames are 3:2: grids follow the image's height and width."""
    from evalkit import load_backbone

    grids = load_backbone("fake").extract(torch.zeros(2, 3, 32, 48), dense=True).grids
    assert grids[0].shape[-2:] == (4, 6)
