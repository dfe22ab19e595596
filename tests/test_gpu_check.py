"""The device check's CPU branch (``python -m benchmarks.gpu_check --device cpu``), the same
code a GPU runs at small sizes: every check answers, the CPU agrees with itself, the one-rank
collective and the sharded forward work, the fine-tuning step is finite, and MFU says why it
was not measured. The task families are left to ``tests/test_device_placement.py`` here (it
runs the same table on a stand-in GPU); ``.ci/run`` runs the whole check, families included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.long
def test_the_gpu_check_runs_its_cpu_branch(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "check.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--skip",
            "families",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["all_families_ok"] == "not run"
    assert record["features_agree"]["max_abs_diff"] == 0.0  # the CPU against itself
    assert record["probe"]["same"] and record["probe"]["l2"] == record["probe"]["cpu_l2"]
    assert record["collective"]["ok"] and record["collective"]["all_reduce_ok"]
    feeding = record["feeding"]
    assert min(feeding["loader_img_s"].values()) > 0 and feeding["forward_img_s"] > 0
    assert feeding["pixel_cache_img_s_one_core"] > 0
    assert record["extraction"]["throughput_vs_bare"] > 0
    assert record["finetune_step"]["finite"]
    assert record["vit22b_forward"]["mfu"] == "not measured (no GPU)"
