"""A team's feature cache on a read-only mount: a run that finds its features there succeeds
and reads them (no image is extracted again), a run that needs others computes them in memory
without writing, and `evalkit cache verify` reports without writing. The mount is real (a
read-only bind mount in a private mount namespace, ``unshare``); where the machine allows no
such namespace the test says so and is skipped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RUN = [
    sys.executable,
    "-m",
    "evalkit",
    "run",
    "--task",
    "imagenet-linear",
    "--backbone",
    "fake",
    "--data",
    "embedded",
    "--quiet",
    "--set",
    "l2_grid=0.1",
]


def _rows(folder: Path) -> list[tuple]:
    lines = (folder / "imagenet-linear.jsonl").read_text().splitlines()
    return [
        (r["metric"], r["value"], r["provenance"]["images_extracted"])
        for r in map(json.loads, lines)
    ]


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def _read_only(cache: Path, script: str) -> subprocess.CompletedProcess:
    """``script`` run in a mount namespace where ``cache`` is mounted read-only."""
    mount = f"mount --bind {cache} {cache} && mount -o remount,ro,bind {cache}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"{mount} && {script}"],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.long
def test_a_read_only_cache_is_read_and_never_written(cli_env, tmp_path):
    if shutil.which("unshare") is None or _read_only(tmp_path, "true").returncode != 0:
        pytest.skip("this machine allows no private read-only mount (unshare -rm)")
    cache = tmp_path / "team-cache"
    subprocess.run(
        [*RUN, "--cache-dir", str(cache), "--out", str(tmp_path / "first")],
        check=True,
        cwd=cli_env,
        capture_output=True,
        timeout=600,
    )
    before = _tree(cache)
    again = " ".join([*RUN, "--cache-dir", str(cache), "--out", str(tmp_path / "again")])
    other = f"{again} --set pool=mean --out {tmp_path / 'other'}"
    verify = f"{sys.executable} -m evalkit cache verify --cache-dir {cache} --quiet"
    done = _read_only(cache, f"cd {cli_env} && {again} && {other} && {verify}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is read-only: what it holds is read" in " ".join(done.stderr.split())
    first = _rows(tmp_path / "first")
    assert [(m, v) for m, v, _ in _rows(tmp_path / "again")] == [(m, v) for m, v, _ in first]
    assert all(n == 0 for _, _, n in _rows(tmp_path / "again"))  # every feature read
    assert all(n > 0 for _, _, n in _rows(tmp_path / "other"))  # computed in memory
    assert "0 damaged" in done.stdout
    assert _tree(cache) == before  # nothing written, nothing swept, no stamp
