"""A study spread over machines, each with its own copy of the data: the same bytes at another
path, mount or modification time are the same data (the same identity, rows, keys and
per-image files), so shards run on two nodes merge and rank; changed bytes are still caught,
by a new stamp or by ``--verify-data`` when the stamp was kept."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
from PIL import Image
from rows_compare import stable

from evalkit.cli import main
from evalkit.data.folder import ImageFolder
from evalkit.data.resolve import Reading
from evalkit.storage import identity

ZOO = '[[backbone]]\nname = "fake"\n\n[[backbone]]\nname = "fake"\nmodel_args = { dim = 16 }\n'
TASKS = ("imagenet-knn", "imagenet-1shot")
MINUTE_NS = 60 * 10**9


def copy_data(source: Path, target: Path, *, shift_ns: int) -> Path:
    """``source`` copied to ``target`` as another node would hold it: other inodes, and
    modification times ``shift_ns`` off the source's."""
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        if path.is_file():
            mtime = (source / path.relative_to(target)).stat().st_mtime_ns - shift_ns
            os.utime(path, ns=(mtime, mtime))
    return target


def stand_in(data_cache: Path) -> Path:
    """The embedded ImageNet stand-in of the session cache (written by the first run)."""
    return next((data_cache / "embedded").glob("shapes-*"))


def images(folder: Path) -> dict[str, list[str]]:
    return {
        p.name: pd.read_parquet(p)["image"].tolist()
        for p in sorted((folder / "predictions").glob("*.parquet"))
    }


def run_knn(out: str, *extra: str) -> int:
    argv = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--out", out, "--quiet"]
    return main([*argv, *extra])


def test_two_copies_of_a_folder_have_one_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    for cls in ("a", "b"):
        (tmp_path / "one" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 9, 0)).save(tmp_path / "one" / cls / f"{i}.png")
    copy_data(tmp_path / "one", tmp_path / "two", shift_ns=5 * MINUTE_NS)
    one, two = ImageFolder(tmp_path / "one"), ImageFolder(tmp_path / "two")
    assert one.identity() == two.identity()
    assert identity.tree_identity(tmp_path / "one") == identity.tree_identity(tmp_path / "two")
    (tmp_path / "two" / "a" / "0.png").rename(tmp_path / "two" / "a" / "9.png")
    assert ImageFolder(tmp_path / "two").identity() != one.identity()  # the names count


def test_a_second_look_hashes_nothing_and_verify_data_catches_a_kept_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "d" / "a").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (8, 8), (50 * i, 0, 0)).save(tmp_path / "d" / "a" / f"{i}.bmp")
    for path in (tmp_path / "d").rglob("*.bmp"):  # old enough for digests to be remembered
        os.utime(path, ns=(path.stat().st_mtime_ns - MINUTE_NS,) * 2)

    def look(verify=False):
        dataset = ImageFolder(tmp_path / "d")
        dataset.reading = Reading(verify=verify)
        return dataset.identity()

    assert look(verify=True) == look()  # hashed or remembered: one identity
    hashed = []
    real = identity.data_digest
    monkeypatch.setattr(identity, "data_digest", lambda p: hashed.append(p) or real(p))
    before = look()
    assert look() == before and not hashed  # a second look: a stat per file
    assert look(verify=True) == before and len(hashed) == 4  # --verify-data: hashed again
    target = tmp_path / "d" / "a" / "0.bmp"
    stat = target.stat()
    Image.new("RGB", (8, 8), (0, 0, 200)).save(target)  # same size, same inode
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old stamp put back
    assert target.stat().st_size == stat.st_size and target.stat().st_ino == stat.st_ino
    assert look() == before  # the memo is trusted while the stamp holds
    changed = look(verify=True)
    assert changed != before and look() == changed  # caught, and remembered
    Image.new("RGB", (8, 8), (0, 200, 0)).save(target)
    later = stat.st_mtime_ns + MINUTE_NS // 2  # a later write: no --verify-data needed
    os.utime(target, ns=(later, later))
    assert look() not in (before, changed)


