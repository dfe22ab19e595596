"""The result commands read rows and per-image files and never import torch, timm, torchvision or
open_clip: each runs through the command line's ``main`` in a fresh interpreter on small real
runs (kNN and 5-shot on the embedded stand-in, two setups and a second seed), succeeds, and
leaves none of them in ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evalkit.cli import main

HEAVY = ("torch", "timm", "torchvision", "open_clip")
TASKS = ("--task", "imagenet-knn", "--task", "imagenet-5shot")

# Run in a fresh interpreter: the command's exit status and the heavy modules it left loaded.
PROBE = f"""
import contextlib, io, json, sys
from evalkit.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory, data_cache):
    """``base`` (seed 0) and ``new`` (seed 1) of one setup, ``other`` a second setup (dim=16),
    and ``board``: base and other merged, every cell with its per-image outputs."""
    root = tmp_path_factory.mktemp("light")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVALKIT_CACHE", str(data_cache))
        for name, extra in (
            ("base", []),
            ("new", ["--seed", "1"]),
            ("other", ["--model-arg", "dim=16"]),
        ):
            argv = ["run", "--backbone", "fake", "--data", "embedded", "--quiet", *TASKS, *extra]
            assert main([*argv, "--save-predictions", "--out", str(root / name)]) == 0
        assert main(["merge", str(root / "board"), str(root / "base"), str(root / "other")]) == 0
    return root


