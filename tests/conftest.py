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
    from evalkit.data import DataConfig
    from evalkit.features import ExtractSettings
    from evalkit.task import TaskContext

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
