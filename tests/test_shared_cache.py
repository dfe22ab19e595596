"""A team's shared cache, with a real second user: entries another user keeps private (mode
0600) are skipped — said as "permission denied (owned by uid N)" — and computed again here,
never deleted or replaced, whether the folder would let this user delete them or not; the run
succeeds with a normal run's rows. An image another user keeps private is "not readable by
this user", not damage to replace or delete.

Root ignores permissions, so the reader runs as another uid (``setpriv``); the test is skipped
where that cannot be done."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import evalkit

OWNER, READER = 1000, 1001  # the entries' owner, and the user who runs evalkit on them
SETPRIV = shutil.which("setpriv")
REPO = Path(evalkit.__file__).resolve().parents[1]  # the evalkit under test, for the reader
KNN = ("run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded")

pytestmark = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0,
    reason="needs root and setpriv to run evalkit as a second, non-root user",
)


def as_reader(command: list[str]) -> list[str]:
    return [SETPRIV, f"--reuid={READER}", f"--regid={READER}", "--clear-groups", *command]


@pytest.fixture(scope="module", autouse=True)
def reader_sees_this_environment():
    """The second user must be able to read this Python environment, as on a team's shared
    install; a venv in a private folder (mode 0700) makes Python fall back to the system one,
    and every failure below would be an ImportError instead of what it tests."""
    probe = [sys.executable, "-c", "import sys, torch, evalkit; print(sys.prefix)"]
    env = os.environ | {"PYTHONPATH": str(REPO)}
    seen = subprocess.run(as_reader(probe), env=env, capture_output=True, text=True)
    if seen.stdout.strip() != sys.prefix:
        why = f"uid {READER} cannot import evalkit from this environment ({sys.prefix}): "
        why += f"chmod -R o+rX it ({seen.stderr.strip().splitlines()[-1:]})"
        if os.environ.get("EVALKIT_SECOND_USER_REQUIRED"):  # CI: a skip would hide the tests
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def shared():
    """A folder every uid can reach (pytest's own is root's alone), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="evalkit-shared-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def filled(shared) -> tuple[Path, dict]:
    """A cache filled by a normal run (features and decoded views), and that run's rows."""
    cache, out = shared / "filled", shared / "rows-filled"
    result = evalkit_run(cache, out, by_reader=False)
    assert result.returncode == 0, result.stderr
    return cache, rows(out)


def evalkit_run(cache: Path, out: Path, *, by_reader: bool, args=()):
    """``evalkit run`` of the k-NN task on the stand-in data, as root or as ``READER``."""
    home = cache.parent / f"home-{cache.name}"
    for folder in (home, out):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o777)
    env = os.environ | {"HOME": str(home), "EVALKIT_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "evalkit", *KNN, "--pixels", "cache", "--quiet"]
    command += ["--out", str(out), *args]
    if by_reader:
        command = as_reader(command)
    return subprocess.run(command, env=env, cwd=cache.parent, capture_output=True, text=True)


def rows(out: Path) -> dict[str, float]:
    lines = (out / "imagenet-knn.jsonl").read_text().splitlines()
    return {row["metric"]: row["value"] for row in map(json.loads, lines)}


def owned_privately(cache: Path, folder_mode: int) -> dict[Path, str]:
    """Give the cache to ``OWNER`` (its root open to the team), the files of its entries mode
    0600 and their folders ``folder_mode``; returns each entry file's sha256."""
    for path in [cache, *cache.rglob("*")]:
        os.chown(path, OWNER, OWNER)
    cache.chmod(0o777)
    areas = [cache / "features", cache / "pixels"]
    entries = [p for area in areas for p in (area, *area.rglob("*"))]
    for path in entries:
        path.chmod(folder_mode if path.is_dir() else 0o600)
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in entries if p.is_file()}


@pytest.mark.parametrize(
    "folder_mode",
    [0o777, 0o755, 0o1777],
    ids=["folders-let-the-reader-delete", "folders-not-writable", "sticky-folders"],
)
def test_another_users_private_entries_are_skipped_and_kept(shared, filled, folder_mode):
    cache, normal = shared / f"cache-{folder_mode:o}", filled[1]
    shutil.copytree(filled[0], cache, symlinks=True)
    before = owned_privately(cache, folder_mode)
    assert before, "the normal run kept no features or views"
    result = evalkit_run(cache, shared / f"rows-{folder_mode:o}", by_reader=True)
    assert result.returncode == 0, result.stderr
    assert rows(shared / f"rows-{folder_mode:o}") == normal
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in before if p.exists()}
    assert after == before  # every file of theirs still there, with its bytes
    assert all(p.stat().st_uid == OWNER for p in before)
    skipped = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert skipped and all(f"permission denied (owned by uid {OWNER})" in s for s in skipped)
    assert any("/features/" in s for s in skipped) and any("/pixels/" in s for s in skipped)
    assert "unusable" not in result.stderr and "unreadable" not in result.stderr


def test_an_image_another_user_keeps_private_is_not_readable_by_this_user(shared):
    from PIL import Image

    image = shared / "private.png"
    Image.new("RGB", (8, 8)).save(image)
    os.chown(image, OWNER, OWNER)
    image.chmod(0o600)
    read = f"from evalkit.data.folder import load_rgb; load_rgb({str(image)!r})"
    env = os.environ | {"PYTHONPATH": str(REPO), "HOME": str(shared)}
    command = as_reader([sys.executable, "-c", read])
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert f"not readable by this user (permission denied (owned by uid {OWNER}))" in (
        result.stderr
    )
    assert "replace or delete" not in result.stderr
    assert stat.S_IMODE(image.stat().st_mode) == 0o600 and image.exists()