COMMANDS = {  # the folders: {base}, {new}, {other}, {board}; {out} a fresh one
    "leaderboard": "leaderboard {board}",
    "leaderboard markdown": "leaderboard {board} --format markdown --output {out}/board.markdown",
    "leaderboard json": "leaderboard {board} --format json --output {out}/b.json",
    "leaderboard html": "leaderboard {board} --format html --output {out}/b.html",
    "leaderboard nemenyi": "leaderboard {board} --cd nemenyi",
    "compare": "compare {base} {new} --no-fail",
    "compare paired": "compare {base} {new} --paired --no-fail",
    "compare equivalent": "compare {base} {new} --paired --equivalent 3 --no-fail",
    "compare detect": "compare {base} {new} --paired --detect 3 --no-fail",
    "table": "table {board}",
    "errors": "errors {board} --task imagenet-knn",
    "card": "card {base} --model-id me/fake --allow-stand-in --out {out}/card.markdown",
    "merge": "merge {out}/merged {base} {other}",
    "export eee": "export {board} --format eee --out {out}/eee",
    "export mteb": "export {board} --format mteb --out {out}/mteb",
    "ls": "ls",
    "ls tasks": "ls tasks",
    "ls backbones": "ls backbones",
    "ls datasets": "ls datasets",
    "ls suites": "ls suites",
    "ls settings": "ls settings imagenet-linear",
    "ls settings of a fraction": "ls settings ade20k-1/16",
    "ls settings of the alias": "ls settings adek20k-1/16",
    "ls settings of zero-shot": "ls settings lit-imagenet",
    "power": "power {board} --task imagenet-knn",
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_result_command_imports_no_model_library(command, folders, tmp_path):
    places = {name: str(folders / name) for name in ("base", "new", "other", "board")}
    argv = [part.format(out=tmp_path, **places) for part in COMMANDS[command].split()]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["code"] == 0, f"evalkit {' '.join(argv)} failed: {done.stderr[-2000:]}"
    assert found["heavy"] == [], f"evalkit {' '.join(argv)} imported {', '.join(found['heavy'])}"


def test_every_built_in_task_declares_the_paired_test_the_results_read():
    """The leaderboard reads a built-in task's paired test from ``paired_tests.DECLARED`` by the
    class the catalog names, without importing it: every such class must declare that very
    function (a class with none of its own has the default one)."""
    from evalkit.core.catalog import TASKS
    from evalkit.core.task import Task
    from evalkit.protocols.paired_tests import DECLARED
    from evalkit.significance import default_paired_test

    targets = {entry.target: entry for entry in TASKS.entries() if entry.summary != "(plugin)"}
    assert set(DECLARED) == set(targets)
    for target, entry in targets.items():
        declared = entry.load().paired_test
        declared = default_paired_test if declared is Task.paired_test else declared
        assert declared is DECLARED[target], f"{target} declares {declared.__qualname__}"


def test_every_built_in_task_declares_the_error_tables_evalkit_errors_reads():
    """``evalkit errors`` reads a built-in task's tables from ``error_tables.DECLARED`` by the
    class the catalog names, without importing it: every class there declares that very
    function, and a class keeping no per-image outputs declares none."""
    from evalkit.core.catalog import TASKS
    from evalkit.protocols.error_tables import DECLARED

    targets = {entry.target: entry for entry in TASKS.entries() if entry.summary != "(plugin)"}
    assert set(DECLARED) <= set(targets)
    for target, entry in targets.items():
        declared = getattr(entry.load(), "error_tables", None)
        assert declared is DECLARED.get(target), f"{target} declares {declared}"


def test_a_task_declaring_no_tables_gets_those_its_columns_suggest():
    """A plugin that declares no error tables (or one this installation cannot load) gets the
    tables its per-image columns suggest, not classification's, which need labels."""
    import pandas as pd

    from evalkit.cli.errors import declared_tables
    from evalkit.protocols.error_tables import by_columns, classification_tables

    assert declared_tables("a-plugin-not-installed") is by_columns
    assert declared_tables("imagenet-knn") is classification_tables
    frame = pd.DataFrame({"image": ["a.png", "b.png"], "miou": [40.0, 10.0], "pixel_acc": [1, 2]})
    ((title, rows),) = by_columns(frame, 1)
    assert title == "images of lowest mIoU" and rows["image"].tolist() == ["b.png"]
    assert by_columns(pd.DataFrame({"image": ["a.png"], "score": [1.0]}), 1) == []


def test_every_tasks_settings_read_from_source_are_the_built_tasks():
    """``ls settings`` reads each built-in task's table from its source; for every task and
    alias it is the table of the task built (its defaults, the catalog's parameters, the
    rules' texts, the dataclass order)."""
    from evalkit.cli.listing import built_settings_rows
    from evalkit.core.catalog import TASKS
    from evalkit.core.settings_table import settings_rows

    for name in TASKS.names():
        entry = TASKS.get(name)
        read = settings_rows(entry.target, entry.params)
        assert read is not None, f"{name}: its settings are beyond the source reading"
        assert read == built_settings_rows(name), name


def test_a_source_the_reading_cannot_follow_builds_the_task(capsys):
    """Where the source reading stops (a field without a default, a plugin's module, a value
    only an object's repr shows) it says so and the listing builds the task instead."""
    from evalkit.core.settings_table import Opaque, Unreadable, settings_rows

    assert settings_rows("evalkit.core.task:Rule", {}) is None  # fields without defaults
    assert settings_rows("some_plugin.tasks:Mine", {}) is None
    with pytest.raises(Unreadable):
        str({"a": Opaque("make()")})
    assert main(["ls", "settings", "imagenet-linear[eval_split=imagenet-r]"]) == 0
    assert "imagenet-r" in capsys.readouterr().out


SOURCES = """
from dataclasses import InitVar, dataclass
LR = 0.1
@dataclass
class Rebound:
    name: str
    lr: float = LR
LR = 0.5
@dataclass
class InClass:
    name: str
    SCALE = 5.0
    lr: float = SCALE
@dataclass
class WithInitVar:
    name: str
    scale: InitVar[int] = 2
    lr: float = 0.1
@dataclass
class Keyword:
    name: str
    lr: float = setting(0.1, rule=POSITIVE)
@dataclass
class HiddenInTuple:
    name: str
    pair: tuple = ({"a": make()},)
"""


def test_the_source_reading_gives_up_where_the_class_would_read_another_value(monkeypatch):
    """A module constant bound again after the class, a constant of the class body, a
    keyword rule and a value only its object's repr shows are beyond the reading: it says
    so (the listing then builds the task). An ``InitVar`` is no setting."""
    import ast

    from evalkit.core import settings_table

    tree = ast.parse(SOURCES)
    monkeypatch.setattr(settings_table, "module_tree", lambda m: tree if m == "evalkit.x" else None)
    settings_table.class_fields.cache_clear()
    try:
        for name in ("Rebound", "InClass", "Keyword", "HiddenInTuple"):
            assert settings_table.settings_rows(f"evalkit.x:{name}", {}) is None, name
        rows = settings_table.settings_rows("evalkit.x:WithInitVar", {})
        assert rows == [("lr", "0.1", "float")]
    finally:
        settings_table.class_fields.cache_clear()
