"""Fault injection: whatever stops a run — SIGKILL or SIGTERM at a seeded random moment, a
full disk at any one write, a read-only `--out`, several processes on one cache and `--out` —
the rerun gives the clean run's rows, and nothing is left behind (no temporary file or folder,
`evalkit cache verify` clean).

The default suite runs the full-disk subset; the rest is marked ``slow`` (``nox -s faults`` or
``pytest -m slow tests/test_faults.py``): kills during extraction, the probe, LiT and a
sweep, every write of a run failing in turn, four processes at once."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.storage.shards import VERIFIED

PROBE = [
    "run",
    "--task",
    "imagenet-linear",
    "--backbone",
    "fake",
    "--data",
    "embedded",
    "--quiet",
    "--set",
    "l2_grid=0.1,0.01",
    "--save-predictions",
]
LIT = [
    "run",
    "--task",
    "lit-imagenet",
    "--backbone",
    "fake",
    "--data",
    "embedded",
    "--quiet",
    "--set",
    "steps=6",
    "--set",
    "batch_size=32",
]
SWEEP_TASKS = ["imagenet-linear", "imagenet-5shot", "imagenet-knn"]


def rows(out: Path) -> dict:
    """(task, metric, seed) → value of every readable row under ``out``."""
    found = {}
    for path in sorted(Path(out).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:  # a torn line, kept apart by design
                continue
            found[(r["task"], r["metric"], r["seed"])] = r["value"]
    return found


def leftovers(*folders: Path) -> list[str]:
    return [str(p) for f in folders if f.exists() for p in f.rglob("*") if ".tmp" in p.name]


def cli(args, cache: Path, out: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "evalkit", *args, "--cache-dir", str(cache), "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def clean_run(args, tmp_path: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    proc = cli(args, tmp_path / "clean-cache", tmp_path / "clean")
    assert proc.wait(timeout=900) == 0, proc.stderr.read()
    return rows(tmp_path / "clean"), time.perf_counter() - start


def interrupted_then_rerun(args, tmp_path: Path, signum: int, seed: int):
    """Kill a run at a seeded random moment within the clean run's time, rerun it, and check
    the rows, the leftovers and the cache."""
    expected, seconds = clean_run(args, tmp_path)
    cache, out = tmp_path / "cache", tmp_path / "out"
    proc = cli(args, cache, out)
    time.sleep(random.Random(seed).uniform(0.15, 0.85) * seconds)
    proc.send_signal(signum)
    proc.wait(timeout=900)
    again = cli(args, cache, out)
    assert again.wait(timeout=900) == 0, again.stderr.read()
    assert rows(out) == expected
    assert leftovers(cache, out) == []
    assert main(["cache", "verify", "--cache-dir", str(cache), "--quiet"]) == 0


@pytest.mark.slow  # the default suite kills an extraction in tests/test_features.py
def test_sigkill_during_a_probe_run_then_rerun(cli_env, tmp_path):
    interrupted_then_rerun(PROBE, tmp_path, signal.SIGKILL, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("args", [PROBE, LIT], ids=["probe", "lit"])
def test_killed_at_random_moments_then_rerun(cli_env, tmp_path, args, signum, seed):
    interrupted_then_rerun(args, tmp_path, signum, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_a_killed_sweep_then_rerun(cli_env, tmp_path, seed):
    sweep = [
        "run",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--quiet",
        "--seed",
        "0",
        "--seed",
        "1",
    ] + [a for t in SWEEP_TASKS for a in ("--task", t)]
    interrupted_then_rerun(sweep, tmp_path, signal.SIGKILL, seed)


class DiskFull:
    """``os.replace`` (every file evalkit writes is renamed into place through it) and the
    rows' ``fsync`` fail with ENOSPC at call number ``at``."""

    def __init__(self, at: int):
        self.at, self.calls, self.failed_on = at, 0, None

    def __call__(self, real):
        def failing(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at:
                self.failed_on = str(args[-1])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)

        return failing


def writes_of_a_run(args, tmp_path, monkeypatch) -> tuple[int, dict]:
    """How many writes a clean run makes, and its rows."""
    counter = DiskFull(at=0)
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", counter(os.replace))
        patch.setattr(os, "fsync", counter(os.fsync))
        assert (
            main([*args, "--cache-dir", str(tmp_path / "c0"), "--out", str(tmp_path / "o0")]) == 0
        )
    return counter.calls, rows(tmp_path / "o0")


def is_memo(path: str) -> bool:
    """A file whose write is best effort: a data digest memo or a feature entry's record of the
    shards that passed their check (``storage.shards.VERIFIED``)."""
    return f"{os.sep}identity{os.sep}" in path or Path(path).name == VERIFIED


def full_disk_at(at: int, args, tmp_path, monkeypatch, capsys, expected: dict):
    cache, out = tmp_path / f"c{at}", tmp_path / f"o{at}"
    with monkeypatch.context() as patch:
        fault = DiskFull(at)
        patch.setattr(os, "replace", fault(os.replace))
        patch.setattr(os, "fsync", fault(os.fsync))
        code = main([*args, "--cache-dir", str(cache), "--out", str(out)])
    lines = capsys.readouterr().err.splitlines()
    if f"{os.sep}pixels{os.sep}" in str(fault.failed_on):
        # decoded views only save the next backbone time: the run goes on without them
        kept = [line for line in lines if "kept for the next backbone" in line]
        assert code == 0 and len(kept) == 1 and "no space left" in kept[0].lower(), (at, lines)
        assert rows(out) == expected, at
        return
    if fault.failed_on is None or is_memo(fault.failed_on):
        # a memo (a data digest, a shard's passed check) only saves the next look its hashing:
        # the run goes on without it; and seconds-old files are not memoised (racy clean), so a
        # later run may write fewer
        assert code == 0 and rows(out) == expected, (at, fault.failed_on, lines)
        return
    err = [line for line in lines if line.startswith("error")]
    assert code == 2 and len(err) == 1 and "no space left" in err[0], (at, fault.failed_on, err)
    assert "writing a file" not in err[0], (at, err)  # the path is named
    assert leftovers(cache, out) == [], at  # the failed write took its temporary file away
    assert main([*args, "--cache-dir", str(cache), "--out", str(out)]) == 0
    assert rows(out) == expected, at
    assert leftovers(cache, out) == [], at


@pytest.mark.long
def test_a_full_disk_at_some_writes_of_a_run(cli_env, tmp_path, monkeypatch, capsys):
    count, expected = writes_of_a_run(PROBE, tmp_path, monkeypatch)
    assert count > 5
    for at in sorted(random.Random(0).sample(range(1, count + 1), 3)):
        full_disk_at(at, PROBE, tmp_path, monkeypatch, capsys, expected)


@pytest.mark.slow
def test_a_full_disk_at_every_write_of_a_run(cli_env, tmp_path, monkeypatch, capsys):
    count, expected = writes_of_a_run(PROBE, tmp_path, monkeypatch)
    for at in range(1, count + 1):
        full_disk_at(at, PROBE, tmp_path, monkeypatch, capsys, expected)


@pytest.mark.slow
def test_four_processes_on_one_cache_and_out(cli_env, tmp_path):
    expected, _ = clean_run(PROBE, tmp_path)
    cache, out = tmp_path / "cache", tmp_path / "out"
    procs = [cli(PROBE, cache, out) for _ in range(4)]
    assert all(p.wait(timeout=900) == 0 for p in procs)
    lines = (out / "imagenet-linear.jsonl").read_text().splitlines()
    assert rows(out) == expected and len(lines) == len(expected)  # every row once
    assert leftovers(cache, out) == []
