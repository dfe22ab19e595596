"""What a researcher sees tells the truth and helps: an optional package missing from any
command is one line naming its extra, and the docs name the extra each example needs; progress
reaches logs that are not terminals; ``plan`` states a time; the data is found before a backbone
is built and ``check-data`` takes a run's ``--set``; tables name the interval they show, report
top-k only below the class count, keep stand-in numbers apart and export numbers as numbers;
``errors`` shows probabilities; runs leave no lock files; MLflow's default store works."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import evalkit
from evalkit.cli import main
from evalkit.progress import ProgressBar

ROOT = Path(__file__).resolve().parents[1]


def image_folder(root: Path, classes: int, per_class: int = 3, bad: int = 0) -> Path:
    """``root/{train,val}/<class>/<image>.png``, with ``bad`` unreadable training files."""
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                colour = (60 * c % 256, 30 * i, 255 - 50 * c % 256)
                Image.new("RGB", (16, 16), colour).save(folder / f"{split}{i}.png")
    for i in range(bad):
        (root / "train" / f"class{i % classes}" / f"broken{i}.jpg").write_bytes(b"not an image")
    return root


# 1. Install hints -----------------------------------------------------------------------


def test_a_command_missing_an_optional_package_is_one_line_with_its_extra(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "submitit", None)  # as on a plain install
    args = [
        "sweep",
        "--task",
        "imagenet-linear",
        "--backbone",
        "fake",
        "--executor",
        "slurm",
        "--out",
        str(tmp_path),
        "--partition",
        "gpu",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'evalkit[cluster]'" in err[0], err


def test_a_tracker_missing_its_package_names_the_extra():
    from evalkit.tracking import _failure

    message = _failure("mlflow", ModuleNotFoundError("no", name="sqlalchemy"))
    assert "pip install 'evalkit[mlflow]'" in message


NEEDS = {  # what in an example needs which extra
    r"open_clip/|--task (lit|zeroshot)-": "clip",
    r"--task (kinetics|moments)": "video",
    r"--log[ =]wandb": "wandb",
    r"--log[ =]mlflow": "mlflow",
    r"--log[ =]tensorboard": "tensorboard",
    r"--data hf|dataset=hf:": "hf",
    r"--executor slurm": "cluster",
}


def code_examples(text: str):
    """(the paragraph before, the code) of every fenced block and table row with a command."""
    blocks = re.findall(r"((?:.*\n){0,6})```[a-z]*\n((?s:.*?))```", text)
    rows = [
        (line, line) for line in text.splitlines() if line.startswith("|") and "`evalkit" in line
    ]
    return blocks + rows


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_every_example_names_the_extra_it_needs(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    for before, code in code_examples(path.read_text()):
        for pattern, extra in NEEDS.items():
            for line in code.splitlines():
                if re.search(pattern, line) and line.lstrip().startswith(
                    ("evalkit", "torchrun", "|")
                ):
                    assert f"evalkit[{extra}]" in before + code, f"{doc}: {line.strip()[:120]}"


def test_the_readme_says_how_to_get_the_cpu_build_before_the_install():
    text = (ROOT / "README.md").read_text()
    assert text.index("download.pytorch.org/whl/cpu") < text.index("pip install . &&")


# 2. Progress and the plan's time ----------------------------------------------------------


def test_progress_reaches_a_log_that_is_not_a_terminal(monkeypatch):
    monkeypatch.setenv("EVALKIT_PROGRESS_SECONDS", "0")
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    with ProgressBar(True, 10, "features x", status="loss {task.fields[loss]:.2f}") as advance:
        for _ in range(10):
            advance(1, loss=0.5)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("features x: 1/10 (10%), ") and "img/s" in lines[0]
    assert "left" in lines[0] and lines[0].endswith("loss 0.50")
    assert lines[-1].startswith("features x: done, 10/10 in ")


def test_the_command_line_asks_for_progress_when_output_is_redirected(monkeypatch):
    from evalkit.cli import build_parser
    from evalkit.cli.run import run_spec

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    args = build_parser().parse_args(["run", "--task", "imagenet-linear", "--backbone", "fake"])
    assert run_spec(args).extract.progress is True
    quiet = build_parser().parse_args(
        ["run", "--task", "imagenet-knn", "--backbone", "fake", "--quiet"]
    )
    assert run_spec(quiet).extract.progress is False


def test_plan_states_an_expected_time(capsys, data_cache):
    args = [
        "plan",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--cache-dir",
        str(data_cache),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    # a busy machine measures a slower forward: minutes are as right as seconds
    expected = r"expected time: about (\d+ min )?\d+ s of compute \(.*forward measured here"
    assert re.search(expected, out), out
    assert main([*args, "--target", "gpus=1,gpu_gb=80,host_gb=100"]) == 0
    assert "expected time: unknown (no rate for this target" in capsys.readouterr().out
    own_models = [
        "plan",
        "--task",
        "qk-norm-stability",
        "--backbone",
        "none",
        "--data",
        "embedded",
        "--cache-dir",
        str(data_cache),
    ]
    assert main(own_models) == 0  # an ablation trains its own model: a block's product is timed
    assert "matrix product measured here" in capsys.readouterr().out


# 3. Errors before work -------------------------------------------------------------------


@pytest.fixture()
def no_backbone(monkeypatch):
    """A run that builds a backbone fails the test: the data is looked at first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a backbone was built before the data was found")

    monkeypatch.setattr("evalkit.core.runner.load_backbone", refuse)


