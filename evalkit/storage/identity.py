"""Ground floor: the identities that keys are made of — of files, folders, weights and the
libraries that compute features — and the one way a spec becomes a key (``spec_key``).

- A file's *content id* is the sha256 of every byte, memoised by (path, size, mtime, inode) in
  ``<cache>/identity/content-ids.json``, so a 40 GB checkpoint is hashed once and a changed
  file (any byte, same size or not) gets a new id.
- A set of files' identity hashes each file's relative path (as bytes, so any name works),
  size and content digest (xxh3-128): the same bytes copied to another disk, mount or node,
  with other modification times, are the same data. Digests are remembered by stamp (size,
  mtime, inode) in one memo per folder of data (``<cache>/identity/data/``), read once and
  written at most once per walk, so a second look costs one ``stat`` per file; a read-only
  cache hashes again next time. ``content=True`` (the CLI's ``--verify-data``) re-hashes
  files whose stamp is unchanged, for bytes changed under a kept stamp.
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

import xxhash

from evalkit.errors import EvalkitError
from evalkit.storage.writes import replacing

CHUNK = 8 << 20
MEMO_NAME = "content-ids.json"
DATA_MEMOS = "data"  # under <cache>/identity: one memo of digests per folder of data
# Part of every data identity, so a key made before files were named by content (1: path,
# size and mtime) is never read as one of today's.
IDENTITY_VERSION = 2
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
    return stat_stamp(Path(path).stat())


def stat_stamp(stat: os.stat_result, now: int | None = None) -> str | None:
    """``file_stamp`` of a ``stat`` already made; ``now``: when a walk began (a file changed
    since is as fresh as one changed just before)."""
    if (now or time.time_ns()) - stat.st_mtime_ns <= RACY_NS:
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


def files_identity(
    paths, root: Path, *, content: bool = False, extra: str = "", memo_dir: Path | None = None
) -> str:
    """Hash of each file's path relative to ``root`` (bytes), size and content digest, in the
    order given, plus ``extra`` (labels, sizes, ...). Digests come from the folders' memos
    (under ``memo_dir``, default ``<cache>/identity``) when a file's stamp is unchanged;
    ``content`` hashes every file again."""
    digest = hashlib.sha256(f"identity {IDENTITY_VERSION}|{extra}".encode())
    root_bytes = os.fsencode(root)
    memos = DigestMemos(recheck=content, memo_dir=memo_dir)
    for path in map(os.fsencode, paths):
        digest.update(path[len(root_bytes) :] + b"\0")
        digest.update(memos.entry(path))
    memos.save()
    return digest.hexdigest()[:16]


def data_digest(path) -> str:
    """xxh3-128 of a data file's bytes: several GB/s, so hashing costs about what reading does."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class DigestMemos:
    """The content digests of data files by folder: a folder's memo is read when the walk
    enters it and written, when it changed, as the walk leaves it, so memory holds one
    folder's and a walk of ImageNet reads and writes each of its 2,000 memos once. A digest
    is trusted while the file's stamp is the one it was hashed under; a fresh file is hashed
    and not remembered (``file_stamp``)."""

    def __init__(self, *, recheck: bool = False, memo_dir: Path | None = None):
        self.recheck, self.now = recheck, time.time_ns()
        self.dir = Path(memo_dir or cache_root() / "identity") / DATA_MEMOS
        self.named: bytes | None = None  # the current folder as the paths name it
        self.folder: bytes | None = None  # ... and made absolute: its memo's name
        self.memo: dict = {}
        self.changed = False

    def entry(self, path: bytes) -> bytes:
        """What the identity takes of one file: its size and digest, or that it is missing."""
        try:
            stat = os.stat(path)
        except FileNotFoundError:  # a link to nothing: the reader will say so
            return b"missing\n"
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _link_loop(path) from None
        return f"{stat.st_size}|{self.digest(path, stat)}\n".encode()

    def digest(self, path: bytes, stat: os.stat_result) -> str:
        folder, _, name = path.rpartition(os.sep.encode())
        files = self._enter(folder)
        key, stamp = os.fsdecode(name), stat_stamp(stat, self.now)
        known = files.get(key, "")
        if stamp is not None and not self.recheck and known.startswith(stamp + "|"):
            return known.rpartition("|")[2]
        digest = data_digest(path)
        if stamp is not None and known != f"{stamp}|{digest}":
            files[key] = f"{stamp}|{digest}"
            self.changed = True
        return digest

    def _enter(self, folder: bytes) -> dict:
        """The memo of ``folder``'s files (as the paths name it: made absolute only when the
        walk enters another folder, the previous one's memo saved first)."""
        if folder != self.named:
            self.save()
            self.named, self.folder = folder, os.path.abspath(folder or b".")
            memo = read_json(self._path(self.folder))
            if not _memo_of(memo, self.folder):  # none yet, another folder's, or damaged
                memo = {"folder": self.folder.hex(), "files": {}}
            self.memo = memo
        return self.memo["files"]

    def _path(self, folder: bytes) -> Path:
        return self.dir / f"{hashlib.sha256(folder).hexdigest()[:24]}.json"

    def save(self):
        """Write the current folder's memo if it changed; a read-only cache keeps its old one
        (hashed again next time). Two walks at once: the last write wins, and what the other
        learnt is hashed again the next time."""
        if self.changed and self.folder is not None:
            with contextlib.suppress(OSError, EvalkitError):
                write_json(self._path(self.folder), self.memo)
        self.changed = False


def _memo_of(memo, folder: bytes) -> bool:
    return (
        isinstance(memo, dict)
        and memo.get("folder") == folder.hex()
        and isinstance(memo.get("files"), dict)
    )


def _link_loop(path) -> EvalkitError:
    name = os.fsdecode(path)
    return EvalkitError(
        f"{name} is a symbolic link loop (→ {os.fsdecode(os.readlink(path))} → …): "
        "remove or fix the link"
    )


def tree_identity(root: Path, *, content: bool = False, memo_dir: Path | None = None) -> str:
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
    return files_identity(files, root, content=content, memo_dir=memo_dir)
