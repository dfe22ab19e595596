"""Every reuse answers for exactly its inputs: the reuse sites are enumerated and each keys on
the runner's own spec; data identities see what readers read; sweeps, pretraining, fine-tuning
checkpoints, text towers, tables and comparisons, rows files and training folders."""

from __future__ import annotations

import ast
import io
import os
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from evalkit.core.catalog import resolve_task
from evalkit.core.cells import request_spec
from evalkit.core.gate import compare
from evalkit.core.results import append_row, load_rows
from evalkit.core.spec import RunSpec
from evalkit.core.tables import pivot_table
from evalkit.core.task import job_spec
from evalkit.errors import EvalkitError
from evalkit.storage.identity import spec_key, tree_identity

ROOT = Path(__file__).parents[1]

# Every place that turns a spec into a key for reuse, and what it keys on. A new call of
# spec_key in the package fails the census below until it is listed here with its basis.
REUSE_SITES = {
    ("evalkit/cache/keys.py", "cache_key"): "feature_spec: backbone_spec + data + request",
    ("evalkit/cache/keys.py", "backbone_key"): "backbone_spec: a setup's entries (disk check)",
    ("evalkit/cache/pixels.py", "subset_key"): "the subset's indices, in feature and pixel keys",
    ("evalkit/cache/pixels.py", "pixel_store"): "data identity + view geometry/decoder + subset",
    ("evalkit/core/task.py", "run_key"): "job_spec: rows' run key, a fine-tuned model's folder",
    ("evalkit/core/cells.py", "request_key"): "request_spec: rows' request key (runner, sweep)",
    ("evalkit/core/cells.py", "study_record"): "a study's cell list: names shares, reuses nothing",
    ("tasks/zeroshot.py", "tower_id"): "backbone_spec, or the tower's content + libraries",
    ("evalkit/heads/zeroshot.py", "key"): "tower_id + names + templates",
    ("evalkit/heads/zeroshot.py", "names_id"): "a record of class names, not a reuse key",
    ("evalkit/training/pretrain.py", "_train_size"): "size_spec (keyed folders)",
    ("evalkit/training/pretrain.py", "_finished"): "size_spec",
    ("evalkit/storage/checkpoints.py", "weights_id"): "content ids of every checkpoint file",
    ("evalkit/data/folder.py", "identity"): "labels + transform, beside the files' identity",
    ("evalkit/data/captions.py", "identity"): "captions + transform, beside the files' identity",
}


def _spec_key_calls():
    """(file, enclosing function) of every spec_key call in evalkit/ and tasks/."""
    found = set()
    for path in [*ROOT.glob("evalkit/**/*.py"), *ROOT.glob("tasks/*.py")]:
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                called = getattr(node, "func", None)
                if "spec_key" in (getattr(called, "id", ""), getattr(called, "attr", "")):
                    found.add((str(path.relative_to(ROOT)), func.name))
    return found


def test_every_reuse_site_is_enumerated():
    listed = {(file, name.split("/")[0]) for file, name in REUSE_SITES}
    found = _spec_key_calls() - {("evalkit/storage/identity.py", "spec_key")}
    assert not found - listed, (
        f"a new reuse key: list it in REUSE_SITES with its basis: {found - listed}"
    )
    assert not listed - found, f"listed but no longer a reuse key: {listed - found}"


def _context(spec: RunSpec, seed=0):
    from evalkit.backbones import load_backbone

    backbone = load_backbone(spec.backbones[0], spec.backbone_options(seed))
    return backbone, resolve_task(spec.tasks[0], spec.overrides), spec.context(seed)


def test_the_sites_key_on_the_runners_spec(cli_env, monkeypatch):
    """Fine-tuning checkpoints key on the run key itself; the request key (sweeps) moves with
    every input the run key moves with, library versions included."""
    from evalkit.protocols.finetuning import checkpoint_dir

    flat = dict(tasks="imagenet-linear", backbones="fake", data="embedded", progress=False)
    spec = RunSpec.of(**flat)
    backbone, task, ctx = _context(spec)
    run_key = spec_key(job_spec(task, backbone.info, ctx), 16)
    assert checkpoint_dir(task, backbone, ctx).name == run_key
    base = spec_key(request_spec(spec, task, "fake", ctx))
    for change in (
        {"model_args": {"depth": 2}},
        {"dtype": "bf16"},
        {"cache_dtype": "fp16"},
        {"overrides": ("max_iter=7",)},
        {"seeds": (4,)},
    ):
        other = RunSpec.of(**flat, **change)
        _, other_task, other_ctx = _context(other, other.seeds[0])
        assert spec_key(request_spec(other, other_task, "fake", other_ctx)) != base, change
    monkeypatch.setattr(type(task), "version", task.version + 1)
    assert checkpoint_dir(task, backbone, ctx).name != run_key
    monkeypatch.setattr("evalkit.core.cells.library_versions", lambda *_: {"torch": "0.0"})
    assert spec_key(request_spec(spec, task, "fake", ctx)) != base


