"""The regression gate in every CI run: the rows of ``tests/regression/gate.py`` on embedded
data, compared two-sided with the committed baselines (``results/baselines/gate``) at the
measured tolerances of ``results/baselines/tolerances.toml``. A change that moves a number
beyond its tolerance — a preprocessing fault, a metric change — fails here, with the compare
table in the output and a JUnit report in ``results/regression/gate.xml``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "regression"))
from gate import BASELINES, TOLERANCES, run_rows  # noqa: E402

pytestmark = pytest.mark.long  # the long tier: CI runs it as its own step (nox -s long)

REPORT = HERE.parent / "results" / "regression" / "gate.xml"


def test_the_gate_rows_match_the_committed_baselines(tmp_path, data_cache, monkeypatch, capsys):
    from evalkit.cli import main

    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    run_rows(tmp_path / "rows", tmp_path / "cache")
    args = [
        "compare",
        str(BASELINES),
        str(tmp_path / "rows"),
        "--tolerances",
        str(TOLERANCES),
        "--junit",
        str(REPORT),
    ]
    code = main(args)
    with capsys.disabled():
        if code:
            print(capsys.readouterr().out)
    assert code == 0, f"the gate moved: see the table above and {REPORT}"
