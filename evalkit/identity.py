"""Ground floor: the identities that keys are made of — of files, folders, weights and the
libraries that compute features — and the one way a spec becomes a key (``spec_key``).

- A file's *content id* is the sha256 of every byte, memoised by (path, size, mtime, inode) in
  ``<cache>/identity/content-ids.json``, so a 40 GB checkpoint is hashed once and a changed
  file (any byte, same size or not) gets a new id.
- A set of files' identity hashes each file's relative path (as bytes, so any name works),
  size and modification time: one ``stat`` per file, no reads. ``content=True`` (the CLI's
  ``--verify-data``) hashes the bytes instead, for trees whose copies keep modification times.
- A folder's identity is that of every file under it, from one directory walk.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

CHUNK = 8 << 20
MEMO_NAME = "content-ids.json"
RACY_NS = 3_000_000_000
FEATURE_LIBRARIES = ("torch", "timm", "open_clip_torch")


def cache_root() -> Path:
    """Where evalkit keeps features, stand-in data and memos: ``$EVALKIT_CACHE`` or
    ``~/.cache/evalkit``."""
    return Path(os.environ.get("EVALKIT_CACHE", Path.home() / ".cache" / "evalkit"))


def spec_key(spec: dict, length: int = 24) -> str:
    """The key of a spec: sha256 of its canonical JSON."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def library_versions() -> dict[str, str | None]:
    """major.minor of the libraries whose kernels and model code compute features."""

    def major_minor(name: str) -> str | None:
        try:
            return ".".join(version(name).split(".")[:2])
        except PackageNotFoundError:
            return None

    return {name: major_minor(name) for name in FEATURE_LIBRARIES}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_id(path: str | Path, memo_dir: Path | None = None) -> str:
    """sha256 of the file's bytes, memoised by (path, size, mtime, inode)."""
    path = Path(path).resolve()
    stat = path.stat()
    stamp = f"{os.fsencode(path).hex()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    memo_path = Path(memo_dir or cache_root() / "identity") / MEMO_NAME
    memo = _read_memo(memo_path)
    if stamp in memo:
        return memo[stamp]
    digest = file_digest(path)
    # A file written in the last seconds may be written again within the same timestamp tick
    # with the same size: do not vouch for it yet (git's "racy clean" rule).
    if time.time_ns() - stat.st_mtime_ns > RACY_NS:
        _write_memo(memo_path, _read_memo(memo_path) | {stamp: digest})
    return digest


def _read_memo(path: Path) -> dict[str, str]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_memo(path: Path, memo: dict[str, str]):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time


def files_identity(paths, root: Path, *, content: bool = False, extra: str = "") -> str:
    """Hash of each file's path relative to ``root`` (bytes), size and mtime — or its bytes
    when ``content`` — in the order given, plus ``extra`` (labels, sizes, ...)."""
    digest = hashlib.sha256(extra.encode())
    root_bytes = os.fsencode(root)
    for path in paths:
        relative = os.fsencode(path)[len(root_bytes) :]
        digest.update(relative + b"\0")
        if content:
            digest.update(file_digest(path).encode())
        else:
            stat = os.stat(path)
            digest.update(f"{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def tree_identity(root: Path, *, content: bool = False) -> str:
    """Identity of every file under ``root`` (one walk; hidden files and folders skipped).
    A missing folder has the identity ``missing``: the reader will say what is expected."""
    root = Path(root)
    if not root.exists():
        return "missing"
    files = []
    for folder, dirs, names in os.walk(os.fsencode(root)):
        dirs[:] = sorted(d for d in dirs if not d.startswith(b"."))
        files += [os.path.join(folder, n) for n in sorted(names) if not n.startswith(b".")]
    return files_identity(files, root, content=content)
