"""Hub checkpoints offline: ``--pretrained`` timm and open_clip backbones load from a Hugging
Face cache fabricated in the hub's own folder layout (random weights), with the checkpoint's
own preprocessing and the file's content id as the weights id; a missing file is one line that
names the repository, the file and how to place it. Nothing is downloaded: ``HF_HUB_OFFLINE``
is set and any socket connection fails the test."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from evalkit.backbones import load_backbone
from evalkit.backbones.options import BackboneOptions
from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.storage import checkpoints

TIMM_TAGGED = "vit_tiny_patch16_224.augreg_in21k"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def place_in_cache(cache, repo: str, files: dict) -> None:
    """``files`` (name → bytes) as the hub's cache keeps a downloaded revision."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(REVISION)
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name, content in files.items():
        (snapshot / name).write_bytes(content)


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    import socket

    local = socket.socket.connect

    def no_network(sock, address, *args):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError("a hub test reached for the network")
        return local(sock, address, *args)  # a loader worker handing over a batch (AF_UNIX)

    monkeypatch.setattr("socket.socket.connect", no_network)  # the cache alone must answer
    return cache


def timm_checkpoint(tmp_path):
    import timm

    torch.manual_seed(5)
    model = timm.create_model(TIMM_TAGGED.split(".")[0], num_classes=21843)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model.eval(), path


def test_a_cached_timm_checkpoint_loads_offline_with_its_own_config(tmp_path, hub_cache):
    model, path = timm_checkpoint(tmp_path)
    config = {
        "architecture": "vit_tiny_patch16_224",
        "pretrained_cfg": {"crop_pct": 0.95, "mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2]},
    }
    place_in_cache(
        hub_cache,
        f"timm/{TIMM_TAGGED}",
        {"model.safetensors": path.read_bytes(), "config.json": json.dumps(config).encode()},
    )
    backbone = load_backbone(f"timm/{TIMM_TAGGED}", BackboneOptions(pretrained=True))
    assert backbone.info.weights_id == checkpoints.weights_id(path)
    assert not backbone.info.random_init
    assert (backbone.info.preprocess.crop_pct, backbone.info.preprocess.mean) == (0.95, (0.4,) * 3)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(images), pre_logits=True)
    got = backbone.extract(images, layers=(-1,), pool="cls").pooled
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.long
def test_a_run_on_a_cached_checkpoint_records_the_files_content_id(tmp_path, hub_cache, cli_env):
    _, path = timm_checkpoint(tmp_path)
    place_in_cache(hub_cache, f"timm/{TIMM_TAGGED}", {"model.safetensors": path.read_bytes()})
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        f"timm/{TIMM_TAGGED}",
        "--pretrained",
        "--data",
        "embedded",
        "--quiet",
        "--out",
        str(tmp_path / "rows"),
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for f in (tmp_path / "rows").rglob("*.jsonl") for line in f.open()]
    assert rows and {r["weights_id"] for r in rows} == {checkpoints.weights_id(path)}
    assert not any(r.get("random_init") for r in rows)


def test_a_missing_hub_file_names_the_repository_file_and_remedy(hub_cache, capsys):
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        f"timm/{TIMM_TAGGED}",
        "--pretrained",
        "--data",
        "embedded",
    ]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"timm/{TIMM_TAGGED}" in err and "model.safetensors" in err
    assert f"hf download timm/{TIMM_TAGGED}" in err and "--weights PATH" in err


def test_without_a_network_the_cache_is_asked_at_once_in_one_line(hub_cache, monkeypatch, capsys):
    import socket

    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online mode, but nothing answers
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    probes = []

    def unreachable(address, timeout=None):
        probes.append(address)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        f"timm/{TIMM_TAGGED}",
        "--pretrained",
        "--data",
        "embedded",
    ]
    assert main(argv) == 2  # socket.socket.connect still fails the test if anything retries
    err = capsys.readouterr().err.strip()
    assert len(probes) == 1 and len(err.splitlines()) == 1 and "hf download" in err
    assert "in the cache" in err and "did not give" not in err


