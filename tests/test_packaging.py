"""The package as users install it: the sdist and the wheel built from it (``python -m build``,
as pip, pipx and ``pip install git+…`` build them) carry every module, data file and test.

An editable install reads the source tree, so it cannot see a module the build leaves out; these
tests read the built artefacts instead. ``.ci/run`` goes further and installs the wheel into a
fresh environment (``.ci/package-check``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import evalkit

ROOT = Path(__file__).resolve().parents[1]
# The package tree as it sits in the repository → where each part lands in the wheel.
PACKAGE_ROOTS = {"evalkit": "evalkit", "tasks": "evalkit/tasks"}
# Files setuptools writes into an sdist beside the tracked ones.
SDIST_GENERATED = {"PKG-INFO", "setup.cfg"}


def package_files(root: Path) -> set[str]:
    """Every file of the installable tree, at the path the wheel must hold it under."""
    files = set()
    for folder, target in PACKAGE_ROOTS.items():
        for path in (root / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(f"{target}/{path.relative_to(root / folder).as_posix()}")
    return files


def missing_from_wheel(wheel_names: set[str], root: Path) -> set[str]:
    return package_files(root) - wheel_names


def tracked_files(root: Path) -> set[str]:
    """The files of the project: git's list (tracked, and new files git does not ignore) in a
    checkout; in an unpacked sdist (no git), the files there, so the check holds for an sdist
    built from an sdist too."""
    if (root / ".git").exists():
        listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
        out = subprocess.run(listing, cwd=root, capture_output=True, text=True)
        return set(out.stdout.split())
    skip = ("__pycache__", ".pytest_cache", "build", "dist", ".venv", ".nox")
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and not any(part in skip or part.endswith(".egg-info") for part in p.parts)
        and p.name not in SDIST_GENERATED
        and p.suffix != ".pyc"
    }


def clean_copy(root: Path, dest: Path) -> Path:
    """The project as a fresh clone has it: a build in the working tree would read the
    ``*.egg-info`` an editable install left there, whose file list hides a package the
    configuration leaves out."""
    for name in tracked_files(root):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist, and the wheel built from it, as ``python -m build`` makes them from a fresh
    clone (no download: the build runs in this environment, which the test extra gives
    setuptools and build)."""
    out = tmp_path_factory.mktemp("dist")
    tree = clean_copy(ROOT, tmp_path_factory.mktemp("clone"))
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("evalkit-*.whl")
    return wheel


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(dist):
    names = set(zipfile.ZipFile(wheel_of(dist)).namelist())
    assert missing_from_wheel(names, ROOT) == set()
    assert {"evalkit/py.typed", "evalkit/data/meta/imagenet_classes.json"} <= names
    assert f"evalkit-{evalkit.__version__}.dist-info/licenses/LICENSE" in names


def test_the_check_fails_when_a_module_is_dropped_from_the_wheel(dist):
    names = set(zipfile.ZipFile(wheel_of(dist)).namelist())
    for dropped in ("evalkit/cli/__init__.py", "evalkit/tasks/depth.py", "evalkit/py.typed"):
        assert missing_from_wheel(names - {dropped}, ROOT) == {dropped}


def test_the_wheel_of_the_old_package_list_is_refused(tmp_path):
    """The list pyproject.toml used to name by hand left out five subpackages: the check sees
    every file of them."""
    listed = {"evalkit", "evalkit/backbones", "evalkit/data", "evalkit/heads", "evalkit/models"}
    listed |= {"evalkit/parallel", "evalkit/tasks", "evalkit/training"}
    names = {n for n in package_files(ROOT) if n.rsplit("/", 1)[0] in listed}
    missing = missing_from_wheel(names, ROOT)
    assert {
        "evalkit/cli/__init__.py",
        "evalkit/core/runner.py",
        "evalkit/storage/shards.py",
    } <= missing
    assert "evalkit/data/prepare/waymo.py" in missing


def test_the_sdist_carries_every_tracked_file(dist):
    (sdist,) = dist.glob("evalkit-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert tracked_files(ROOT) - names == set()


def test_the_wheel_alone_runs_the_command_line_from_outside_the_checkout(dist, tmp_path):
    """Unpacked on its own (no editable install, no repository on the path), the wheel's
    ``evalkit --version`` and ``evalkit ls tasks`` work and import from the wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel_of(dist)).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import evalkit, sys; print(evalkit.__file__); from evalkit.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run(
        [sys.executable, "-c", code, "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith(str(site))
    assert run.stdout.splitlines()[1] == f"evalkit {evalkit.__version__}"
    listing = subprocess.run(
        [sys.executable, "-c", code, "ls", "tasks"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert listing.returncode == 0, listing.stderr
    assert "ade20k-1/16" in listing.stdout and "waymo-depth-dpt" in listing.stdout


def test_the_main_job_baseline_is_the_gates_own_row():
    """``.ci/package-check`` compares the installed wheel's main job with
    ``results/baselines/main-job``: the same rows the regression gate holds for that job."""
    from evalkit.core.results import load_rows

    gate = ROOT / "results" / "baselines" / "gate" / "imagenet-linear.jsonl"
    main_job = load_rows([ROOT / "results" / "baselines" / "main-job"])
    assert main_job == [
        r for r in load_rows([gate]) if r["backbone"] == "timm/vit_tiny_patch16_224"
    ]
    assert {r["metric"] for r in main_job} == {"top1", "top5"}


def test_the_readme_prints_the_main_jobs_baseline_numbers():
    """The README says what the main job prints: the numbers of ``results/baselines/main-job``
    (which ``.ci/package-check`` holds the installed wheel to), so a rebaseline that forgets
    the README fails here."""
    import re

    from evalkit.core.results import load_rows

    rows = {r["metric"]: r for r in load_rows([ROOT / "results" / "baselines" / "main-job"])}
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"prints ([\d.]+) ± ([\d.]+) top-1 and ([\d.]+) ± ([\d.]+) top-5", readme)
    assert said, "the README no longer says what the main job prints"
    expected = [rows[m][k] for m in ("top1", "top5") for k in ("value", "stderr")]
    assert [float(x) for x in said.groups()] == [round(v, 2) for v in expected]
