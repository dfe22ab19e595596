"""The effect table machinery at the smoke scale: rows measured through evalkit run, judged,
written as Markdown and JSON, and reused on a rerun."""

from __future__ import annotations

import json

from evalkit.cli import main
from evalkit.reproduce import rows


def test_the_table_has_the_papers_twelve_rows():
    table = rows()
    assert [r.number for r in table] == list(range(1, 13))
    assert all(r.measures and r.paper and r.paper_effect for r in table)


def test_smoke_rows_are_measured_written_and_reused(cli_env, capsys):
    args = ["reproduce", "--scale", "smoke", "--rows", "3,5", "--out", "paper", "--quiet"]
    assert main(args) == 0
    paper, name = cli_env / "paper", "effects-smoke"
    summary = json.loads((paper / f"{name}.json").read_text())
    assert [r["row"] for r in summary["rows"]] == [3, 5]
    linear = summary["rows"][1]
    assert linear["setup"] == "ladder test → test" and "→" in linear["ours"]
    assert linear["agrees"] in (True, False) and linear["seconds"] >= 0
    table = (paper / f"{name}.md").read_text()
    assert "| 5 | scale ViT-e → ViT-22B | ImageNet linear probe |" in table
    rows_file = paper / "runs-smoke" / "imagenet-linear.jsonl"
    before = rows_file.read_text()
    assert main(args) == 0  # everything reused: no new rows
    assert rows_file.read_text() == before
    assert main(["reproduce", "--scale", "huge"]) == 2
    assert main(["reproduce", "--scale", "smoke", "--rows", "13"]) == 2