def test_a_missing_data_folder_fails_before_a_backbone_is_built(tmp_path, no_backbone, capsys):
    args = [
        "run",
        "--task",
        "imagenet-linear",
        "--backbone",
        "fake",
        "--data-dir",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "rows"),
    ]
    assert main(args) == 2
    assert "dataset folder not found" in capsys.readouterr().err


def test_a_one_split_set_fails_before_a_backbone_is_built(tmp_path, no_backbone, capsys):
    own = image_folder(tmp_path / "own", classes=2)
    for path in sorted((own / "val").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (own / "val").rmdir()
    args = [
        "run",
        "--task",
        "imagenet-linear",
        "--backbone",
        "fake",
        "--set",
        f"dataset=folder:{own}",
        "--out",
        str(tmp_path / "rows"),
    ]
    assert main(args) == 2
    assert f"{own}/val" in capsys.readouterr().err


def test_the_run_lists_the_data_it_found(tmp_path, data_cache, capsys, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    own = image_folder(tmp_path / "own", classes=3)
    args = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--quiet",
        "--set",
        f"dataset=folder:{own}",
        "--set",
        "ks=1",
        "--out",
        str(tmp_path / "rows"),
    ]
    assert main(args) == 0
    assert f"data: folder:{own} ({own}): 3 classes; train 9, val 9" in capsys.readouterr().out


def test_check_data_takes_the_runs_set_and_lists_every_bad_file(tmp_path, capsys):
    own = image_folder(tmp_path / "own", classes=2, bad=2)
    args = ["check-data", "--task", "imagenet-linear", "--set", f"dataset=folder:{own}", "--quiet"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert out.count("unreadable image") == 2 and "broken0.jpg" in out and "broken1.jpg" in out


def test_a_bad_image_in_a_run_points_to_check_data(tmp_path, data_cache, monkeypatch, capsys):
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    own = image_folder(tmp_path / "own", classes=2, bad=1)
    args = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--quiet",
        "--set",
        f"dataset=folder:{own}",
        "--set",
        "ks=1",
        "--out",
        str(tmp_path / "rows"),
    ]
    assert main(args) == 2
    assert "`evalkit check-data`" in capsys.readouterr().err


# 4. Tables --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory, data_cache):
    """kNN on a set of three classes, and the linear probe on the stand-in over two seeds."""
    root = tmp_path_factory.mktemp("view")
    own = image_folder(root / "own", classes=3)
    out = root / "rows"
    small = evalkit.run(
        "imagenet-knn",
        "fake",
        out=out,
        cache_dir=data_cache,
        progress=False,
        overrides=[f"dataset=folder:{own}", "ks=1"],
    )
    seeds = evalkit.run(
        "imagenet-linear",
        "fake",
        data="embedded",
        seeds=(0, 1),
        out=out,
        cache_dir=data_cache,
        progress=False,
    )
    return out, small, seeds, own


def test_top_k_is_reported_only_below_the_class_count(three_classes, data_cache):
    out, small, _, own = three_classes
    assert {r["metric"] for r in small} == {"top1/k=1"}  # top-5 of 3 classes is always 100%
    again = evalkit.run(
        "imagenet-knn",
        "fake",
        out=out,
        cache_dir=data_cache,
        progress=False,
        overrides=[f"dataset=folder:{own}", "ks=1"],
    )
    assert [r["run_key"] for r in again] == [r["run_key"] for r in small]  # found, not rerun


def test_the_table_names_its_interval_and_the_data(three_classes, capsys):
    out, _, _, own = three_classes
    assert main(["table", str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"\d+\.\d+ ± \d+\.\d+ \(sd/2\)", text)  # two seeds: their spread
    assert f"imagenet-knn on folder:{own}" in text and "imagenet-linear (stand-in)" in text
    assert "(sd/k): standard deviation over job seeds" in text


def test_a_spread_over_job_seeds_and_one_over_a_tasks_own_draws_are_told_apart(tmp_path, capsys):
    """A few-shot row's ± is over its own draws in one job, a two-seed linear probe's over job
    seeds: each cell says which, the table's legend names both, and the leaderboard's seeds
    column says it counts job seeds, with a note on the draws beside it."""
    from evalkit.core.tables import aggregate, format_value
    from evalkit.publish.rendering import SPREADS, notes, task_header

    def row(task, seed, value, **extra):
        base = {"backbone": "fake", "metric": "top1", "config_hash": task, "seed": seed}
        return {**base, "task": task, "value": value, "higher_is_better": True, **extra}

    rows = [
        row("imagenet-5shot", 0, 30.0, std=1.5, seeds=[0, 1, 2]),
        row("imagenet-linear", 0, 24.0, stderr=2.0, n=384),
        row("imagenet-linear", 1, 26.0, stderr=2.0, n=384),
    ]
    cells = {r["task"]: format_value(r) for r in aggregate(rows)}
    assert cells == {
        "imagenet-5shot": "30.00 ± 1.50 (sd/3 draws)",
        "imagenet-linear": "25.00 ± 1.41 (sd/2)",
    }
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["table", str(tmp_path / "rows.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "(sd/k): standard deviation over job seeds" in out
    assert "(sd/k draws): standard deviation over the task's own draws within one job" in out
    assert "job seeds (sd)" in task_header({"metric": "top1", "higher_is_better": True})
    shown = {"task": "imagenet-5shot", "cells": [{"shown": cells["imagenet-5shot"]}]}
    board = {"correction": "Holm", "level": 0.05, "tasks": [shown], "failed": []}
    assert SPREADS in notes(board) and "job seeds" in SPREADS


def test_a_cell_names_its_interval_and_its_count():
    from evalkit.core.tables import format_value

    one = {"mean": 24.22, "std": 2.19, "interval": "se", "n": 384, "seeds": 1}
    assert format_value(one) == "24.22 ± 2.19 (se, n=384)"
    seeds = {"mean": 31.5, "std": 1.1, "interval": "sd", "n": 384, "seeds": 3}
    assert format_value(seeds) == "31.50 ± 1.10 (sd/3)"
    assert format_value({**one, "std": None}) == "24.22"


def test_the_csv_holds_numbers(three_classes, capsys):
    import pandas as pd

    out, _, seeds, _ = three_classes
    assert main(["table", str(out), "--format", "csv"]) == 0
    frame = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(frame.columns[:5]) == ["task", "finetuned", "dataset", "backbone", "metric"]
    top1 = frame[(frame.task == "imagenet-linear") & (frame.metric == "top1")].iloc[0]
    values = [r["value"] for r in seeds if r["metric"] == "top1"]
    assert top1.value == pytest.approx(sum(values) / 2) and top1.interval_kind == "sd"
    assert (top1.seeds, top1.n, top1.dataset) == (2, 384, "imagenet (stand-in)")


def test_a_stand_in_number_and_a_real_one_never_aggregate():
    from evalkit.core.tables import aggregate

    row = {
        "task": "t",
        "backbone": "b",
        "metric": "top1",
        "config_hash": "h",
        "seed": 0,
        "dataset": {"name": "imagenet", "own": True, "stand_in": True},
        "value": 20.0,
    }
    real = {**row, "seed": 1, "value": 80.0, "dataset": {**row["dataset"], "stand_in": False}}
    assert sorted(r["mean"] for r in aggregate([row, real])) == [20.0, 80.0]


def test_compare_shows_the_data_and_whole_names(three_classes, capsys, monkeypatch):
    out, _, _, own = three_classes
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["compare", str(out), str(out), "--tolerance", "0"]) == 0
    wide = capsys.readouterr().out
    assert "imagenet (stand-in)" in wide and f"folder:{own}" in wide  # the data column
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["compare", str(out), str(out), "--tolerance", "0"]) == 0
    assert "…" not in capsys.readouterr().out  # long names fold over lines, never cut


def test_a_table_of_rows_renders_without_loading_any_task(three_classes):
    out = three_classes[0]
    code = (
        "import sys; from evalkit.cli import main; main(['table', sys.argv[1]]); "
        "assert 'torch' not in sys.modules, 'the table imported torch'"
    )
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, capture_output=True)


# 6. errors, 8. locks and pictures ---------------------------------------------------------


def test_errors_shows_probabilities_named(tmp_path, data_cache, capsys):
    import pandas as pd

    out = tmp_path / "rows"
    evalkit.run(
        ["imagenet-linear", "imagenet-knn"],
        "fake",
        data="embedded",
        out=out,
        cache_dir=data_cache,
        progress=False,
        save_predictions=True,
    )
    for task, kind in (("imagenet-linear", "softmax"), ("imagenet-knn", "votes")):
        (path,) = (out / "predictions").glob(f"{task}--*.parquet")
        frame = pd.read_parquet(path)
        top = [p[0] for p in frame["top5_probabilities"]]
        assert all(0 < p <= 1 for p in top) and kind in frame["score_kind"][0]
        assert all(list(p) == sorted(p, reverse=True) for p in frame["top5_probabilities"])
        assert main(["errors", str(out), "--task", task, "--top", "2"]) == 0
        assert f"most confident mistakes (probability: {frame['score_kind'][0]}" in " ".join(
            capsys.readouterr().out.split()
        )
    assert not (out / ".locks").exists()  # finished runs leave no lock files


def test_probabilities_of_logits_are_their_softmax():
    import torch

    from evalkit.protocols.predictions import as_probabilities

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    expected = torch.exp(logits) / torch.exp(logits).sum(dim=1, keepdim=True)
    assert torch.allclose(as_probabilities(logits, "logits"), expected.double())
    votes = torch.tensor([[3.0, 1.0, float("-inf")]])  # a class outside the scored space
    assert as_probabilities(votes, "votes").tolist() == [[0.75, 0.25, 0.0]]


def test_the_segmentation_picture_names_its_columns(tmp_path):
    import numpy as np

    from evalkit.protocols.grids import TITLE_HEIGHT, save_picture_grid

    tile = np.zeros((32, 48, 3), np.uint8)
    path = save_picture_grid([[tile, tile, tile]], tmp_path / "grid.png")
    picture = np.asarray(Image.open(path))
    assert picture.shape[0] == TITLE_HEIGHT + 36
    strip = picture[:TITLE_HEIGHT]
    assert all(strip[:, c * 52 : c * 52 + 48].max() > 200 for c in range(3))  # text in each


# 7. MLflow's default store ----------------------------------------------------------------


def test_the_mlflow_extra_installs_what_its_default_store_needs():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras["mlflow"]}
    assert {"mlflow-skinny", "sqlalchemy", "alembic"} <= names  # sqlite:///mlflow.db runs on them