def test_a_read_only_cache_still_identifies_data(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "identity").mkdir(parents=True)
    (cache / "identity" / identity.DATA_MEMOS).write_text("not a folder")
    monkeypatch.setenv("EVALKIT_CACHE", str(cache))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"abc")
    os.utime(tmp_path / "d" / "x.bin", ns=(0, 0))
    first = identity.tree_identity(tmp_path / "d")
    assert identity.tree_identity(tmp_path / "d") == first  # hashed again, same answer


def test_the_stand_in_written_in_two_caches_gives_the_same_rows_and_keys(
    cli_env, data_cache, monkeypatch
):
    """Two nodes, each writing the embedded stand-in into its own cache."""
    assert run_knn("a", "--data", "embedded") == 0
    monkeypatch.setenv("EVALKIT_CACHE", str(cli_env / "other-node"))
    assert run_knn("b", "--data", "embedded") == 0
    a, b = stable(cli_env / "a"), stable(cli_env / "b")
    assert [r["request_key"] for r in a] == [r["request_key"] for r in b]
    assert [r["run_key"] for r in a] == [r["run_key"] for r in b]
    assert a[0]["data_files"] == b[0]["data_files"] and a == b


def test_one_cell_on_two_data_copies_writes_one_per_image_file(cli_env, data_cache):
    """A shard rerun elsewhere (another mount, another copy) after preemption: its per-image
    files name images relative to the dataset's root, so they equal the first run's and the
    two result folders merge."""
    assert run_knn("warm", "--data", "embedded") == 0
    for node, shift in (("n1", MINUTE_NS), ("n2", 7 * MINUTE_NS)):
        copy_data(stand_in(data_cache), cli_env / node / "data" / "imagenet", shift_ns=shift)
        extra = ("--data", "folder", "--data-dir", f"{node}/data", "--save-predictions")
        assert run_knn(f"{node}/out", *extra) == 0
    one, two = images(cli_env / "n1" / "out"), images(cli_env / "n2" / "out")
    assert len(one) == 1 and list(one.values()) == list(two.values())
    ids = next(iter(one.values()))
    assert ids[0].startswith("val/") and not any(os.path.isabs(i) for i in ids)
    assert list(one) == list(two)  # one run key: one file name
    assert main(["merge", "merged", "n1/out", "n2/out"]) == 0
    assert stable(cli_env / "merged") == stable(cli_env / "n1" / "out")


def test_shards_run_on_two_nodes_with_their_own_data_merge_and_rank(
    cli_env, data_cache, monkeypatch
):
    (cli_env / "zoo.toml").write_text(ZOO)
    assert run_knn("warm", "--data", "embedded") == 0
    tasks = [a for task in TASKS for a in ("--task", task)]
    for index in (0, 1):
        node = cli_env / f"node{index}"
        copy_data(stand_in(data_cache), node / "data" / "imagenet", shift_ns=(index + 1) * 10**9)
        monkeypatch.setenv("EVALKIT_CACHE", str(node / "cache"))
        argv = ["run", "--zoo", "zoo.toml", *tasks, "--data", "folder", "--quiet"]
        argv += ["--data-dir", str(node / "data"), "--out", f"s{index}", "--shard", f"{index}/2"]
        assert main(argv) == 0
        assert list((node / "cache" / "identity" / "data").glob("*.json"))  # each node's own
    assert main(["merge", "merged", "s0", "s1"]) == 0
    assert main(["leaderboard", "merged"]) == 0
    rows = stable(cli_env / "merged")
    assert len({json.dumps(r["data_files"]) for r in rows}) == 1
    assert len({(r["task"], r["run_key"]) for r in rows}) == 4


def test_old_absolute_image_ids_pair_with_todays_relative_ones():
    from evalkit.publish.board_reading import relative_ids

    names = ["val/a/0.png", "val/a/1.png", "val/b/0.png"]
    old = [f"/mnt/node1/imagenet/{n}" for n in names]
    assert relative_ids(old) == relative_ids(names) == ["a/0.png", "a/1.png", "b/0.png"]
    assert relative_ids(["0", "1", "2"]) == ["0", "1", "2"]  # indices, not paths
