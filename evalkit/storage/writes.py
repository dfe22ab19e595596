"""Where evalkit writes files: every cache entry, manifest, stand-in data set, class-embedding
table, predictions file and JSON record goes through ``replacing``; result rows, which are
appended, through ``appending``.

A file (or folder) is written under a temporary name beside its target and renamed into place,
so a reader never sees half of one and a crash never counts half-written work as done. A write
that fails removes its temporary file and ends in one line naming the path and what to do: a
full disk, a read-only file system or a missing permission, whichever library raised it
(safetensors reports a full disk as its own error type). Temporary names carry the writer's
process id; ``sweep_stale`` removes those whose process is gone, so what a killed run left
behind does not stay for good. In a shared cache, ``not_readable`` and ``replaceable`` say
which of another user's files this process must leave as they are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from evalkit.errors import EvalkitError

MARK = ".tmp-"
OS_ERROR = re.compile(r"os error (\d+)")  # how Rust libraries (safetensors) report errno
WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device writing {path}: free space (or write elsewhere) "
    "and rerun; finished work is kept",
    errno.EROFS: "{path} is on a read-only file system: choose a writable folder (a read-only "
    "feature cache is read with --cache-dir and computes what it lacks in memory)",
    errno.EACCES: "no permission to write {path}: choose a folder you can write in",
    errno.EDQUOT: "disk quota exceeded writing {path}: free space (or write elsewhere) and rerun; "
    "finished work is kept",
}


def temporary(path: Path) -> Path:
    """This process's temporary name for ``path``, in the same folder (so the rename is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}{MARK}{os.getpid()}")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content (a file or a folder) into; on success
    it replaces ``path``, on any failure it is removed and a write error is one line."""
    path = Path(path)
    tmp = temporary(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
        yield tmp
        shared_mode(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        _remove(tmp)
        error = write_error(exc, path)
        if error is None:
            raise
        raise error from None


def shared_mode(path: Path):
    """Give a file written by a library that keeps it private (safetensors writes 0600) the
    mode an ordinary file gets — read and write as the umask allows — so a cache one member of
    a team fills can be read by the others; a folder also gets its search bit."""
    base = 0o777 if path.is_dir() else 0o666
    if not path.is_symlink():
        os.chmod(path, base & ~current_umask())


def current_umask() -> int:
    """This process's umask, read without changing it where Linux says it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def appending(path: Path, data: bytes) -> bool:
    """Append ``data`` to ``path`` whole or not at all, synced to disk: under an exclusive lock
    on the file (so concurrent writers never interleave), a write that fails part-way is cut
    back to the file's old length before its one-line error. A file whose last line was torn
    (cut off by a killed writer) is first ended with a newline, so that line stays apart; the
    return value says whether that happened."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked_file(path) as file:
            size = os.lseek(file.fileno(), 0, os.SEEK_END)
            torn = size > 0 and os.pread(file.fileno(), 1, size - 1) != b"\n"
            try:
                _write_all(file, b"\n" * torn + data)
                os.fsync(file.fileno())
            except BaseException:
                os.ftruncate(file.fileno(), size)  # frees space, so it works on a full disk
                raise
    except OSError as exc:
        error = write_error(exc, path)
        raise error or EvalkitError(f"cannot write {path}: {exc.strerror or exc}") from None
    return torn


def rewriting(path: Path, drop, data: bytes):
    """Rewrite ``path`` without the lines ``drop(line)`` picks, then ``data``, all or nothing
    (a temporary file renamed into place), under the lock appenders take: an append that was
    waiting on the old file goes to the new one (``locked_file``), so none is lost."""
    path = Path(path)
    with locked_file(path) as file:
        old = os.pread(file.fileno(), os.fstat(file.fileno()).st_size, 0)
        kept = b"".join(line for line in old.splitlines(keepends=True) if not drop(line))
        kept += b"" if not kept or kept.endswith(b"\n") else b"\n"
        with replacing(path) as tmp, open(tmp, "wb") as out:
            _write_all(out, kept + data)
            os.fsync(out.fileno())


def locked_file(path: Path, take=None):
    """``path`` opened for appending and exclusively locked (by ``take(file)``, default a
    blocking ``flock``); one replaced or removed by its holder while this process waited is
    opened and locked again, so a write or a lock never lands on a file that is gone."""
    take = take or (lambda file: fcntl.flock(file, fcntl.LOCK_EX))
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)  # its last holder may remove the folder
        file = open(path, "a+b", buffering=0)  # noqa: SIM115 - the caller closes it
        take(file)
        try:
            if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
                return file
        except FileNotFoundError:
            pass
        file.close()


def _write_all(file, data: bytes):
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]


def writable(folder: Path) -> bool:
    """Whether this process can create a file in ``folder`` (permissions and read-only mounts
    both answer here)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def not_readable(path: Path) -> str | None:
    """Why this user may not read ``path`` — "permission denied (owned by uid N)": another
    user's file in a shared cache, kept private by its owner's umask — or None when it may (or
    when it is missing, which its reader reports). Asked by opening it, since libraries report
    EACCES in their own words (safetensors says FileNotFoundError)."""
    try:
        os.close(os.open(path, os.O_RDONLY))
    except PermissionError:
        return f"permission denied (owned by uid {owner(path)})"
    except OSError:
        return None
    return None


def owner(path: Path) -> int:
    """The uid owning ``path``, or its folder's when ``path`` itself cannot be looked at."""
    for place in (Path(path), Path(path).parent):
        try:
            return os.stat(place).st_uid
        except OSError:
            continue
    return -1


def replaceable(path: Path) -> bool:
    """Whether this user may replace or remove ``path``: it may write its folder, and a sticky
    folder (a shared ``/tmp``-like cache) lets only a file's or the folder's owner do so."""
    folder = Path(path).parent
    try:
        here, mine = os.stat(folder), os.geteuid()
        if not os.access(folder, os.W_OK | os.X_OK):
            return False
        sticky = here.st_mode & stat.S_ISVTX and mine not in (0, here.st_uid)
        return not sticky or os.lstat(path).st_uid == mine
    except FileNotFoundError:
        return os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        return False


def write_error(exc: BaseException, path: Path) -> EvalkitError | None:
    """The one-line error for a write that failed for want of space or permission, or None
    when ``exc`` is something else."""
    code = getattr(exc, "errno", None)
    if code is None and (found := OS_ERROR.search(str(exc))):
        code = int(found[1])
    if code in WRITE_ERRORS:
        return EvalkitError(WRITE_ERRORS[code].format(path=path))
    return None


def sweep_stale(folder: Path):
    """Remove temporary files and folders in ``folder`` whose writer process has ended."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        pid = entry.name.rpartition(MARK)[2]
        if (
            entry.name.startswith(".")
            and MARK in entry.name
            and pid.isdigit()
            and process_ended(int(pid))
        ):
            _remove(entry)


def process_ended(pid: int) -> bool:
    """Whether the process ``pid`` (another than this one) has ended."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _remove(path: Path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def disk_error(exc: OSError, path: Path) -> EvalkitError:
    """One line for a write that failed: what, where, and what to do."""
    return write_error(exc, path) or EvalkitError(f"cannot write {path}: {exc.strerror or exc}")