def _image(path: Path, value: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (value, 0, 0)).save(path)
    os.utime(path, ns=(10**18, 10**18 + value))


def test_data_identity_follows_links_and_counts_hidden_images(tmp_path):
    real = tmp_path / "store" / "val"
    _image(real / "a" / "x.png", 1)
    (tmp_path / "imagenet").mkdir()
    (tmp_path / "imagenet" / "val").symlink_to(real)
    before = tree_identity(tmp_path / "imagenet")
    _image(real / "a" / "x.png", 2)  # edited behind the link
    assert tree_identity(tmp_path / "imagenet") != before
    edited = tree_identity(tmp_path / "imagenet")
    _image(real / "a" / ".extra.bmp", 3)  # the folder reader reads it: so does the identity
    assert tree_identity(tmp_path / "imagenet") != edited
    (real / "loop").symlink_to(real)  # a link back up the tree is walked once
    assert tree_identity(tmp_path / "imagenet") != "missing"


def test_sweep_reruns_a_job_whose_data_or_weights_changed(cli_env, tmp_path):
    from evalkit.reproduction.sweep import Job, Sweep, finished

    for split, count in (("train", 2), ("val", 1)):
        for c in "ab":
            for i in range(count):
                _image(tmp_path / "data" / "imagenet" / split / c / f"{i}.png", 10 + i)
    plan = Sweep(
        jobs=(),
        out=tmp_path / "rows",
        run_args=("--data", "folder", "--data-dir", str(tmp_path / "data")),
    )
    weights = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(2)}, str(weights))
    with_weights = Job("imagenet-linear", "fake", weights=str(weights))
    for job in (Job("imagenet-linear", "fake"), with_weights):
        _write_done_rows(plan, job)
    assert finished(plan, Job("imagenet-linear", "fake"))
    assert not finished(plan, Job("imagenet-linear", "fake", seed=1))
    (tmp_path / "rows" / "imagenet-linear.jsonl").write_text("")
    _write_done_rows(plan, with_weights)
    assert finished(plan, with_weights)
    assert not finished(plan, Job("imagenet-linear", "fake"))  # no --weights: another job
    _image(tmp_path / "data" / "imagenet" / "val" / "a" / "new.png", 99)
    assert not finished(plan, with_weights)  # a val image added


def _write_done_rows(plan, job):
    from evalkit.reproduction.sweep import request_key

    key = request_key(plan, job, {})
    path = plan.out / "imagenet-linear.jsonl"
    for metric in ("top1", "top5"):
        append_row(
            path,
            {
                "task": job.task,
                "backbone": job.backbone,
                "seed": job.seed,
                "metric": metric,
                "value": 1.0,
                "request_key": key,
            },
        )


def test_a_text_tower_folder_is_keyed_by_its_content(tmp_path):
    folder = tmp_path / "tower"
    folder.mkdir()
    task = resolve_task("zeroshot-imagenet", (f"text_tower={folder}",))
    save_file({"w": torch.ones(3)}, str(folder / "model.safetensors"))
    first = task.config()["text_tower_id"]
    save_file({"w": torch.zeros(3)}, str(folder / "model.safetensors"))  # retrained in place
    assert task.config()["text_tower_id"] not in (first, "missing")


def test_pretrain_into_the_same_out_with_other_settings_is_refused(cli_env, capsys):
    from evalkit.cli import main

    args = [
        "pretrain",
        "--ladder",
        "test",
        "--data",
        "embedded",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--warmup",
        "1",
        "--out",
        "ckpt",
        "--quiet",
    ]
    assert main(args) == 0
    weights = (cli_env / "ckpt/test/model.safetensors").read_bytes()
    assert main([*args, "--image", "64"]) == 2
    assert "holds a run with other image (image: 32 there, 64 now)" in capsys.readouterr().err
    assert main([*args, "--lr", "0.01"]) == 2
    assert "other schedule" in capsys.readouterr().err
    assert (cli_env / "ckpt/test/model.safetensors").read_bytes() == weights
    assert main([*args[:-3], "--out", "ckpt64", "--quiet", "--image", "64"]) == 0


