"""What the command line prints is what it means: an install hint keeps its extra's name
(the console's markup must not eat ``[clip]``), a missing optional package is one line, and
``compare`` calls a missing row missing."""

from __future__ import annotations

import sys

from evalkit.cli import COMMANDS, main
from evalkit.errors import EvalkitError


def test_an_error_prints_its_brackets_literally(monkeypatch, capsys):
    def failing(args, console):
        raise EvalkitError("open_clip backbones need open_clip_torch: pip install 'evalkit[clip]'")

    monkeypatch.setitem(COMMANDS, "ls", (COMMANDS["ls"][0], failing))
    assert main(["ls", "tasks"]) == 2
    assert "pip install 'evalkit[clip]'" in capsys.readouterr().err


def test_listing_open_clip_models_without_open_clip_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "open_clip", None)  # as on a plain install
    assert main(["ls", "models", "open_clip"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'evalkit[clip]'" in err[0], err


def test_compare_says_missing_rows_are_missing(tmp_path, capsys):
    from evalkit.core.results import append_rows

    row = {"task": "t", "backbone": "b", "metric": "top1", "value": 50.0, "seed": 0}
    append_rows(tmp_path / "base" / "t.jsonl", [row, {**row, "metric": "top5", "value": 80.0}])
    append_rows(tmp_path / "new" / "t.jsonl", [{**row, "value": 50.0}])
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "new"), "--tolerance", "0"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "1 baseline row(s) missing from the new rows", last


def test_errors_with_nothing_to_show_is_one_line(tmp_path, capsys):
    import pandas as pd

    frame = pd.DataFrame(
        {
            "image": ["a.jpg", "b.jpg"],
            "label": [0, 1],
            "label_name": ["cat", "dog"],
            "prediction": [0, 1],
            "prediction_name": ["cat", "dog"],
            "correct": [True, True],
            "top5_scores": [[3.0, 1.0], [2.0, 1.0]],
        }
    )
    folder = tmp_path / "runs" / "predictions"
    folder.mkdir(parents=True)
    frame.to_parquet(folder / "imagenet-linear--fake--s0--key.parquet")
    assert main(["errors", str(tmp_path / "runs"), "--task", "imagenet-linear"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "imagenet-linear--fake--s0--key.parquet: 2 images, nothing to show (no mistakes)"
    ]


def test_an_out_that_cannot_be_written_is_one_line(cli_env, capsys):
    """export, merge and the leaderboard's snapshot aimed at a file (or under one): one line
    naming the path, exit 2, never a traceback."""
    run = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded"]
    assert main([*run, "--out", "rows", "--quiet"]) == 0
    (cli_env / "a-file").write_text("not a folder")
    commands = [
        ["export", "rows", "--format", "eee", "--out", "a-file"],
        ["export", "rows", "--format", "mteb", "--out", "a-file/under"],
        ["merge", "a-file/merged", "rows"],
        ["leaderboard", "rows", "--snapshot", "a-file"],
    ]
    for argv in commands:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "a-file" in err, (argv, err)
