import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from evalkit.cache.entries import list_cache
from evalkit.cache.extraction import extract_features
from evalkit.cache.keys import cache_key
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.data import DataConfig
from evalkit.data.resolve import open_dataset


def _val(backbone, data_cache):
    return open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache),
        transform=backbone.transform(),
    )


def test_warm_cache_returns_identical_features(fake, data_cache, tmp_path):
    dataset = _val(fake, data_cache)
    settings = ExtractSettings(cache_dir=tmp_path, shard_size=100, progress=False)
    cold = extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    warm = extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    assert not cold.from_cache and warm.from_cache
    torch.testing.assert_close(cold.pooled, warm.pooled, rtol=0, atol=0)
    assert torch.equal(cold.labels, warm.labels)
    [entry] = [e for e in list_cache(tmp_path) if e["area"] == "features"]
    assert entry["complete"] and entry["n"] == len(dataset) and entry["shards"] == 4


def test_no_cache_gives_same_numbers_and_writes_nothing(fake, data_cache, tmp_path):
    dataset = _val(fake, data_cache)
    cached = extract_features(
        fake,
        dataset,
        request=FeatureRequest(pool="mean"),
        split="val",
        settings=ExtractSettings(cache_dir=tmp_path / "c", progress=False),
    )
    direct = extract_features(
        fake,
        dataset,
        request=FeatureRequest(pool="mean"),
        split="val",
        settings=ExtractSettings(cache_dir=None, batch_size=7, progress=False),
    )
    torch.testing.assert_close(cached.pooled, direct.pooled)
    assert not (tmp_path / "features").exists()


def test_dense_and_multilayer_features(fake, data_cache, tmp_path):
    dataset = _val(fake, data_cache)
    request = FeatureRequest(layers=(-1, -2), pool="cls", dense=True)
    feats = extract_features(
        fake,
        dataset,
        request=request,
        split="val",
        subset=range(10),
        settings=ExtractSettings(cache_dir=tmp_path, progress=False),
    )
    assert feats.pooled.shape == (10, 2 * fake.info.embed_dim)
    assert [g.shape for g in feats.grids] == [(10, fake.info.embed_dim, 4, 4)] * 2


def test_cache_key_covers_what_changes_numbers(fake):
    base = dict(dtype="fp32", dataset_id="d", split="val", subset=None)
    key = cache_key(fake.info, FeatureRequest(), **base)
    assert key == cache_key(fake.info, FeatureRequest(), **base)
    variants = [
        cache_key(fake.info, FeatureRequest(pool="mean"), **base),
        cache_key(fake.info, FeatureRequest(layers=(-2,)), **base),
        cache_key(fake.info, FeatureRequest(dense=True), **base),
        cache_key(fake.info, FeatureRequest(), **{**base, "dtype": "bf16"}),
        cache_key(fake.info, FeatureRequest(), **{**base, "device": "cuda:1"}),
        cache_key(fake.info, FeatureRequest(), **{**base, "dataset_id": "e"}),
        cache_key(fake.info, FeatureRequest(), **{**base, "split": "train"}),
        cache_key(fake.info, FeatureRequest(), **{**base, "shard_size": 100}),
        cache_key(fake.info, FeatureRequest(), **{**base, "subset": [1, 2]}),
    ]
    assert len({key, *variants}) == 10


SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from evalkit import load_backbone
    from evalkit.storage import shards
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset
    from evalkit.cache.extraction import extract_features
    from evalkit.cache.settings import ExtractSettings, FeatureRequest
    ready, data_cache, cache, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    if ready != "-":  # after the third shard is on disk: say so, then wait to be killed
        save = shards.save_shard
        def save_then_wait(folder, place, shard, **source):
            save(folder, place, shard, **source)
            if place.index == 2:
                Path(ready).touch()
                time.sleep(3600)
        shards.save_shard = save_then_wait
    bb = load_backbone("fake")
    ds = open_dataset("imagenet", "val", DataConfig(source="embedded", cache=data_cache), transform=bb.transform())
    f = extract_features(bb, ds, request=FeatureRequest(), split="val",
                         settings=ExtractSettings(cache_dir=cache, batch_size=16, shard_size=32,
                                                  workers=0, progress=False))
    torch.save({"pooled": f.pooled, "labels": f.labels}, out)
