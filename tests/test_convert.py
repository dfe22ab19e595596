"""Checkpoint conversion accounts for every key in both directions: timm variants give timm's
own features or a refusal naming the keys; the big_vision round trip is exact for every switch
set or refused naming the parameter; classifiers are dropped on purpose and said so."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.models import convert
from evalkit.models.vit22b import ViT, ViTConfig, build
from evalkit.storage import checkpoints

TIMM_VARIANTS = {
    "default (class token)": {},
    "map pooling": {"global_pool": "map"},
    "map pooling over the class token": {"global_pool": "map", "pool_include_prefix": True},
    "fc_norm, no class token": {"fc_norm": True, "class_token": False, "global_pool": "avg"},
    "fc_norm with class token": {"fc_norm": True, "global_pool": "avg"},
    "average over the class token": {"global_pool": "avg", "pool_include_prefix": True},
    "qkv bias": {"qkv_bias": True},
}


@pytest.mark.parametrize("variant", TIMM_VARIANTS)
def test_timm_variants_give_timms_own_features(variant, randomised_timm_xp):
    switches = TIMM_VARIANTS[variant]
    timm_model = randomised_timm_xp(**switches)
    state = timm_model.state_dict()
    prefix = switches.get("pool_include_prefix", False)
    ours_state, cfg, dropped = convert.from_timm_xp(state, pool_include_prefix=prefix)
    assert dropped == []
    params = sum(t.numel() for t in state.values())
    assert sum(t.numel() for t in ours_state.values()) == params  # every parameter carried
    ours = ViT(cfg).eval()
    ours.load_state_dict(ours_state, strict=True)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected_tokens = timm_model.forward_features(images)
        tokens = ours.forward_layers(images, [cfg.depth - 1])[0]
        expected = timm_model.forward_head(expected_tokens, pre_logits=True)
        torch.testing.assert_close(tokens, expected_tokens, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.pool(tokens), expected, atol=1e-5, rtol=0)


def test_timm_xp_config_reads_the_switches(randomised_timm_xp):
    cfg = convert.from_timm_xp(randomised_timm_xp().state_dict()).config
    assert (cfg.norm, cfg.pool, cfg.patch, cfg.pre_norm, cfg.patch_bias) == (
        "rms",
        "cls",
        16,
        True,
        False,
    )
    state = randomised_timm_xp(global_pool="map").state_dict()
    cfg = convert.from_timm_xp(state, pool_include_prefix=False).config
    assert (cfg.pool, cfg.class_token, cfg.pool_prefix) == ("map", True, False)


def test_a_pool_beside_a_class_token_must_say_whether_it_takes_it_in(
    tmp_path, capsys, randomised_timm_xp
):
    source = tmp_path / "timm.safetensors"
    timm_model = randomised_timm_xp(global_pool="map", pool_include_prefix=True)
    save_file(timm_model.state_dict(), str(source))
    assert main(["convert", "--from", "timm", str(source), str(tmp_path / "out")]) == 2
    assert "--pool-include-prefix" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    argv = ["convert", "--from", "timm", str(source), str(tmp_path / "out")]
    assert main([*argv, "--pool-include-prefix", "yes"]) == 0
    assert checkpoints.SafetensorsSource(tmp_path / "out").config()["pool_prefix"] is True


def test_timm_classifier_is_dropped_on_purpose_and_printed(tmp_path, capsys, randomised_timm_xp):
    source = tmp_path / "timm.safetensors"
    save_file(randomised_timm_xp(num_classes=10).state_dict(), str(source))
    assert main(["convert", "--from", "timm", str(source), str(tmp_path / "out")]) == 0
    assert "dropped on purpose (the classifier): head.bias, head.weight" in capsys.readouterr().out


def test_timm_keys_the_family_cannot_express_are_refused_by_name(
    tmp_path, capsys, randomised_timm_xp
):
    source = tmp_path / "timm.safetensors"
    save_file(randomised_timm_xp(init_values=0.1).state_dict(), str(source))  # layer scale
    assert main(["convert", "--from", "timm", str(source), str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "2 keys the family cannot express: blocks.0.ls.gamma, blocks.1.ls.gamma" in err
    assert not (tmp_path / "out").exists()


def big_vision_tree(**switches):
    cfg = ViTConfig(width=32, depth=2, heads=4, mlp=64, patch=8, image=32, **switches)
    return convert.to_big_vision(build(cfg, seed=1).state_dict(), cfg)


def test_big_vision_unknown_and_missing_keys_are_errors():
    tree = big_vision_tree() | {"pre_logits/kernel": torch.zeros(32, 32)}
    with pytest.raises(EvalkitError, match="1 keys the family cannot express: pre_logits/kernel"):
        convert.from_big_vision(tree)
    tree = big_vision_tree()
    del tree["Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias"]
    with pytest.raises(EvalkitError, match="lacks Transformer/encoderblock_1/MlpBlock_0/Dense_1"):
        convert.from_big_vision(tree)
    classifier = big_vision_tree() | {"head/kernel": torch.zeros(32, 10)}
    assert convert.from_big_vision(classifier).dropped == ["head/kernel"]


SWITCHES = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["layer", "rms"]),
        "pre_norm": st.booleans(),
        "qk_norm": st.booleans(),
        "qkv_bias": st.booleans(),
        "ln_bias": st.booleans(),
        "patch_bias": st.booleans(),
        "parallel": st.booleans(),
        "pool": st.sampled_from(["cls", "gap", "map"]),
        "class_token": st.booleans(),
        "fc_norm": st.booleans(),
    }
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(switches=SWITCHES)
def test_big_vision_round_trip_is_exact_or_refused_by_name(switches, tmp_path):
    if switches["norm"] == "rms" and switches["ln_bias"]:
        with pytest.raises(ValueError, match="RMS norms have no bias"):
            ViTConfig(width=32, depth=2, heads=4, mlp=64, **switches)
        return
    cfg = ViTConfig(width=32, depth=2, heads=4, mlp=64, patch=8, image=32, **switches)
    state = build(cfg, seed=5).state_dict()
    if cfg.pre_norm or cfg.fc_norm:
        with pytest.raises(EvalkitError, match=r"no place for (norm_pre|fc_norm)\.weight"):
            convert.to_big_vision(state, cfg)
        return
    path = convert.write_npz(convert.to_big_vision(state, cfg), tmp_path / "bv.npz")
    back, read_cfg, dropped = convert.from_big_vision(convert.read_npz(path))
    assert read_cfg == cfg and dropped == []
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_export_to_big_vision_from_the_command_line(tmp_path, capsys):
    cfg = ViTConfig(width=32, depth=2, heads=4, mlp=64, patch=8, image=32, norm="rms")
    state = build(cfg, seed=7).state_dict()
    checkpoint = checkpoints.save_checkpoint(state, tmp_path / "ck", cfg.as_dict())
    npz = tmp_path / "params.npz"
    assert main(["convert", str(checkpoint), str(npz), "--to", "big_vision"]) == 0
    assert main(["convert", "--from", "big_vision", str(npz), str(tmp_path / "back")]) == 0
    back = checkpoints.SafetensorsSource(tmp_path / "back")
    assert ViTConfig(**back.config()) == cfg  # the norm kind travelled in the .npz
    assert all(torch.equal(back.tensor(k), state[k]) for k in state)
    pre = ViTConfig(width=32, depth=2, heads=4, mlp=64, patch=8, image=32, pre_norm=True)
    refused = checkpoints.save_checkpoint(build(pre).state_dict(), tmp_path / "pre", pre.as_dict())
    capsys.readouterr()
    assert main(["convert", str(refused), str(tmp_path / "x.npz"), "--to", "big_vision"]) == 2
    assert "no place for norm_pre.weight" in capsys.readouterr().err
