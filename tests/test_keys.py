"""The feature-cache key and the run key never answer for different inputs: every option that
reaches the model, the task or the data reaches the key; weights and data are identified by what
is in them; damaged cache shards are recomputed; tables keep two weights files apart."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import typing

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import evalkit
from evalkit.backbones import load_backbone
from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.core.catalog import TASKS, resolve_task
from evalkit.core.results import load_rows
from evalkit.core.spec import RunSpec
from evalkit.core.tables import pivot_table
from evalkit.core.task import Task, job_spec
from evalkit.data import DataConfig
from evalkit.data.resolve import Reading, open_dataset
from evalkit.storage import checkpoints, identity

# Every RunSpec option either reaches the run key or is listed here with why it may not.
NOT_IN_KEY = {
    "out": "where rows go",
    "force": "runs what the plan says does not fit; does not change a number",
    "rerun": "recomputes finished jobs; does not change a number",
    "cache_dir": "where the cache lives",
    "no_cache": "whether the cache is used",
    "verify_cache": "how hard cached shards are checked; a bad one is recomputed the same",
    "read_only_cache": "set by the runner: features are read or computed the same, only not kept",
    "batch_size": "batching; features agree to float rounding",
    "workers": "loader processes",
    "device": "recorded in the row; features agree to float rounding (README: Feature cache)",
    "progress": "screen output",
    "tp": "sharding; tests/test_parallel.py shows equal features",
    "fsdp": "sharding of weights only",
    "random_init": "permits untrained weights; the weights id says they are random",
    "pretrained": "reaches the key as the cached file's content id (tests/test_hub.py)",
    "save_predictions": "writes a Parquet file beside the rows; the numbers do not change",
    "log": "sends rows and curves to trackers as well; the numbers do not change",
    "pixels": "decoded views read back bit for bit (tests/test_feeding_views.py)",
    "zoo": "keeps per-image outputs and goes on past a failed cell; the numbers do not change",
    "cells": "which of a zoo's cells this process runs (--shard); each cell's job is the same",
    "verify_data": "hashes files again whose stamp is unchanged: the same bytes, the same key",
}
BASE = dict(tasks="imagenet-linear", backbones="fake", data="embedded", progress=False)


def job_key(spec: RunSpec, seed: int | None = None) -> str:
    seed = spec.seeds[0] if seed is None else seed
    backbone = load_backbone(spec.backbones[0], spec.backbone_options(seed))
    task = resolve_task(spec.tasks[0], spec.overrides)
    ctx = spec.context(seed)
    return identity.spec_key(job_spec(task, backbone.info, ctx))


def test_every_run_option_reaches_the_key_or_says_why_not(cli_env, tmp_path):
    variants = {
        "tasks": {"tasks": "imagenet-5shot"},
        "backbones": {"backbones": "vit22b/test"},
        "seeds": {"seeds": (3,)},
        "overrides": {"overrides": ("max_iter=7",)},
        "model_args": {"model_args": {"depth": 2}},
        "dtype": {"dtype": "bf16"},
        "cache_dtype": {"cache_dtype": "fp16"},
        "data": {"data": "folder", "data_dir": tmp_path / "nothing"},
        "data_dir": {"data": "folder", "data_dir": tmp_path / "elsewhere"},
        "decoder": {"decoder": "pil"},
        "weights": {"backbones": "vit22b/test", "weights": str(vit22b_checkpoint(tmp_path))},
    }
    options = set(RunSpec.option_names())
    assert options == set(variants) | set(NOT_IN_KEY), "classify the new RunSpec option"
    base = job_key(RunSpec.of(**BASE))
    (tmp_path / "elsewhere" / "imagenet" / "train" / "a").mkdir(parents=True)
    for field, change in variants.items():
        if field == "weights":
            plain = job_key(RunSpec.of(**{**BASE, "backbones": "vit22b/test"}))
            assert job_key(RunSpec.of(**{**BASE, **change})) != plain, field
        else:
            assert job_key(RunSpec.of(**{**BASE, **change})) != base, field


def vit22b_checkpoint(tmp_path):
    from evalkit.models.vit22b import build, config

    cfg = config("test")
    return checkpoints.save_checkpoint(build(cfg, seed=3).state_dict(), tmp_path / "ck", {})


def changed(value, kind):
    """A different value of a setting's type."""
    if kind is bool:
        return not value
    if kind in (int, float):
        return value + 1
    if kind is str:
        return value + "x"
    return (*value, value[0]) if value else (1,)


