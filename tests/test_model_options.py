"""Constructor options build a model and load nothing: every family declares the options it
takes, loader-like ones are refused by name, and a pickled payload reachable through any input
that reads weights (an option, ``--weights``, a trainer checkpoint, a LiT tower, a converter
input, the zero-shot classifier store) never runs."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

from evalkit.backbones import BACKBONES, BackboneOptions, load_backbone
from evalkit.backbones.options import LOADER_OPTION, declared_options
from evalkit.errors import EvalkitError

OPEN_CLIP_LOADERS = (
    "pretrained",
    "pretrained_image",
    "pretrained_text",
    "pretrained_image_path",
    "pretrained_text_path",
    "pretrained_hf",
    "load_weights",
    "cache_dir",
    "weights_only",
    "require_pretrained",
)
TIMM_LOADERS = (
    "pretrained",
    "pretrained_cfg",
    "pretrained_cfg_overlay",
    "pretrained_strict",
    "checkpoint_path",
    "cache_dir",
)


class Payload:
    """Unpickling this touches ``marker``: the proof that a pickle ran."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


@pytest.fixture()
def payload(tmp_path):
    """A ``.pt`` whose unpickling touches the marker file, and the marker's path."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"weight": Payload(marker)}, path)
    return path, marker


def _never_build(monkeypatch, family):
    def build(variant, opts):
        raise AssertionError("the constructor was reached")

    entry = BACKBONES.get(family)
    module = __import__(entry.target.partition(":")[0], fromlist=["build"])
    monkeypatch.setattr(module, "build", build)
    monkeypatch.setattr(build, "model_options", module.MODEL_OPTIONS, raising=False)


@pytest.mark.parametrize(
    ("family", "option"),
    [("open_clip", o) for o in OPEN_CLIP_LOADERS] + [("timm", o) for o in TIMM_LOADERS],
)
def test_each_loader_option_is_refused_before_any_constructor(monkeypatch, family, option):
    _never_build(monkeypatch, family)
    spec = {"open_clip": "open_clip/ViT-B-32", "timm": "timm/vit_tiny_patch16_224"}[family]
    with pytest.raises(EvalkitError, match=rf"--model-arg {option} .*--weights PATH"):
        load_backbone(spec, BackboneOptions(model_kwargs={option: "x"}))


def test_the_python_api_follows_the_same_rule(payload):
    import evalkit

    path, marker = payload
    with pytest.raises(EvalkitError, match="pretrained_image_path"):
        evalkit.load_backbone(
            "open_clip/ViT-B-32", model_kwargs={"pretrained_image_path": str(path)}
        )
    assert not marker.exists()


def test_every_family_declares_its_options_and_none_loads():
    """A family added without ``MODEL_OPTIONS`` (or ``build.model_options``) fails here."""
    for entry in BACKBONES.entries():
        build = entry.load()
        module = __import__(build.__module__, fromlist=["_"])
        assert hasattr(build, "model_options") or hasattr(module, "MODEL_OPTIONS"), entry.name
        loaders = [o for o in declared_options(build) if LOADER_OPTION.search(o)]
        assert not loaders, f"{entry.name} declares loader options {loaders}"


def test_a_family_that_declares_nothing_takes_no_option(monkeypatch):
    import types

    module = types.ModuleType("undeclared_family")
    module.build = lambda variant, opts: pytest.fail("an undeclared option reached build")
    monkeypatch.setitem(__import__("sys").modules, "undeclared_family", module)
    BACKBONES.add("undeclared", "undeclared_family:build")
    try:
        with pytest.raises(EvalkitError, match="take no --model-arg 'depth'.*none"):
            load_backbone("undeclared", BackboneOptions(model_kwargs={"depth": 2}))
    finally:
        BACKBONES._entries.pop("undeclared")


def test_an_undeclared_option_is_named_with_a_hint():
    with pytest.raises(EvalkitError, match="take no --model-arg 'img_sise'.*img_size"):
        load_backbone("timm/vit_tiny_patch16_224", BackboneOptions(model_kwargs={"img_sise": 32}))
    with pytest.raises(EvalkitError, match="take no --model-arg 'precision'"):
        load_backbone("open_clip/ViT-B-32", BackboneOptions(model_kwargs={"precision": "fp16"}))


@pytest.mark.parametrize(
    ("backbone", "option"),
    [
        ("open_clip/ViT-B-32", "pretrained_image_path"),
        ("timm/vit_tiny_patch16_224", "checkpoint_path"),
    ],
)
def test_a_pickle_through_the_command_line_option_runs_nothing(cli_env, payload, backbone, option):
    from evalkit.cli import main

    path, marker = payload
    args = ["run", "--task", "imagenet-linear", "--backbone", backbone, "--data", "embedded"]
    assert main([*args, "--model-arg", f"{option}={path}"]) == 2
    assert not marker.exists()


@pytest.mark.parametrize(
    "backbone", ["timm/vit_tiny_patch16_224", "open_clip/ViT-B-32", "vit22b/test"]
)
def test_a_pickle_through_weights_runs_nothing(payload, backbone):
    path, marker = payload
    with pytest.raises(EvalkitError):
        load_backbone(backbone, BackboneOptions(weights=str(path)))
    assert not marker.exists()


def test_a_pickle_in_a_trainer_checkpoint_runs_nothing(tmp_path, payload):
    """Fine-tuning, pretraining and distillation students all resume through this loop."""
    from evalkit.schedule import Schedule
    from evalkit.training.loop import fit

    path, marker = payload

    def batch(step, micro):
        return torch.randn(8, 4), torch.zeros(8, dtype=torch.long)

    out = tmp_path / "run"
    schedule = Schedule(steps=6, batch_size=8, checkpoint_every=5, warmup=1)
    fit(torch.nn.Linear(4, 2), batch, torch.nn.functional.cross_entropy, schedule, out=out)
    latest = json.loads((out / "latest.json").read_text())["checkpoint"]
    (out / latest / "trainer.pt").write_bytes(path.read_bytes())
    with pytest.raises(EvalkitError, match=latest):
        fit(torch.nn.Linear(4, 2), batch, torch.nn.functional.cross_entropy, schedule, out=out)
    assert not marker.exists()


def test_a_pickle_as_a_lit_tower_runs_nothing(payload):
    from evalkit.heads.text import load_tower

    path, marker = payload
    with pytest.raises(EvalkitError):
        load_tower(path)
    assert not marker.exists()


def test_a_pickle_as_a_converter_input_runs_nothing(cli_env, payload):
    from evalkit.cli import main

    path, marker = payload
    npz = cli_env / "evil.npz"
    np.savez(npz, params=np.array([Payload(marker)], dtype=object))
    assert main(["convert", str(path), str(cli_env / "a"), "--from", "timm"]) == 2
    assert main(["convert", str(npz), str(cli_env / "b"), "--from", "big_vision"]) == 2
    assert not marker.exists()


def test_a_pickle_in_the_classifier_store_runs_nothing(tmp_path, payload):
    from evalkit.heads.zeroshot import Prompting, stored_class_embeddings

    path, marker = payload

    class Tower:
        def tokenize(self, texts):
            return torch.zeros(len(texts), 2)

        def encode(self, tokens):
            return torch.ones(len(tokens), 4)

    prompting = Prompting(names=("a", "b"), templates=("{}",))
    place = tmp_path / "classifiers" / f"{prompting.key('t')}.pt"
    place.parent.mkdir()
    place.write_bytes(path.read_bytes())
    embeddings = stored_class_embeddings(Tower(), prompting, tower_id="t", folder=tmp_path)
    assert embeddings.shape == (2, 4) and not marker.exists()