""")


def _extract(*args):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, *map(str, args)], env=env)


def test_sigkill_mid_extraction_then_rerun_matches_uninterrupted(data_cache, tmp_path):
    script = tmp_path / "extract.py"
    script.write_text(SCRIPT)
    cache, ready = tmp_path / "cache", tmp_path / "three-shards-written"
    proc = _extract(script, ready, data_cache, cache, tmp_path / "never.pt")
    while not ready.exists():  # the run says when it is mid-extraction: no timer
        assert proc.poll() is None, "the extraction ended before its third shard"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(cache.glob("features/*/shard-*.safetensors"))) == 3
    assert not list(cache.glob("features/*/manifest.json"))
    assert _extract(script, "-", data_cache, cache, tmp_path / "resumed.pt").wait() == 0
    fresh_cache = tmp_path / "fresh"
    assert _extract(script, "-", data_cache, fresh_cache, tmp_path / "fresh.pt").wait() == 0
    resumed, fresh = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "fresh.pt")
    assert torch.equal(resumed["pooled"], fresh["pooled"])
    assert torch.equal(resumed["labels"], fresh["labels"])
    manifest = json.loads(next(cache.glob("features/*/manifest.json")).read_text())
    assert manifest["n"] == len(fresh["labels"])


def test_corrupt_image_in_a_worker_is_still_one_line(fake, tmp_path):
    import pytest
    from PIL import Image

    from evalkit.data.folder import ImageFolder
    from evalkit.errors import EvalkitError

    (tmp_path / "cat").mkdir()
    for i in range(3):
        Image.new("RGB", (32, 32)).save(tmp_path / "cat" / f"{i}.png")
    (tmp_path / "cat" / "3.png").write_bytes(b"broken")
    dataset = ImageFolder(tmp_path, fake.transform())
    settings = ExtractSettings(cache_dir=None, batch_size=2, workers=2, progress=False)
    with pytest.raises(EvalkitError) as err:
        extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="x")
    message = str(err.value)
    assert "\n" not in message and "3.png" in message and message.startswith("corrupt")


def test_cached_features_are_a_view_read_shard_by_shard(fake, data_cache, tmp_path):
    from pathlib import Path

    dataset = _val(fake, data_cache)
    settings = ExtractSettings(cache_dir=tmp_path, batch_size=32, shard_size=100, progress=False)
    feats = extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="v")
    assert all(isinstance(p, Path) for p in feats.parts)  # nothing held after extraction
    memory = extract_features(
        fake,
        dataset,
        request=FeatureRequest(),
        settings=ExtractSettings(batch_size=32, shard_size=100, progress=False),
        split="v",
    )
    whole = memory.pooled
    assert torch.equal(feats.pooled, whole) and torch.equal(feats.labels, memory.labels)
    picks = torch.tensor([350, 3, 99, 100, 201, 3])  # across shards, unsorted, repeated
    assert torch.equal(feats.take(picks), whole[picks])
    assert feats._held[0] == 3  # one shard held: the last one read
    assert torch.equal(torch.cat(list(feats.chunks())), whole)
    assert feats.take([]).numel() == 0


def test_standardizer_from_chunks_equals_whole():
    from evalkit.heads.linear import Standardizer

    x = torch.randn(1000, 16) * 3 + 5
    whole, chunked = Standardizer.fit(x), Standardizer.fit_chunks(x.split(130))
    torch.testing.assert_close(chunked.mean, whole.mean, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked.std, whole.std, atol=1e-5, rtol=1e-5)


@pytest.mark.long
def test_streamed_probe_matches_resident(fake, ctx, tmp_path):
    import dataclasses

    from evalkit import get_task
    from evalkit.core.runner import run_task

    resident, _ = run_task(get_task("imagenet-linear"), fake, ctx, out_dir=tmp_path)
    task = get_task("imagenet-linear", ["resident_gb=0"])
    small_shards = dataclasses.replace(ctx.extract, shard_size=100)  # 10 shards to stream
    streamed, _ = run_task(
        task, fake, dataclasses.replace(ctx, extract=small_shards), out_dir=tmp_path
    )
    assert streamed[0]["extra"]["probe_mode"] == "streamed"
    assert resident[0]["extra"]["probe_mode"] == "resident"
    assert streamed[0]["extra"]["l2"] == resident[0]["extra"]["l2"]
    for a, b in zip(resident, streamed, strict=True):
        assert abs(a["value"] - b["value"]) <= 100 / a["n"] + 1e-9  # one image at most


def test_cache_stores_the_chosen_dtype_and_probes_agree(fake, ctx, tmp_path):
    import dataclasses

    from evalkit import get_task
    from evalkit.core.runner import run_task

    dataset = _val(fake, ctx.data.cache)
    half = ExtractSettings(cache_dir=tmp_path / "c", cache_dtype="bf16", progress=False)
    full = ExtractSettings(cache_dir=tmp_path / "c", progress=False)
    stored = extract_features(fake, dataset, request=FeatureRequest(), settings=half, split="v")
    plain = extract_features(fake, dataset, request=FeatureRequest(), settings=full, split="v")
    assert stored.pooled.dtype == torch.bfloat16 and plain.pooled.dtype == torch.float32
    assert torch.equal(stored.pooled, plain.pooled.bfloat16())
    rows = {}
    for storage in ("fp32", "fp16"):
        extract = dataclasses.replace(ctx.extract, cache_dtype=storage)
        [top1, _], _ = run_task(
            get_task("imagenet-linear"),
            fake,
            dataclasses.replace(ctx, extract=extract),
            out_dir=tmp_path,
        )
        rows[storage] = top1
    assert rows["fp16"]["provenance"]["cache_dtype"] == "fp16"
    assert abs(rows["fp16"]["value"] - rows["fp32"]["value"]) <= 100 / rows["fp32"]["n"] + 1e-9