@pytest.mark.parametrize("name", TASKS.names())
def test_every_task_setting_reaches_the_key(name):
    task = resolve_task(name)
    hints = typing.get_type_hints(type(task))
    for field in dataclasses.fields(task):
        other = copy.copy(task)  # set directly: this is about the key, not the setting's range
        object.__setattr__(other, field.name, changed(getattr(task, field.name), hints[field.name]))
        assert other.config() != task.config(), f"{name}: {field.name} misses the key"


@dataclasses.dataclass(frozen=True)
class Nothing(Task):
    name: str = "nothing"


def test_the_run_key_covers_task_backbone_data_and_seed(cli_env):
    ctx = RunSpec.of(**BASE).context(0)
    spec = job_spec(Nothing(), load_backbone("fake").info, ctx)
    assert set(spec) == {
        *("task", "version", "config", "backbone", "cache_dtype", "decoder", "data", "seed"),
        "seed_rule",
    }
    assert set(spec["backbone"]) == {
        "name",
        "weights",
        "options",
        "preprocess",
        "dtype",
        "libraries",
    }


def test_model_options_reach_the_feature_key_and_the_run(cli_env):
    first = evalkit.run(**BASE, out="o")
    second = evalkit.run(**BASE, out="o", model_args={"depth": 2})
    clean = evalkit.run(**BASE, out="clean", model_args={"depth": 2}, cache_dir="fresh")
    assert second[0]["provenance"]["images_extracted"] > 0  # not a cache hit
    assert [r["value"] for r in second] == [r["value"] for r in clean]
    assert [r["value"] for r in second] != [r["value"] for r in first]
    assert second[0]["backbone_options"] == {"depth": 2}


def test_dtype_and_data_changes_are_not_skipped(cli_env, data_cache, tmp_path):
    plain = evalkit.run(**BASE, out="o")
    bf16 = evalkit.run(**BASE, out="o", dtype="bf16")
    assert len(load_rows([cli_env / "o"])) == 4 and bf16[0]["provenance"]["dtype"] == "bf16"
    source = data_cache / "embedded"
    data_dir = tmp_path / "d"
    shutil.copytree(next(source.glob("shapes-*")), data_dir / "imagenet")  # times kept
    same = evalkit.run(**{**BASE, "data": "folder"}, data_dir=data_dir, out="o")
    assert len(load_rows([cli_env / "o"])) == 4  # the same files: the rows on disk answer
    assert [r["run_key"] for r in same] == [r["run_key"] for r in plain]
    shutil.rmtree(data_dir)
    shutil.copytree(next(source.glob("shapes-*")), data_dir / "imagenet", copy_function=shutil.copy)
    copied = evalkit.run(**{**BASE, "data": "folder"}, data_dir=data_dir, out="o")
    assert len(load_rows([cli_env / "o"])) == 4  # new times, the same bytes: the same data
    assert [r["run_key"] for r in copied] == [r["run_key"] for r in plain]
    victim = sorted((data_dir / "imagenet" / "val").rglob("*.png"))[0]
    Image.new("RGB", (8, 8), "white").resize(Image.open(victim).size).save(victim)
    edited = evalkit.run(**{**BASE, "data": "folder"}, data_dir=data_dir, out="o")
    assert len(load_rows([cli_env / "o"])) == 6 and edited[0]["provenance"]["images_extracted"]


def test_weights_id_sees_a_change_in_the_middle_and_is_memoised(tmp_path, monkeypatch):
    tensors = {f"block{i}": torch.full((256, 256), float(i)) for i in range(8)}
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    long_ago = path.stat().st_mtime_ns - 60 * 10**9
    os.utime(path, ns=(long_ago, long_ago))  # memoised only once the file is not fresh
    first = checkpoints.weights_id(path)
    calls = []
    real = identity.file_digest
    monkeypatch.setattr(identity, "file_digest", lambda p: calls.append(p) or real(p))
    assert checkpoints.weights_id(path) == first and not calls  # memo hit
    tensors["block4"] = torch.full((256, 256), 99.0)  # same size, middle of the file
    save_file(tensors, str(path))
    assert checkpoints.weights_id(path) != first and len(calls) == 1


def test_same_size_overwrite_changes_the_identity(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / cls / f"{i}.bmp")
    config = DataConfig(source="folder", root=tmp_path.parent)

    def folder_identity(verify=False):
        from evalkit.data.folder import ImageFolder

        ds = ImageFolder(tmp_path)
        ds.reading = Reading(verify=verify)
        return ds.identity()

    for path in tmp_path.rglob("*.bmp"):  # old enough for their digests to be remembered
        os.utime(path, ns=(path.stat().st_mtime_ns - 60 * 10**9,) * 2)
    before = folder_identity()
    assert folder_identity(verify=True) == before  # the bytes are what the memo says
    target = tmp_path / "a" / "0.bmp"
    stat = target.stat()
    Image.new("RGB", (8, 8), (0, 0, 200)).save(target)
    assert target.stat().st_size == stat.st_size  # same size, other pixels
    later = stat.st_mtime_ns + 10**9  # a later write (filesystem clocks tick coarsely)
    os.utime(target, ns=(later, later))
    assert folder_identity() != before
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old stamp, put back
    assert folder_identity(verify=True) != before  # caught by hashing again
    assert config.verify is False


