"""Ground floor: the identities that keys are made of — of files, folders, weights and the
libraries that compute features — and the one way a spec becomes a key (``spec_key``).

- A file's *content id* is the sha256 of every byte, memoised by (path, size, mtime, inode) in
  ``<cache>/identity/content-ids.json``, so a 40 GB checkpoint is hashed once and a changed
  file (any byte, same size or not) gets a new id.
- A set of files' identity hashes each file's relative path (as bytes, so any name works),
  size and modification time: one ``stat`` per file, no reads. ``content=True`` (the CLI's
  ``--verify-data``) hashes the bytes instead, for trees whose copies keep modification times.
- A folder's identity is that of every file under it, from one directory walk that follows
  symbolic links and counts hidden files, as the readers do.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.storage.writes import replacing

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


def library_versions(backbone: str | None = None) -> dict[str, str | None]:
    """major.minor of the libraries whose kernels and model code compute ``backbone``'s
    features: torch for every backbone, timm for timm models, open_clip (and the timm towers
    it may build) for open_clip models; every feature library when no backbone is named.
    Installing or upgrading a library that does not run a backbone leaves its keys as they are."""
    family = (backbone or "").partition("/")[0]
    names = FAMILY_LIBRARIES.get(family, ("torch",)) if backbone is not None else FEATURE_LIBRARIES
    return {name: _major_minor(name) for name in names}


@functools.cache
def _major_minor(name: str) -> str | None:
    """The installed version of ``name``, read once per process: the metadata walk costs a few
    ms and every cache key asks, while the library this process runs is the one it imported."""
    try:
        return ".".join(version(name).split(".")[:2])
    except PackageNotFoundError:
        return None


FAMILY_LIBRARIES = {
    "timm": ("torch", "timm"),
    "open_clip": FEATURE_LIBRARIES,
}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_stamp(path: Path) -> str | None:
    """(size, modification time, inode) of a file, or None while it is seconds old: a file
    may be rewritten within the same timestamp tick with the same size, so a fresh one is not
    vouched for yet (git's "racy clean" rule)."""
    stat = Path(path).stat()
    if time.time_ns() - stat.st_mtime_ns <= RACY_NS:
        return None
    return f"{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"


def content_id(path: str | Path, memo_dir: Path | None = None) -> str:
    """sha256 of the file's bytes, memoised by (path, size, mtime, inode)."""
    path = Path(path).resolve()
    stamp = file_stamp(path)
    key = f"{os.fsencode(path).hex()}|{stamp}"
    memo_path = _memo_path(memo_dir)
    memo = read_json(memo_path)
    if stamp is not None and key in memo:
        return memo[key]
    digest = file_digest(path)
    if stamp is not None:
        with contextlib.suppress(OSError, EvalkitError):  # read-only: a re-hash next time
            write_json(memo_path, read_json(memo_path) | {key: digest})
    return digest


def _memo_path(memo_dir: Path | None) -> Path:
    return Path(memo_dir or cache_root() / "identity") / MEMO_NAME


def recheck_content_ids(memo_dir: Path | None = None) -> tuple[int, int]:
    """Re-hash every file whose content id is memoised and still has its stamp; drop memos
    that no longer hold (changed bytes under a kept stamp, or a file gone or changed), so the
    next run hashes the file again. Returns (files re-hashed, of them changed under a kept
    stamp)."""
    memo_path = _memo_path(memo_dir)
    memo, kept, hashed, changed = read_json(memo_path), {}, 0, 0
    for key, digest in memo.items():
        path_hex, _, stamp = key.partition("|")
        path = Path(os.fsdecode(bytes.fromhex(path_hex)))
        try:
            current = file_stamp(path)
        except OSError:
            continue
        if current != stamp:
            continue
        hashed += 1
        if file_digest(path) == digest:
            kept[key] = digest
        else:
            changed += 1
    if memo:
        with contextlib.suppress(OSError, EvalkitError):  # a read-only cache keeps its memos
            write_json(memo_path, kept)
    return hashed, changed


def read_json(path: Path) -> dict:
    """A JSON file's object, or {} when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, value):
    """Write JSON to a temporary name and rename it into place: readers never see half."""
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(value))


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
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # a link to nothing: the reader will say so
                digest.update(b"missing\n")
                continue
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                name = os.fsdecode(path)
                raise EvalkitError(
                    f"{name} is a symbolic link loop (→ {os.fsdecode(os.readlink(path))} → …): "
                    "remove or fix the link"
                ) from None
            digest.update(f"{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def tree_identity(root: Path, *, content: bool = False) -> str:
    """Identity of every file under ``root``, following symbolic links to folders (each real
    folder walked once) and counting hidden files (readers read them: an image named
    ``.extra.bmp`` is an image); hidden folders are skipped, as readers skip them. A missing
    folder has the identity ``missing``: the reader will say what is expected."""
    root = Path(root)
    if not root.exists():
        return "missing"
    files, seen = [], set()
    for folder, dirs, names in os.walk(os.fsencode(root), followlinks=True):
        real = os.stat(folder)
        if (real.st_dev, real.st_ino) in seen:  # a link back up the tree: walked already
            dirs[:] = []
            continue
        seen.add((real.st_dev, real.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith(b"."))
        files += [os.path.join(folder, n) for n in sorted(names)]
    return files_identity(files, root, content=content)
