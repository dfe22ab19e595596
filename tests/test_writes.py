"""Every writer goes through ``evalkit.storage.writes.replacing``: a full disk, a read-only file system
or a missing permission is one line naming the path, whichever library raised it (safetensors
raises its own error type, not ``OSError``); the temporary file is gone; a temporary left by a
process that died is swept on the next write beside it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.storage.identity import write_json
from evalkit.storage.writes import replacing, sweep_stale, temporary


def _leftovers(folder):
    return [p.name for p in folder.rglob("*") if ".tmp-" in p.name]


def test_safetensors_full_disk_error_is_one_line(fake, data_cache, tmp_path, monkeypatch):
    """The error safetensors really raises on a full disk, not an ``OSError``."""
    import safetensors.torch
    from safetensors import SafetensorError

    from evalkit.cache.extraction import extract_features
    from evalkit.cache.settings import ExtractSettings, FeatureRequest
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    dataset = open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache),
        transform=fake.transform(),
    )
    settings = ExtractSettings(cache_dir=tmp_path, shard_size=128, progress=False)
    with pytest.raises(EvalkitError, match=r"no space left on the device writing .*shard-00000"):
        extract_features(fake, dataset, request=FeatureRequest(), settings=settings, split="val")
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, "no space left"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "no permission"),
    ],
)
def test_json_records_fail_in_one_line_and_leave_nothing(tmp_path, monkeypatch, code, words):
    real = os.replace

    def failing(src, dst):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(EvalkitError, match=words) as caught:
        write_json(tmp_path / "verified.json", {"a": 1})
    monkeypatch.setattr(os, "replace", real)
    assert "verified.json" in str(caught.value) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_class_embeddings_and_predictions_fail_in_one_line(tmp_path, monkeypatch):
    import pandas as pd

    from evalkit.core.task import TaskContext
    from evalkit.data import DataConfig

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    table = tmp_path / "classifiers" / "table.pt"
    with pytest.raises(EvalkitError, match="no space left .*table.pt"), replacing(table) as tmp:
        torch.save({}, tmp)
    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    ctx = TaskContext(data=DataConfig(source="embedded", cache=tmp_path))
    ctx.predictions = tmp_path / "predictions" / "p.parquet"
    with pytest.raises(EvalkitError, match="no space left .*p.parquet"):
        ctx.save_predictions({"image": ["a"], "label": [1]})
    assert _leftovers(tmp_path) == []


def test_stand_in_data_on_a_full_disk_leaves_no_folder_and_stale_ones_are_swept(tmp_path):
    from evalkit.data.embedded import write_once

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = tmp_path / f".shapes-old.tmp-{dead}"
    (stale / "train").mkdir(parents=True)

    def fill(folder):
        (folder / "a.png").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(EvalkitError, match="no space left .*shapes-new"):
        write_once(tmp_path / "shapes-new", fill, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the stale folder swept too
    target = write_once(tmp_path / "shapes-new", lambda f: (f / "a.png").write_bytes(b"x"), {})
    assert (target / "a.png").exists()


def test_a_live_writers_temporary_is_left_alone(tmp_path):
    mine = temporary(tmp_path / "entry")
    mine.mkdir()
    sweep_stale(tmp_path)
    assert mine.exists()