def test_non_utf8_file_names_work(tmp_path):
    folder = os.fsencode(tmp_path / "cls")
    os.mkdir(folder)
    Image.new("RGB", (4, 4)).save(os.fsdecode(folder + b"/caf\xe9.png"))
    Image.new("RGB", (4, 4)).save(os.fsdecode(folder + b"/ok.png"))
    os.mkdir(tmp_path / "other")
    Image.new("RGB", (4, 4)).save(tmp_path / "other" / "x.png")
    from evalkit.data.folder import ImageFolder

    assert len(ImageFolder(tmp_path).identity()) == 16
    assert identity.tree_identity(tmp_path) != "missing"


def shard_files(cache):
    return sorted(cache.glob("features/*/shard-*.safetensors"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_damaged_shards_are_recomputed_with_a_warning(fake, data_cache, tmp_path, damage, capsys):
    dataset = open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache),
        transform=fake.transform(),
    )
    settings = ExtractSettings(cache_dir=tmp_path, batch_size=64, shard_size=128, progress=False)
    request = FeatureRequest()
    clean = extract_features(fake, dataset, request=request, settings=settings, split="val")
    victim = shard_files(tmp_path)[1]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-20:-10] = bytes(b ^ 0xFF for b in data[-20:-10])
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[:8] = b"\xff" * 8
    victim.write_bytes(bytes(data))
    again = extract_features(fake, dataset, request=request, settings=settings, split="val")
    assert torch.equal(again.pooled, clean.pooled) and not again.from_cache
    err = capsys.readouterr().err
    assert "warning: cached features" in err and victim.name in err and "Traceback" not in err
    third = extract_features(fake, dataset, request=request, settings=settings, split="val")
    assert third.from_cache and torch.equal(third.pooled, clean.pooled)


def test_table_keeps_two_weights_files_of_one_backbone_apart():
    def row(weights, value):
        return {
            "task": "t",
            "backbone": "timm/x",
            "weights_id": weights,
            "metric": "top1",
            "value": value,
            "config_hash": "c",
            "seed": 0,
        }

    frame = pivot_table([row("sha256:aaaa", 50.0), row("sha256:bbbb", 60.0)])
    assert list(frame.index) == ["timm/x [weights sha256:aaaa]", "timm/x [weights sha256:bbbb]"]
    assert list(frame.iloc[:, 0]) == ["50.00", "60.00"]
    single = pivot_table([row("sha256:aaaa", 50.0)])
    assert list(single.index) == ["timm/x"]


def test_a_warm_cache_is_verified_once(fake, data_cache, tmp_path, monkeypatch):
    from evalkit.storage import shards

    dataset = open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache, pixels="decode"),
        transform=fake.transform(),
    )
    settings = ExtractSettings(cache_dir=tmp_path, batch_size=64, shard_size=128, progress=False)
    extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    for shard in shard_files(tmp_path):  # old enough to be vouched for
        old = shard.stat().st_mtime_ns - 60 * 10**9
        os.utime(shard, ns=(old, old))
    extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    checked = []
    real = shards.load_shard
    monkeypatch.setattr(shards, "load_shard", lambda p, *a: checked.append(p) or real(p, *a))
    again = extract_features(
        fake, dataset, request=FeatureRequest(), settings=settings, split="val"
    )
    assert again.from_cache and checked == []  # one stat per shard, no read
    victim = shard_files(tmp_path)[0]
    victim.write_bytes(victim.read_bytes()[:-9])  # touched since: checked again, recomputed
    extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    assert checked == [victim]


def test_random_weights_drawn_under_named_draws_have_their_own_id(cli_env):
    """A random backbone's weights now come from the draw named ``backbone-weights``: their id
    differs from the one weights drawn from the bare seed had (seed rule 1), so features cached
    from those are never read for these; the built-in family's draws were always named and its
    ids stay as they were."""
    from evalkit.backbones.base import WEIGHTS_DRAW, random_init_id

    info = load_backbone("fake").info
    assert info.weights_id == random_init_id("fake:[]", 0, draw=WEIGHTS_DRAW)
    assert info.weights_id != random_init_id("fake:[]", 0)
    assert random_init_id("x", 0, {"depth": 2}, "d") != random_init_id("x", 0, {"depth": 2})