def _row(pool: str, value: float, **extra):
    config = {"pool": pool, "max_iter": 10}
    return {
        "task": "imagenet-linear",
        "backbone": "timm/x",
        "weights_id": "sha256:aa",
        "backbone_options": extra.pop("options", {}),
        "metric": "top1",
        "value": value,
        "config": config,
        "config_hash": spec_key(config),
        "seed": 0,
        **extra,
    }


def test_table_and_compare_keep_run_specs_apart():
    cls, mean = _row("cls", 50.0), _row("mean", 44.01)
    frame = pivot_table([cls, mean])
    assert list(frame.index) == ["timm/x [pool=cls]", "timm/x [pool=mean]"]
    assert list(frame.iloc[:, 0]) == ["50.00", "44.01"]
    records = compare([cls], [cls, mean], tolerance=0.0)
    assert {(r["backbone"], r["status"]) for r in records} == {
        ("timm/x [pool=cls]", "ok"),
        ("timm/x [pool=mean]", "new"),
    }
    sized = _row("cls", 47.0, options={"img_size": 384})
    frame = pivot_table([cls, sized])
    assert list(frame.index) == ["timm/x", "timm/x [img_size=384]"]
    assert sorted(r["status"] for r in compare([cls], [sized], tolerance=0.0)) == ["missing", "new"]


def _plain(metric: str, value=1.0) -> dict:
    return {"task": "t", "backbone": "b", "metric": metric, "value": value}


def test_a_torn_rows_file_keeps_the_next_row(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    append_row(path, _plain("a"))
    with path.open("a") as f:
        f.write('{"metric": "b", "val')  # a write cut off by a full disk
    append_row(path, _plain("c"))
    assert [r["metric"] for r in load_rows([path])] == ["a", "c"]
    err = capsys.readouterr().err
    assert "torn line" in err and f"{path}:2 is not a result row (not JSON" in err


def test_a_full_disk_at_row_append_is_one_line(tmp_path, monkeypatch):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(EvalkitError, match=r"^no space left on the device writing .*t\.jsonl"):
        append_row(tmp_path / "t.jsonl", _plain("a"))


def test_latest_json_may_point_only_inside_its_own_folder(tmp_path):
    from evalkit.storage.identity import write_json
    from evalkit.training.loop import LATEST, latest_checkpoint

    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "run"
    for pointer in ("../precious", str(victim), "checkpoint-0000001/../../precious"):
        write_json(out / LATEST, {"checkpoint": pointer, "step": 1})
        with pytest.raises(EvalkitError, match="not a checkpoint-<step> folder of its own"):
            latest_checkpoint(out)
    write_json(out / LATEST, {"checkpoint": "checkpoint-0000003", "step": 3})
    assert latest_checkpoint(out) == out / "checkpoint-0000003"
    assert (victim / "keep.txt").read_text() == "mine"


def test_a_publish_never_deletes_outside_its_folder(tmp_path):
    from evalkit.storage.identity import write_json
    from evalkit.training.loop import LATEST, _publish

    victim = tmp_path / "precious"
    victim.mkdir()
    out = tmp_path / "run"
    (out / ".checkpoint-0000002.tmp").mkdir(parents=True)
    write_json(out / LATEST, {"checkpoint": "../precious", "step": 1})
    with pytest.raises(EvalkitError):
        _publish(out, "checkpoint-0000002", 2)
    assert victim.exists()


def test_a_webdataset_link_member_is_skipped_not_a_traceback(tmp_path):
    from evalkit.data.captions import _scan_tars

    tar_path = tmp_path / "shard-000.tar"
    with tarfile.open(tar_path, "w") as tar:
        for key in ("a", "b"):
            png = io.BytesIO()
            Image.new("RGB", (8, 8)).save(png, format="PNG")
            for name, data in ((f"{key}.png", png.getvalue()), (f"{key}.txt", b"a square")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("c.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc/hostname"
        tar.addfile(link)
    scan = _scan_tars([tar_path])
    assert len(scan.sources) == 2 and scan.skipped["link or folder member"] == 1
