"""The CI gate (``evalkit compare``) on every task family and every seed set: ``--paired``
gives each compared row a paired verdict or one line saying why it has none (never a
traceback), a folder compared with itself passes, a dropped family fails, and two sides
that ran different seeds are compared on the seeds they share."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks import gpu_check
from evalkit.cli import main


def run(*args) -> int:
    return main(["run", "--backbone", "fake", "--data", "embedded", "--quiet", *args])


def compared(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["compare", *map(str, args)])
    return code, capsys.readouterr().out


def test_a_few_shot_folder_compared_with_itself_passes_paired(cli_env, capsys):
    assert run("--task", "imagenet-5shot", "--save-predictions", "--out", "F") == 0
    code, out = compared(capsys, "F", "F", "--paired")
    assert code == 0, out
    assert "p = 1, Holm" in out and "no changes beyond tolerance" in out


def test_paired_without_per_image_outputs_is_one_line(cli_env, capsys):
    assert run("--task", "imagenet-knn", "--save-predictions", "--out", "base") == 0
    assert run("--task", "imagenet-knn", "--out", "new") == 0
    capsys.readouterr()
    assert main(["compare", "base", "new", "--paired"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: new holds no per-image outputs") and "\n" not in error


def test_seed_sets_that_differ_are_compared_on_the_seeds_both_ran(cli_env, capsys):
    assert run("--task", "imagenet-knn", "--seed", "0", "--seed", "1", "--out", "base") == 0
    assert run("--task", "imagenet-knn", "--seed", "0", "--out", "new") == 0
    code, out = compared(capsys, "base", "new")
    assert code == 0, out  # seed 0 is bit-identical: no regression
    assert "base seeds 0, 1; new seed 0: compared on seed 0" in out
    code, out = compared(capsys, "base", "base")
    assert code == 0 and "│ 0, 1 " in out


def test_seed_sets_with_no_seed_in_common_say_so(cli_env, capsys):
    assert run("--task", "imagenet-knn", "--seed", "0", "--out", "base") == 0
    assert run("--task", "imagenet-knn", "--seed", "1", "--out", "new") == 0
    _, out = compared(capsys, "base", "new", "--tolerance", "100")
    assert "base seed 0; new seed 1: no seed in common, their means compared" in out


def test_paired_compares_the_per_image_outputs_of_the_shared_seeds(cli_env, capsys):
    both = ("--task", "imagenet-knn", "--save-predictions")
    assert run(*both, "--seed", "0", "--seed", "1", "--out", "base") == 0
    assert run(*both, "--seed", "0", "--out", "new") == 0
    code, out = compared(capsys, "base", "new", "--paired")
    assert code == 0, out
    assert "0 right→wrong, 0 wrong→right" in out  # seed 0 against itself, not 0+1 against 0


def test_equivalence_prints_its_interval(cli_env, capsys):
    assert run("--task", "imagenet-knn", "--save-predictions", "--out", "F") == 0
    _, out = compared(capsys, "F", "F", "--equivalent", "1")
    assert "90% interval of new − base: [" in out


@pytest.mark.long
def test_paired_gate_on_every_family_passes_itself_and_fails_a_dropped_family(
    tmp_path, data_cache, monkeypatch, capsys
):
    """One folder holding a cell of every task family (the device check's table), with
    per-image outputs: compared with itself every row gets a verdict and the gate passes; a
    copy without one family's rows fails on the rows it lost."""
    import evalkit

    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    monkeypatch.setenv("EVALKIT_EMBEDDED_SCENES", "16,8")
    monkeypatch.setenv("COLUMNS", "400")
    gpu_check.register_check_clip()
    every = tmp_path / "every"
    for task, backbone, settings in gpu_check.FAMILIES.values():
        evalkit.run(
            task,
            backbone,
            data="embedded",
            device="cpu",
            out=every,
            cache_dir=tmp_path / "cache",
            progress=False,
            overrides=settings,
            random_init=backbone.startswith("open_clip"),
            save_predictions=True,
        )
    code, out = compared(capsys, every, every, "--paired")
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("│ ") and "(tolerance:" in line]
    assert len(lines) >= len({t for t, _, _ in gpu_check.FAMILIES.values()})
    assert all("p = " in line or "untested: " in line for line in lines)
    tasks = {line.split("│")[1].strip() for line in lines}
    assert tasks >= {t for t, _, _ in gpu_check.FAMILIES.values()}
    dropped = tmp_path / "dropped"
    shutil.copytree(every, dropped)
    os.remove(dropped / "imagenet-5shot.jsonl")
    code, out = compared(capsys, every, dropped, "--paired")
    assert code == 1 and "missing" in out


def test_piped_output_keeps_labels_whole_whatever_columns_says(dims_zoo, capsys, monkeypatch):
    argv = dims_zoo
    assert main([*argv, "--quiet", "--out", "R"]) == 0
    monkeypatch.setenv("COLUMNS", "80")  # as a CI runner sets it
    code, out = compared(capsys, "R", "R")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("│ imagenet-knn")]
    assert len(rows) == 4 and all("(random init)" in line for line in rows)
    assert "fake [dim=128] (random init)" in out and "imagenet (stand-in)" in out


def test_metrics_only_new_has_do_not_fail_the_equivalence_gate(cli_env, capsys):
    assert run("--task", "imagenet-knn", "--save-predictions", "--out", "base") == 0
    assert run("--task", "imagenet-knn", "--save-predictions", "--out", "new") == 0
    assert run("--task", "imagenet-1shot", "--save-predictions", "--out", "new") == 0
    code, out = compared(capsys, "base", "new", "--equivalent", "50")
    assert code == 0, out
    assert "every metric equivalent" in out or "0 metric(s) not shown" in out
