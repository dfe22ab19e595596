"""The built-in ViT-22B family: architecture facts, switches, planner, converters, checkpoints
and the backbone adapter's errors (single process; sharding is in test_parallel.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.models import convert
from evalkit.models.vit22b import SIZES, build, config
from evalkit.storage import checkpoints


def test_22b_planner_counts_match_the_paper():
    from evalkit.parallel.sizing import sizing

    p = sizing(config("22b"), tp=8, dtype="bf16")
    assert p.block_matrices == 48 * (4 * 6144**2 + 2 * 6144 * 24576) == 21_743_271_936
    assert abs(p.encoder / 21.743e9 - 1) < 1e-3
    assert 0.4e9 < p.head < 0.5e9  # the MAP head, counted apart (docs/protocols.md, "Architecture")
    assert p.bytes_total == 2 * (p.encoder + p.head)
    replicated = p.head + 8e6  # the MAP head, norms, embeddings, out-projection biases
    assert p.bytes_per_rank / 2 == pytest.approx(
        (p.encoder + p.head - replicated) / 8 + replicated, rel=0.01
    )
    # 2 × tokens × matrices, plus attention and patch embedding.
    assert p.flops_per_image == pytest.approx(2 * 256 * 21_743_271_936, rel=0.01)


def test_backbones_info_prints_21_74b_without_allocating():
    # VmHWM is this process's own peak; ru_maxrss keeps the peak of the pytest process that
    # spawned it across the exec, so it reads whatever the suite had allocated before
    script = (
        "import re; from evalkit.cli import main; "
        "main(['backbones', 'info', 'vit22b', '--tp', '4']); "
        "print('peak_kb', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "21.74B" in out.stdout and "tp=4" in out.stdout
    peak_kb = int(out.stdout.split("peak_kb")[-1])
    assert peak_kb < 2 * 2**20  # under 2 GB: the 88 GB of fp32 weights are never allocated


def test_paper_sizes_have_table_1_shapes():
    assert SIZES["g"] == (1664, 48, 16, 8192) and SIZES["e"] == (1792, 56, 16, 15360)
    cfg = config("22b")
    assert (cfg.patch, cfg.image, cfg.head_dim, cfg.grid**2) == (14, 224, 128, 256)


def test_switches_change_the_parameters():
    names = set(dict(build(config("test")).named_parameters()))
    assert not any(n.endswith(("attn.q.bias", "norm1.bias", "q_norm.bias")) for n in names)
    assert "blocks.0.mlp.fc1.bias" in names and "blocks.0.attn.q_norm.weight" in names
    assert not any("norm2" in n for n in names)
    biased_cfg = config("test", qkv_bias=True, ln_bias=True, norm="layer")
    biased = set(dict(build(biased_cfg).named_parameters()))
    assert {"blocks.0.attn.q.bias", "blocks.0.norm1.bias", "blocks.0.attn.q_norm.bias"} <= biased
    sequential = build(config("test", parallel=False, qk_norm=False))
    assert hasattr(sequential.blocks[0], "norm2")
    assert isinstance(sequential.blocks[0].attn.q_norm, torch.nn.Identity)


def test_parallel_block_is_shared_norm_attention_plus_mlp():
    block = build(config("test")).blocks[0]
    x = torch.randn(2, 9, 64)
    h = torch.nn.functional.rms_norm(x, (64,), block.norm1.weight, eps=1e-6)
    with torch.no_grad():
        assert torch.allclose(block(x), x + block.attn(h) + block.mlp(h), atol=1e-6)
        seq = build(config("test", parallel=False)).blocks[0]
        y = x + seq.attn(seq.norm1(x))
        assert torch.allclose(seq(x), y + seq.mlp(seq.norm2(y)), atol=1e-6)


def test_norms_are_without_bias_and_centering_by_default():
    """The paper: all LayerNorms "without bias and centering", i.e. RMS normalisation with a
    learned scale, the QK norms included; centred LayerNorm stays a switch."""
    model = build(config("test"))
    for module in (model.norm, model.blocks[0].norm1, model.blocks[0].attn.q_norm):
        assert isinstance(module, torch.nn.RMSNorm)
    x = torch.randn(2, 9, 64) + 3.0  # a mean that centering would remove
    with torch.no_grad():
        expected = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * model.norm.weight
        torch.testing.assert_close(model.norm(x), expected)
    centred = build(config("test", norm="layer"))
    assert isinstance(centred.norm, torch.nn.LayerNorm) and centred.norm.bias is None


def test_qk_norm_is_per_head_norm_before_the_softmax():
    attn = build(config("test", norm="layer"), seed=1).blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(1, 5, 64)
        split = lambda t: t.view(1, 5, 4, 16).transpose(1, 2)  # noqa: E731
        ln = lambda t, w: torch.nn.functional.layer_norm(t, (16,), w, None, 1e-6)  # noqa: E731
        q, k, v = (
            ln(split(attn.q(x)), attn.q_norm.weight),
            ln(split(attn.k(x)), None),
            split(attn.v(x)),
        )
        probs = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        expected = attn.out((probs @ v).transpose(1, 2).reshape(1, 5, 64))
        assert torch.allclose(attn(x), expected, atol=1e-5)


def test_other_resolutions_resample_the_position_embedding():
    model = build(config("test")).eval()
    with torch.no_grad():
        tokens = model.forward_layers(torch.randn(1, 3, 280, 336), [3])[0]
    assert tokens.shape == (1, 20 * 24, 64)


def test_same_seed_same_weights_and_names_decide_values():
    a, b = build(config("test"), seed=3), build(config("test"), seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    c = build(config("test"), seed=4)
    assert not torch.equal(a.blocks[0].attn.q.weight, c.blocks[0].attn.q.weight)


def test_convert_cli_writes_a_checkpoint_the_backbone_loads(tmp_path, randomised_timm_xp):
    from safetensors.torch import save_file

    from evalkit.backbones import BackboneOptions, load_backbone
    from evalkit.cli import main

    timm_model = randomised_timm_xp()
    source, out = tmp_path / "timm.safetensors", tmp_path / "out"
    save_file(timm_model.state_dict(), str(source))
    assert main(["convert", "--from", "timm", str(source), str(out)]) == 0
    # vit22b/test has width 64 and 4 heads; this timm model has 2 blocks.
    opts = BackboneOptions(weights=str(out), model_kwargs={"depth": 2})
    backbone = load_backbone("vit22b/test", opts)
    assert backbone.info.pools == ("cls", "mean") and backbone.info.patch_size == 16
    images = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        got = backbone.extract(images, layers=(-1,), pool="cls").pooled
        expected = timm_model.forward_head(timm_model.forward_features(images))
    assert (got - expected).abs().max() <= 1e-5


def test_big_vision_round_trip_and_kernel_layout(tmp_path):
    cfg = config("test", qkv_bias=True)
    state = build(cfg, seed=2).state_dict()
    tree = convert.to_big_vision(state, cfg)
    kernel = tree["Transformer/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel"]
    assert kernel.shape == (64, 4, 16)  # (in, heads, head_dim)
    assert kernel[5, 2, 3] == state["blocks.1.attn.q.weight"][2 * 16 + 3, 5]
    conv = tree["embedding/kernel"]
    assert conv.shape == (14, 14, 3, 64)
    assert conv[1, 2, 0, 7] == state["patch_embed.weight"][7, 0, 1, 2]
    assert tree["Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape == (64, 256)
    # Scanned layout: blocks stacked along a leading axis, as big_vision saves with scan.
    stacked = {k: v for k, v in tree.items() if "encoderblock_" not in k}
    for key in [k for k in tree if k.startswith("Transformer/encoderblock_0/")]:
        rest = key.removeprefix("Transformer/encoderblock_0/")
        stacked[f"params/Transformer/encoderblock/{rest}"] = torch.stack(
            [tree[f"Transformer/encoderblock_{i}/{rest}"] for i in range(cfg.depth)]
        )
    arrays = {k: np.array(v) if isinstance(v, str) else v.numpy() for k, v in stacked.items()}
    np.savez(tmp_path / "bv.npz", **arrays)
    back, read_cfg, _ = convert.from_big_vision(convert.read_npz(tmp_path / "bv.npz"))
    assert read_cfg == cfg
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_sharded_checkpoint_with_index_loads_through_the_backbone(tmp_path):
    from evalkit.backbones import BackboneOptions, load_backbone

    cfg = config("test", parallel=False)
    model = build(cfg, seed=9).eval()
    path = checkpoints.save_checkpoint(
        model.state_dict(), tmp_path / "ck", cfg.as_dict(), shard_bytes=100_000
    )
    assert (
        path.name == checkpoints.INDEX_NAME
        and len(list((tmp_path / "ck").glob("*.safetensors"))) > 2
    )
    backbone = load_backbone("vit22b/test", BackboneOptions(weights=str(tmp_path / "ck")))
    assert not backbone.info.random_init
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        got = backbone.extract(images, layers=(-1,), pool="map").pooled
        assert torch.allclose(got, model(images), atol=1e-6)


def test_checkpoint_shape_mismatch_names_key_and_shapes(tmp_path):
    from evalkit.backbones import BackboneOptions, load_backbone

    cfg = config("test")
    path = checkpoints.save_checkpoint(build(cfg).state_dict(), tmp_path / "ck", cfg.as_dict())
    with pytest.raises(
        EvalkitError, match=r"blocks.0.attn.k.weight has shape \(64, 64\).*expects \(192, 192\)"
    ):
        load_backbone("vit22b/ti", BackboneOptions(weights=str(path)))


def test_22b_without_weights_says_how_to_proceed():
    from evalkit.backbones import load_backbone

    with pytest.raises(EvalkitError, match="--weights PATH.*--random-init.*vit22b/s"):
        load_backbone("vit22b")


def test_22b_random_init_that_cannot_fit_stops_before_allocating():
    from evalkit.backbones import BackboneOptions, load_backbone

    with pytest.raises(EvalkitError, match="GiB per rank.*--tp N.*smaller size"):
        load_backbone("vit22b", BackboneOptions(random_init=True))


def test_tp_without_torchrun_is_a_clear_error(cli_env):
    from evalkit.cli import main

    code = main(["run", "--task", "imagenet-linear", "--backbone", "vit22b/test", "--tp", "2"])
    assert code == 2


def test_backbone_pools_and_dense_grids():
    from evalkit.backbones import load_backbone

    backbone = load_backbone("vit22b/test")
    assert backbone.info.pools == ("map", "mean") and backbone.info.random_init
    images = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        feats = backbone.extract(images, layers=(0, -1), pool="mean", dense=True)
        assert feats.pooled.shape == (2, 128)
        assert [g.shape for g in feats.grids] == [(2, 64, 16, 16)] * 2
        with pytest.raises(EvalkitError, match="only layers=-1"):
            backbone.extract(images, layers=(0,), pool="map")


def test_model_args_reach_the_ablation_switches(cli_env):
    from evalkit.backbones import BackboneOptions, load_backbone
    from evalkit.backbones.options import parse_model_args
    from evalkit.cli import main

    kwargs = parse_model_args(["qk_norm=false", "parallel=False", "depth=2", "pool=gap"])
    assert kwargs == {"qk_norm": False, "parallel": False, "depth": 2, "pool": "gap"}
    backbone = load_backbone("vit22b/test", BackboneOptions(model_kwargs=kwargs))
    block = backbone.model.blocks[0]
    assert not block.parallel and isinstance(block.attn.q_norm, torch.nn.Identity)
    assert backbone.info.depth == 2 and backbone.info.pools == ("mean",)
    with pytest.raises(EvalkitError, match="no --model-arg .qk_nrom.*qk_norm"):
        load_backbone("vit22b/test", BackboneOptions(model_kwargs={"qk_nrom": False}))
    args = ["run", "--task", "imagenet-linear", "--backbone", "vit22b/test", "--data", "embedded"]
    assert main([*args, "--model-arg", "pool=nope"]) == 2
