"""Nothing silently wrong after damage or odd values: a value that is not a number is never
written as bare NaN nor ranked; a pair with NaN images is untested, not "p = 1"; a cut-off
per-image file is one line and recomputed; a decoded view changed in place under its stamp is
caught when read; cache files are readable by the group; the disk
check counts only what is not cached; a run waiting on another says so; the progress line's
time left and the card's publishing guard are what they say."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalkit.cli import main
from evalkit.core.results import append_rows, load_rows
from evalkit.errors import EvalkitError
from evalkit.publish.board_pairs import paired_on
from evalkit.publish.leaderboard import leaderboard


def strict(text: str):
    """JSON as the standard has it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))


def test_a_value_that_is_not_a_number_is_null_with_its_reason_and_never_ranked(tmp_path, capsys):
    row = {"task": "imagenet-knn", "backbone": "fake", "metric": "top1", "run_key": "k"}
    append_rows(tmp_path / "a.jsonl", [row | {"value": float("nan"), "stderr": float("inf")}])
    append_rows(tmp_path / "b.jsonl", [row | {"backbone": "other", "value": 50.0}])
    written = strict((tmp_path / "a.jsonl").read_text())
    assert written["value"] is None and written["value_invalid"] == "nan"
    assert written["stderr"] is None
    assert [r["backbone"] for r in load_rows([tmp_path])] == ["other"]
    assert "value 'nan' is not a number" in capsys.readouterr().err
    (board,) = leaderboard([tmp_path])["tasks"]
    assert [c["backbone"] for c in board["cells"]] == ["other"]


def test_the_leaderboards_json_is_valid_json(tmp_path, capsys):
    from evalkit.publish.rendering import as_json

    text = as_json({"tasks": [{"p": float("nan"), "interval": [float("-inf"), 1.0]}]})
    assert strict(text) == {"tasks": [{"p": None, "interval": [None, 1.0]}]}


def test_a_pair_with_nan_images_is_untested_not_a_tie():
    rng = np.random.default_rng(0)
    a = pd.DataFrame({"mse": rng.uniform(0, 1, 200)})
    b = pd.DataFrame({"mse": a["mse"] + 5.0})  # far apart: a clear difference
    assert paired_on("mse", a, b, seed=0).p < 0.01
    a.loc[7, "mse"] = np.nan
    assert paired_on("mse", a, b, seed=0) == "1 NaN images"
    right = pd.DataFrame({"correct": [True] * 50 + [None] * 2}, dtype=object)
    wrong = pd.DataFrame({"correct": [False] * 52})
    assert paired_on("top1", right, wrong, seed=0, task="imagenet-linear") == "2 NaN images"