def test_log_mlflow_without_options_lands_where_mlflow_ui_looks(tmp_path, data_cache, monkeypatch):
    from mlflow.tracking import MlflowClient

    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    monkeypatch.chdir(tmp_path)
    args = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--quiet",
        "--set",
        "ks=1",
        "--log",
        "mlflow",
    ]
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(args) == 0
    assert "--log mlflow" not in err.getvalue(), err.getvalue()
    from mlflow.tracking._tracking_service.utils import _get_default_tracking_uri

    client = MlflowClient(_get_default_tracking_uri())  # what `mlflow ui` here opens
    experiment = client.get_experiment_by_name("evalkit")
    (run,) = client.search_runs([experiment.experiment_id])
    rows = [json.loads(line) for line in next((tmp_path / "results/runs").glob("*.jsonl")).open()]
    assert run.data.metrics["top1/k_1"] == pytest.approx(rows[0]["value"])


def test_one_rule_picks_the_device_for_run_plan_and_the_api(monkeypatch, data_cache):
    from evalkit.core.catalog import resolve_task
    from evalkit.core.costs import plan_run
    from evalkit.core.spec import RunSpec
    from evalkit.data import DataConfig

    monkeypatch.setenv("EVALKIT_DEVICE", "cpu")
    assert RunSpec(tasks="imagenet-knn", backbones="fake").resolved_device == "cpu"
    monkeypatch.setenv("EVALKIT_DEVICE", "cuda:3")
    assert RunSpec(tasks="imagenet-knn", backbones="fake").resolved_dtype == "bf16"

    class Planned(Exception):
        pass

    def budget_here(device, *args):
        raise Planned(device)

    monkeypatch.setattr("evalkit.core.budget.Budget.here", budget_here)
    config = DataConfig(source="embedded", cache=data_cache)
    with pytest.raises(Planned, match="cuda:3"):  # plan budgets the device run would use
        plan_run(resolve_task("imagenet-knn"), "fake", config, {})


def test_compare_explains_baselines_too_old_to_say_their_data(three_classes, tmp_path, capsys):
    out = three_classes[0]
    old = tmp_path / "old"
    old.mkdir()
    for path in out.glob("*.jsonl"):  # as an evalkit that did not record the data wrote them
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        lines = [json.dumps({k: v for k, v in r.items() if k != "dataset"}) for r in rows]
        (old / path.name).write_text("\n".join(lines) + "\n")
    assert main(["compare", str(old), str(out), "--tolerance", "0"]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "do not record the data they were computed on" in text and "--update-baselines" in text
