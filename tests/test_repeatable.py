"""The same inputs give the same numbers on any thread count, end to end through the command
line (each run extracting its own features). The probe's decisions on real-looking
ill-conditioned features (a random ResNet-18, ``resnet_features``) under every kernel path and
on nudged features are checked in tests/test_kernels.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("probe_threads_script.py")


def probe_in_subprocess(features: Path, threads: int, nudge: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(features), str(threads), str(nudge)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    )
    return json.loads(out.stdout)


def resnet_features(data_cache) -> list[torch.Tensor]:
    """A seeded random timm/resnet18 on the embedded ImageNet stand-in at 64 px: mean-pooled
    512-d features whose spectrum spans orders of magnitude."""
    from torchvision.transforms import v2

    from evalkit import load_backbone
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset

    backbone = load_backbone("timm/resnet18")
    transform = v2.Compose([v2.ToImage(), v2.Resize((64, 64)), v2.ToDtype(torch.float32, True)])
    out = []
    for split in ("train", "val"):
        data = open_dataset(
            "imagenet", split, DataConfig(source="embedded", cache=data_cache), transform=transform
        )
        images = torch.stack([data[i][0] for i in range(len(data))])
        with torch.no_grad():
            pooled = torch.cat([backbone.extract(b, pool="mean").pooled for b in images.split(64)])
        out += [pooled, torch.as_tensor(data.labels)]
    return out


def cli_probe(cwd: Path, threads: int) -> dict:
    args = [
        "--task",
        "imagenet-linear",
        "--backbone",
        "timm/vit_tiny_patch16_224",
        "--model-arg",
        "img_size=64",
        "--data",
        "embedded",
        "--quiet",
    ]
    out, cache = f"rows{threads}", f"cache{threads}"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(
        [sys.executable, "-m", "evalkit", "run", *args, "--out", out, "--cache-dir", cache],
        cwd=cwd,
        env=env,
        check=True,
        timeout=600,
    )
    from evalkit.core.results import load_rows

    return {
        r["metric"]: (r["value"], r["extra"]["l2"], r["extra"]["holdout_top1_by_l2"])
        for r in load_rows([cwd / out])
    }


@pytest.mark.long
@pytest.mark.usefixtures("cli_env")
def test_the_command_line_probe_is_the_same_on_one_and_two_threads(cli_env):
    """Each run extracts its own features on its own thread count, then probes them."""
    one = cli_probe(cli_env, 1)
    assert set(one) == {"top1", "top5"}
    assert cli_probe(cli_env, 2) == one
