"""What identities cost (the keys of the feature cache and of runs): a dataset folder
identified by content from one walk — the first look, which hashes every file, and the second,
which finds every digest in the memo by its stamp — against a bare walk that stats every file;
and a 1 GB checkpoint's weights id cold (every byte hashed) and warm (memo hit), against
reading the file once.

Targets: a folder's second look at most 3× the walk + stat it cannot avoid (seconds per million
files); a warm weights id ≥ 100× faster than the cold one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import best_time, report
from evalkit.storage.identity import CHUNK, RACY_NS, content_id, tree_identity


def make_tree(root: Path, files: int, size: int):
    """``files`` files of ``size`` random bytes, 1,000 a folder, old enough to be memoised."""
    per_folder, old = 1000, time.time_ns() - 2 * RACY_NS
    for start in range(0, files, per_folder):
        folder = root / f"class{start // per_folder:04d}"
        folder.mkdir(parents=True)
        for i in range(start, min(start + per_folder, files)):
            (folder / f"{i:07d}.jpg").write_bytes(os.urandom(size))
            os.utime(folder / f"{i:07d}.jpg", ns=(old, old))


def walk_and_stat(root: Path):
    """The least any identity that sees edits must do: list every file and stat it."""
    return sum(os.stat(os.path.join(d, n)).st_size for d, _, names in os.walk(root) for n in names)


def make_checkpoint(path: Path, gigabytes: float):
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for _ in range(int(gigabytes * 1024)):
            f.write(block)
    old = path.stat().st_mtime_ns - 2 * RACY_NS  # old enough to be memoised
    os.utime(path, ns=(old, old))


def read_once(path: Path):
    with path.open("rb") as f:
        while f.read(CHUNK):
            pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--file-kb", type=int, default=20)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        os.environ["EVALKIT_CACHE"] = str(Path(tmp) / "cache")  # the memos: empty at first
        make_tree(root, args.files, args.file_kb * 1000)
        walk_s = best_time(lambda: walk_and_stat(root))
        first_s = best_time(lambda: tree_identity(root), repeats=1)
        second_s = best_time(lambda: tree_identity(root))
        megabytes = args.files * args.file_kb / 1000
        report(
            "identity_folder",
            {
                "files": args.files,
                "file_kb": args.file_kb,
                "baseline": "os.walk + os.stat of every file",
                "walk_stat_s": round(walk_s, 3),
                "first_look_s": round(first_s, 3),
                "first_files_per_s": round(args.files / first_s),
                "first_mb_per_s": round(megabytes / first_s),
                "second_look_s": round(second_s, 3),
                "second_files_per_s": round(args.files / second_s),
                "second_vs_walk": round(second_s / walk_s, 2),
                "target_second_vs_walk_at_most": 3,
                "second_s_per_million_files": round(second_s * 1e6 / args.files, 1),
            },
        )
    with tempfile.TemporaryDirectory() as tmp:
        path, memo = Path(tmp) / "model.safetensors", Path(tmp) / "memo"
        make_checkpoint(path, args.gigabytes)
        read_s = best_time(lambda: read_once(path), repeats=1)
        cold_s = best_time(lambda: content_id(path, memo), repeats=1)
        warm_s = best_time(lambda: content_id(path, memo), repeats=5)
        report(
            "identity_weights",
            {
                "gigabytes": args.gigabytes,
                "baseline": "reading the file once",
                "read_s": round(read_s, 3),
                "cold_s": round(cold_s, 3),
                "warm_s": round(warm_s, 5),
                "cold_vs_read": round(cold_s / read_s, 2),
                "warm_speedup": round(cold_s / warm_s, 1),
                "target_warm_speedup": 100,
            },
        )


if __name__ == "__main__":
    main()