def test_a_cut_off_per_image_file_is_one_line_and_recomputed(cli_env, capsys):
    argv = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--backbone", "vit22b/test"]
    argv += ["--random-init", "--data", "embedded", "--out", "zoo", "--quiet"]
    assert main(argv) == 0
    files = sorted((cli_env / "zoo" / "predictions").glob("*.parquet"))
    whole = files[0].read_bytes()
    files[0].write_bytes(whole[: len(whole) // 2])
    (task,) = leaderboard([cli_env / "zoo"])["tasks"]
    assert "cannot be read" in task["pairs"][0]["verdict"]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "is damaged or cut off: the cell is recomputed" in out.err
    lines = [line for line in out.out.splitlines() if line.startswith("[")]
    assert lines[0].endswith(": done") and lines[1].endswith("skipped (rows on disk)")
    pd.read_parquet(files[0])  # whole again
    (task,) = leaderboard([cli_env / "zoo"])["tasks"]
    assert "p_holm" in task["pairs"][0]


def test_cache_files_are_readable_by_the_group_as_the_umask_allows(tmp_path):
    import torch

    from evalkit.storage.shards import Place, save_shard

    old = os.umask(0o002)
    try:
        shard = {"pooled": torch.zeros(2, 3), "labels": torch.zeros(2)}
        save_shard(tmp_path, Place("entry", 0, 0, 2), shard)
    finally:
        os.umask(old)
    (shard,) = tmp_path.glob("shard-*")
    assert shard.stat().st_mode & 0o777 == 0o664  # safetensors alone writes 0600


def test_the_disk_check_counts_only_what_is_not_cached(cli_env, monkeypatch):
    import evalkit.core.budget as budget
    from evalkit.core.runner import run
    from evalkit.core.spec import RunSpec

    spec = RunSpec.of(
        tasks=("imagenet-knn",),
        backbones=("fake",),
        data="embedded",
        out="R",
        cache_dir=cli_env / "cache",
        progress=False,
    )
    list(run(spec))  # its features are now cached

    class Usage:
        free = 1024  # far less than the features would take

    monkeypatch.setattr(budget.shutil, "disk_usage", lambda _: Usage())
    rerun = RunSpec(**{**vars(spec), "rerun": True})
    (result,) = list(run(rerun))
    assert result.status == "done"
    fresh = RunSpec(**{**vars(rerun), "backbones": ("vit22b/test",), "random_init": True})
    with pytest.raises(EvalkitError, match="feature cache needs"):
        list(run(fresh))


def test_a_run_waiting_for_another_says_what_it_waits_for(tmp_path, capsys):
    import fcntl

    from evalkit.core.cells import wait_for_lock

    path = tmp_path / "job.lock"
    holder = open(path, "a")  # noqa: SIM115
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = open(path, "a")  # noqa: SIM115
    thread = threading.Thread(target=wait_for_lock, args=(waiter, path))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # still waiting, and it said so
    assert f"waiting for another run of this job to finish (it holds {path})" in (
        capsys.readouterr().err
    )
    fcntl.flock(holder, fcntl.LOCK_UN)
    thread.join(5)
    assert not thread.is_alive()
    holder.close()
    waiter.close()


def test_the_progress_lines_time_left_is_what_remains(monkeypatch):
    from evalkit import progress

    lines = progress.ProgressLines(progress.ProgressBar(True, 100, "extract"), io.StringIO())
    lines.done = 25
    text = lines.line(lines.start + 10.0)  # 2.5 img/s, 75 images to go
    assert "25/100 (25%)" in text and "about 30 s left" in text


def test_push_refuses_rows_that_do_not_record_their_data():
    from evalkit.publish.card import check_publishable

    real = {"task": "t", "metric": "m", "dataset": {"name": "imagenet", "stand_in": False}}
    check_publishable([real], allow_stand_in=False)
    with pytest.raises(EvalkitError):
        check_publishable([real | {"dataset": None}], allow_stand_in=False)
    with pytest.raises(EvalkitError):
        check_publishable([real | {"dataset": {"name": "imagenet", "stand_in": True}}], False)
    check_publishable([real | {"dataset": {"name": "imagenet", "stand_in": True}}], True)


def test_rows_of_a_job_whose_value_was_not_a_number_are_replaced_not_added(tmp_path):
    from evalkit.core.results import holds_run_key, replace_rows

    path = tmp_path / "rows.jsonl"
    row = {"task": "t", "backbone": "b", "metric": "m", "run_key": "k"}
    append_rows(path, [row | {"value": float("nan")}])
    assert holds_run_key(path, "k") and not load_rows([path])
    replace_rows(path, "k", [row | {"value": 1.0}])
    assert [json.loads(x)["value"] for x in Path(path).read_text().splitlines()] == [1.0]


def test_a_view_shard_changed_in_place_under_its_stamp_is_caught_on_read(cli_env, capsys):
    """A view shard changed after a full check, its size, modification time and inode kept
    (bit rot, a faulty copy), is caught when the next backbone reads it: one warning names
    the file, its images are decoded again, and the rows are a clean run's. Views are
    checked on every read, so no row is computed from damaged bytes."""
    from evalkit.cache.entries import verify_cache
    from evalkit.core.runner import run
    from evalkit.core.spec import RunSpec

    cache = cli_env / "cache"

    def knn(out: str, **options) -> dict[str, float]:
        spec = {"tasks": ("imagenet-knn",), "data": "embedded", "out": cli_env / out}
        spec |= {"cache_dir": cache, "progress": False, "pixels": "cache"} | options
        (result,) = list(run(RunSpec.of(**spec)))
        return {r["metric"]: r["value"] for r in result.rows}

    second = {"backbones": ("fake",), "model_args": {"dim": 16}}
    clean = knn("clean", no_cache=True, pixels="decode", **second)
    knn("R", backbones=("fake",))  # decodes, and keeps the views
    (shard, *_) = sorted((cache / "pixels").glob("*/shard-*.safetensors"))
    past = time.time() - 120  # an old cache: its stamps are vouched for, and recorded
    for path in (cache / "pixels").glob("*/shard-*"):
        os.utime(path, (past, past))
    assert not any(entry["bad"] for entry in verify_cache(cache, progress=False))
    flip_in_place(shard)
    capsys.readouterr()
    assert knn("R", **second) == clean
    warned = [line for line in capsys.readouterr().err.splitlines() if str(shard) in line]
    assert len(warned) == 1 and "checksum mismatch" in warned[0], warned
    rows = load_rows([cli_env / "R"])
    assert sorted(r["value"] for r in rows if r["backbone_options"]) == sorted(clean.values())
    assert not any(entry["bad"] for entry in verify_cache(cache, progress=False))  # re-kept


def flip_in_place(path: Path):
    """Invert the middle three quarters of a file's bytes (the views, not the header),
    keeping its size, inode and modification time."""
    before = path.stat()
    with open(path, "r+b") as file:
        start, stop = before.st_size // 8, before.st_size * 7 // 8
        file.seek(start)
        piece = file.read(stop - start)
        file.seek(start)
        file.write(bytes(255 - b for b in piece))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


def test_a_read_only_pixel_folder_is_read_and_never_written(cli_env, capsys, monkeypatch):
    """A pixel folder this process cannot write (a read-only mount, another member's files:
    emulated, since root writes anywhere) is read where it serves, and nothing in it changes;
    features are still kept."""
    import evalkit.storage.writes
    from evalkit.core.runner import run
    from evalkit.core.spec import RunSpec

    cache = cli_env / "cache"

    def knn(**options) -> dict[str, float]:
        spec = {"tasks": ("imagenet-knn",), "backbones": ("fake",), "data": "embedded"}
        spec |= {"out": cli_env / "R", "cache_dir": cache, "progress": False, "pixels": "cache"}
        (result,) = list(run(RunSpec.of(**(spec | options))))
        return {r["metric"]: r["value"] for r in result.rows}

    knn()  # keeps the views
    before = {p: p.stat().st_mtime_ns for p in (cache / "pixels").rglob("*")}
    real = evalkit.storage.writes.writable
    monkeypatch.setattr(
        evalkit.storage.writes,
        "writable",
        lambda folder: "pixels" not in str(folder) and real(folder),
    )
    values = knn(model_args={"dim": 16})
    assert set(values) == {"top1/k=20", "top5/k=20"}
    assert {p: p.stat().st_mtime_ns for p in (cache / "pixels").rglob("*")} == before
    assert "cannot be written" in capsys.readouterr().err
    assert len(list((cache / "features").glob("*/manifest.json"))) == 4  # two splits each