def test_an_untagged_timm_name_with_pretrained_says_to_name_a_tag(hub_cache):
    with pytest.raises(EvalkitError, match="no hub checkpoint|model.safetensors"):
        load_backbone("timm/vit_base_patch16_xp_224", BackboneOptions(pretrained=True))


def test_a_cached_open_clip_checkpoint_loads_offline(tmp_path, hub_cache, tiny_clip_registered):
    import open_clip

    torch.manual_seed(3)
    source = open_clip.create_model("Tiny-Test").eval()
    path = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    place_in_cache(
        hub_cache, "someorg/tiny-clip", {"open_clip_model.safetensors": path.read_bytes()}
    )
    backbone = load_backbone("open_clip/Tiny-Test:hubtag", BackboneOptions(pretrained=True))
    assert (
        backbone.info.weights_id == checkpoints.weights_id(path) and not backbone.info.random_init
    )
    assert (backbone.info.preprocess.mean, backbone.info.preprocess.interpolation) == (
        (0.3,) * 3,
        "bilinear",
    )
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = source.encode_image(images)
    torch.testing.assert_close(
        backbone.extract(images, pool="embed").pooled, expected, atol=1e-5, rtol=0
    )


def test_an_open_clip_tag_missing_from_the_cache_is_one_line(hub_cache, tiny_clip_registered):
    with pytest.raises(EvalkitError, match="someorg/tiny-clip.*hf download someorg/tiny-clip"):
        load_backbone("open_clip/Tiny-Test:hubtag", BackboneOptions(pretrained=True))
    with pytest.raises(EvalkitError, match="tags of Tiny-Test: hubtag"):
        load_backbone("open_clip/Tiny-Test:other", BackboneOptions(pretrained=True))
    with pytest.raises(EvalkitError, match="add --pretrained"):
        load_backbone("open_clip/Tiny-Test:hubtag")


@pytest.mark.long
def test_a_pinned_revision_is_loaded_recorded_and_keeps_its_own_cache_entry(
    tmp_path, hub_cache, cli_env, capsys
):
    """Two commits of one repository, both in the cache (``main`` points at the first):
    ``@<commit>`` loads that commit's bytes, each row says which commit it came from, and the
    two revisions' features never share a cache entry."""
    _, path = timm_checkpoint(tmp_path)
    place_in_cache(hub_cache, f"timm/{TIMM_TAGGED}", {"model.safetensors": path.read_bytes()})
    other = "fedcba9876543210fedcba9876543210fedcba98"
    newer = hub_cache / f"models--timm--{TIMM_TAGGED}" / "snapshots" / other
    newer.mkdir()
    torch.manual_seed(6)
    state = {k: torch.randn_like(v) for k, v in checkpoints.read_state_dict(path).items()}
    save_file(state, str(newer / "model.safetensors"))
    found = {}
    for revision in ("main", other):
        spec = f"timm/{TIMM_TAGGED}@{revision}"
        argv = [
            "run",
            "--task",
            "imagenet-knn",
            "--backbone",
            spec,
            "--pretrained",
            "--data",
            "embedded",
            "--quiet",
            "--out",
            str(tmp_path / "rows"),
            "--set",
            "ks=1",
            "--model-arg",
            "img_size=32",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
        assert main(argv) == 0
        rows = [json.loads(line) for f in (tmp_path / "rows").rglob("*.jsonl") for line in f.open()]
        found[revision] = [r for r in rows if r["backbone"] == spec]
    assert {r["weights_source"] for r in found["main"]} == {f"hub timm/{TIMM_TAGGED}@{REVISION}"}
    assert {r["weights_source"] for r in found[other]} == {f"hub timm/{TIMM_TAGGED}@{other}"}
    assert {r["weights_id"] for r in found["main"]} == {checkpoints.weights_id(path)}
    assert {r["weights_id"] for r in found[other]} != {checkpoints.weights_id(path)}
    assert {r["run_key"] for r in found["main"]}.isdisjoint(r["run_key"] for r in found[other])
    entries = {}
    for meta in (tmp_path / "cache").rglob("meta.json"):
        entries.setdefault(json.loads(meta.read_text()).get("backbone"), set()).add(meta.parent)
    assert entries[f"timm/{TIMM_TAGGED}@main"].isdisjoint(entries[f"timm/{TIMM_TAGGED}@{other}"])
    capsys.readouterr()
    assert main(["table", str(tmp_path / "rows"), "--detail"]) == 0
    detail = capsys.readouterr().out
    assert f"hub timm/{TIMM_TAGGED}@{REVISION}" in detail and f"@{other}" in detail


def test_a_revision_needs_pretrained_and_a_hub_family(hub_cache, capsys):
    for backbone, says in (
        (f"timm/{TIMM_TAGGED}@main", "add --pretrained"),
        ("vit22b/test@main", "@REVISION pins the hub weights"),
    ):
        argv = ["run", "--task", "imagenet-knn", "--backbone", backbone, "--data", "embedded"]
        assert main(argv) == 2
        assert says in " ".join(capsys.readouterr().err.split())


def test_a_revision_the_cache_lacks_is_one_line(tmp_path, hub_cache, capsys):
    _, path = timm_checkpoint(tmp_path)
    place_in_cache(hub_cache, f"timm/{TIMM_TAGGED}", {"model.safetensors": path.read_bytes()})
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        f"timm/{TIMM_TAGGED}@v9",
        "--pretrained",
        "--data",
        "embedded",
    ]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "at revision v9" in err and "hf download" in err


