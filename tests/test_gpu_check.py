"""The GPU check's CPU branch: the same code a device runs, at test sizes (``python -m
benchmarks.gpu_check``): every check answers, the probe agrees with itself on the CPU, the
fine-tuning step is finite, and MFU says why it was not measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_gpu_check_runs_its_cpu_branch():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu"], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=600)  # fmt: skip
    record = json.loads((ROOT / "results" / "bench" / "gpu_check.json").read_text())
    assert record["device"] == "cpu"
    assert record["extraction"]["throughput_vs_bare"] > 0
    assert record["probe"]["same"] and record["probe"]["l2"] == record["probe"]["cpu_l2"]
    assert record["finetune_step"]["finite"]
    assert record["vit22b_forward"]["mfu"] == "not measured (no GPU)"
