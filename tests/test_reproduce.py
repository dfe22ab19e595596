"""The effect table machinery at the smoke scale: rows measured through evalkit run, judged,
written as Markdown and JSON, and reused on a rerun."""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.cli import main
from evalkit.reproduction.rows import rows

SCALE = "paper"  # the paper scale's files, named without citing them


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
    assert summary["rows"][0]["setup"] == "vit22b/test at 32 px, interleaved timing"
    linear = summary["rows"][1]
    assert linear["setup"] == "ladder test → test" and "→" in linear["ours"]
    # both ladder sizes are the same model at this scale: no effect, and an interval around it
    low, high = linear["interval"]
    assert linear["our_effect"] == 0 and low < 0 < high and linear["agrees"] is None
    assert linear["note"].startswith("within noise") and linear["seconds"] >= 0
    assert "no effect larger than ±" in (paper / f"{name}.md").read_text()
    table = (paper / f"{name}.md").read_text()
    assert "| 5 | scale ViT-e → ViT-22B | ImageNet linear probe |" in table
    # row 3's throughput plot is copied beside the table and embedded
    (picture,) = summary["rows"][0]["pictures"]
    assert (paper / picture).is_file() and f"![row 3]({picture})" in table
    rows_file = paper / "runs-smoke" / "imagenet-linear.jsonl"
    before = rows_file.read_text()
    assert main(args) == 0  # everything reused: no new rows
    assert rows_file.read_text() == before
    assert main(["reproduce", "--scale", "huge"]) == 2
    assert main(["reproduce", "--scale", "smoke", "--data-dir", "/data"]) == 2  # paper only
    assert main(["reproduce", "--scale", "paper", "--dry-run", "--mfu", "1.5"]) == 2
    assert main(["reproduce", "--scale", "smoke", "--rows", "13"]) == 2


def test_paper_scale_dry_run_estimates_compute_and_prints_the_batch_script(cli_env, capsys):
    from evalkit.heads.linear import path_flops
    from evalkit.models.vit22b import config
    from evalkit.parallel.sizing import forward_flops

    args = [
        "reproduce",
        "--scale",
        "paper",
        "--dry-run",
        "--executor",
        "slurm",
        "--out",
        "p",
        "--gpus-per-job",
        "8",
        "--partition",
        "gpu",
        "--weights",
        "ViT-22B=/ckpt/22b",
        "--backbone",
        "ViT-L/32=vit22b/l",
    ]  # sized on the meta device, no timm model built
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=8" in printed and "#SBATCH --partition=gpu" in printed
    tasks = [line for line in printed.splitlines() if line.startswith("# task ")]
    assert len(tasks) == 21 and all("--data auto" in t for t in tasks)
    # two arrays: the ablations train their own models in one process on one GPU
    assert printed.count("#!/bin/bash") == 2 and "#SBATCH --gpus-per-node=1" in printed
    ablations = [t for t in tasks if "--backbone none" in t]
    assert len(ablations) == 4 and not any("torchrun" in t or "--fsdp" in t for t in ablations)
    assert sum("--weights /ckpt/22b" in t for t in tasks) == 9  # every ViT-22B job
    compute = (cli_env / "p" / f"compute-{SCALE}.md").read_text()
    # row 5: every ImageNet train and val image through ViT-e and ViT-22B once (dataset card)
    images = 1_281_167 + 50_000
    flops = images * (forward_flops(config("e")) + forward_flops(config("22b")))
    flops += sum(path_flops(1_281_167, config(size).width, 1000) for size in ("e", "22b"))
    assert (
        f"| 5 | ImageNet linear probe | imagenet-linear × vit22b/e; imagenet-linear × vit22b | {flops / 1e18:.2f} EFLOP |"
        in compute
    )
    assert compute.count("\n| ") == 14  # header, 12 rows, total


def test_a_paper_scale_dry_run_needs_no_submitit(cli_env, capsys, monkeypatch):
    """A dry run only plans: it prints the Slurm script without ``evalkit[cluster]``."""
    import sys

    for name in [n for n in sys.modules if n.split(".")[0] == "submitit"] + ["submitit"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    args = ["reproduce", "--scale", "paper", "--dry-run", "--executor", "slurm", "--rows", "5"]
    assert main([*args, "--out", "p", "--weights", "ViT-22B=/ckpt/22b"]) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --array=0-1%2" in printed and "export SUBMITIT_EXECUTOR=slurm" in printed


def test_paper_scale_needs_weights_and_writes_the_table_from_its_jobs(cli_env, data_cache):
    from evalkit.data import DATASETS

    # the embedded ImageNet stand-in, laid out as real data under --data-dir
    (cli_env / "data").mkdir()
    stand_in = DATASETS.get("imagenet").load().write_embedded(data_cache / "embedded")
    (cli_env / "data" / "imagenet").symlink_to(stand_in)
    base = [
        "reproduce",
        "--scale",
        "paper",
        "--rows",
        "5",
        "--out",
        "p",
        "--quiet",
        "--data-dir",
        str(cli_env / "data"),
    ]
    assert main(base) == 2  # no --weights for ViT-e and ViT-22B
    repo_weights = str(
        Path(__file__).parents[1] / "tests" / "regression" / "vit22b-test.safetensors"
    )
    small = [
        "--backbone",
        "ViT-e=vit22b/test",
        "--backbone",
        "ViT-22B=vit22b/test",
        "--weights",
        f"ViT-e={repo_weights}",
        "--weights",
        f"ViT-22B={repo_weights}",
    ]
    assert main(base + small) == 0  # one job (both models are the same here), run locally
    table = (cli_env / "p" / f"effects-{SCALE}.md").read_text()
    assert "| 5 | scale ViT-e → ViT-22B |" in table and "vit22b/test → vit22b/test" in table
    rows_file = cli_env / "p" / "runs-paper" / "imagenet-linear.jsonl"
    assert len(rows_file.read_text().splitlines()) == 2  # top-1 and top-5, run once
    assert main(base + small) == 0 and len(rows_file.read_text().splitlines()) == 2


def test_an_efficiency_row_within_timing_noise_is_not_judged():
    judge = next(r for r in rows() if r.number == 4).judge
    losses = {"final_loss/parallel": 1.5, "final_loss/sequential": 1.5}

    def verdict(speedup, stderr):
        values = {"ablation": {**losses, "speedup": speedup, "speedup/stderr": stderr}}
        return judge(values)[2]

    assert verdict(1.10, 0.02) is True  # 10% faster, noise ±4%
    assert verdict(1.03, 0.02) is None  # within two standard errors
    assert verdict(0.90, 0.02) is False