def hub_dataset(cache, repo: str, commit: str, colours: dict[str, tuple]) -> None:
    """A dataset repository revision as the hub's cache keeps it: parquet files per split
    (``data/<split>-00000-of-00001.parquet``) with ``image`` and ``label`` columns."""
    import datasets
    from PIL import Image

    folder = cache / ("datasets--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    if not (folder / "refs" / "main").exists():  # main stays at the first revision placed
        (folder / "refs" / "main").write_text(commit)
    names = sorted(colours)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}
    )
    for split, count in (("train", 24), ("val", 8)):
        images = [Image.new("RGB", (32, 32), colours[names[i % 2]]) for i in range(count)]
        table = datasets.Dataset.from_dict(
            {"image": images, "label": [i % 2 for i in range(count)]}, features=features
        )
        target = folder / "snapshots" / commit / "data" / f"{split}-00000-of-00001.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(str(target))


def test_a_hub_dataset_revision_is_read_from_the_cache_and_named_by_its_commit(hub_cache, cli_env):
    first, second = "1" * 40, "2" * 40
    hub_dataset(hub_cache, "org/dots", first, {"red": (255, 0, 0), "blue": (0, 0, 255)})
    hub_dataset(hub_cache, "org/dots", second, {"red": (250, 10, 0), "blue": (0, 10, 250)})
    rows = {}
    for revision in ("main", second):
        argv = [
            "run",
            "--task",
            "imagenet-knn",
            "--backbone",
            "fake",
            "--quiet",
            "--out",
            "rows",
            "--set",
            f"dataset=hf:org/dots@{revision}",
            "--set",
            "ks=1",
        ]
        assert main(argv) == 0
    for line in (cli_env / "rows").rglob("*.jsonl"):
        for row in map(json.loads, line.read_text().splitlines()):
            rows.setdefault(row["config"]["dataset"], []).append(row)
    assert set(rows) == {"hf:org/dots@main", f"hf:org/dots@{second}"}
    main_rows, second_rows = rows["hf:org/dots@main"], rows[f"hf:org/dots@{second}"]
    assert {r["extra"]["n_train"] for r in main_rows} == {24}
    assert {r["data_source"] for r in main_rows} == {f"hf:org/dots@{first}"}  # main → first
    assert {r["data_source"] for r in second_rows} == {f"hf:org/dots@{second}"}
    assert main_rows[0]["data_id"] != second_rows[0]["data_id"]


def test_a_hub_dataset_the_cache_lacks_is_one_line(hub_cache, capsys):
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--set",
        "dataset=hf:org/none@v2",
    ]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "hub dataset org/none at revision v2 is not in the cache" in err and "hf download" in err
