"""The backbone trainer: its per-step overhead, and the memory FSDP2 saves.

1. Overhead: ``evalkit.training.loop.fit`` (schedule, clipping, logging, progress off, no
   checkpoints) against the bare baseline ``loss.backward(); opt.step()`` on the same
   ``vit22b/s`` classifier and the same in-memory batches. Target: fit's speed ≥ 0.95× the
   bare loop's.
2. Memory: peak RSS per process of ``evalkit pretrain --model vit22b/b`` in one process
   against the same command under ``torchrun --nproc-per-node 2 ... --fsdp`` (gloo, CPU), a
   few steps each. Target: ≤ 0.6× of the single process. Both runs return freed blocks of
   1 MB and more to the system (``MALLOC_MMAP_THRESHOLD_``): with glibc's default, FSDP's
   per-block gathers leave freed memory in the heap and RSS measures the allocator instead of
   the tensors. The ratio is also given above the footprint of the process itself (the same
   command with ``vit22b/test``).
3. Fine-tuning memory: the same comparison for ``evalkit run --set finetune=true`` on
   ``vit22b/b`` (``--finetune-memory`` runs this part alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import report
from evalkit.models.vit22b import build, config
from evalkit.schedule import Schedule
from evalkit.training.loop import fit
from evalkit.training.pretrain import Classifier

STEPS, BATCH = 20, 32
RSS_SCRIPT = Path(__file__).with_name("rss.py")


def classifier() -> Classifier:
    torch.manual_seed(0)
    return Classifier(build(config("s", image=64, patch=8), seed=0), 100)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(BATCH, 3, 64, 64, generator=generator),
            torch.randint(0, 100, (BATCH,), generator=generator),
        )
        for _ in range(STEPS)
    ]


def bare_loop(data) -> float:
    model = classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    start = time.perf_counter()
    for x, y in data:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return time.perf_counter() - start


def trainer(data) -> float:
    model = classifier()
    schedule = Schedule(steps=STEPS, batch_size=BATCH, warmup=2, checkpoint_every=10**9)
    start = time.perf_counter()
    fit(model, lambda step, micro: data[step], torch.nn.functional.cross_entropy, schedule)
    return time.perf_counter() - start


def peak_rss(command: list[str], folder: Path) -> float:
    """The largest peak RSS (MB) of the processes that wrote ``rss-*.json`` in ``folder``."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "EVALKIT_RSS_DIR": str(folder),
        "MALLOC_MMAP_THRESHOLD_": str(2**20),
    }
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)
    peaks = [json.loads(p.read_text())["max_rss_mb"] for p in folder.glob("rss-*.json")]
    return max(peaks)


def memory() -> dict:
    args = [
        "pretrain",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "100",
        "--data",
        "embedded",
        "--quiet",
    ]
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    launch = [
        torchrun,
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        str(RSS_SCRIPT),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in ("base", "one", "two"):
            (tmp / name).mkdir()
        single = [sys.executable, str(RSS_SCRIPT), *args]
        base = peak_rss([*single, "--model", "vit22b/test", "--out", str(tmp / "o")], tmp / "base")
        one = peak_rss([*single, "--model", "vit22b/b", "--out", str(tmp / "a")], tmp / "one")
        two = peak_rss(
            [*launch, *args, "--model", "vit22b/b", "--fsdp", "--out", str(tmp / "b")], tmp / "two"
        )
    return {
        "rss_process_mb": round(base),
        "rss_one_process_mb": round(one),
        "rss_fsdp_rank_mb": round(two),
        "fsdp_rss_ratio": round(two / one, 2),
        "fsdp_ratio_above_process": round((two - base) / (one - base), 2),
        "target_rss_ratio": "<= 0.6",
    }


def finetune_memory() -> dict:
    """Per-rank peak RSS of fine-tuning ``vit22b/b`` (3 steps at 64 px) under FSDP2 on 2 ranks
    against one process: the frozen backbone, its trainable copy and AdamW's state."""
    args = [
        "run",
        "--task",
        "imagenet-linear",
        "--backbone",
        "vit22b/b",
        "--data",
        "embedded",
        "--set",
        "finetune=true",
        "--set",
        "finetune_steps=3",
        "--set",
        "finetune_batch_size=8",
        "--set",
        "finetune_resolution=64",
        "--quiet",
        "--no-cache",
    ]
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    launch = [
        torchrun,
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        str(RSS_SCRIPT),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in ("one", "two"):
            (tmp / name).mkdir()
        one = peak_rss(
            [sys.executable, str(RSS_SCRIPT), *args, "--out", str(tmp / "a")], tmp / "one"
        )
        two = peak_rss([*launch, *args, "--fsdp", "--out", str(tmp / "b")], tmp / "two")
    return {
        "finetune_rss_one_process_mb": round(one),
        "finetune_rss_fsdp_rank_mb": round(two),
        "finetune_fsdp_rss_ratio": round(two / one, 2),
    }


def main():
    if sys.argv[1:] == ["--finetune-memory"]:
        report("trainer-finetune", finetune_memory())
        return
    data = batches()
    bare_loop(data[:2])  # warm-up
    bare = min(bare_loop(data) for _ in range(2))
    ours = min(trainer(data) for _ in range(2))
    record = {
        "steps": STEPS,
        "batch": BATCH,
        "model": "vit22b/s @ 64 px",
        "bare_s": round(bare, 2),
        "fit_s": round(ours, 2),
        "fit_speed_vs_bare": round(bare / ours, 3),
        "target_speed": ">= 0.95",
    }
    report("trainer", record | memory() | finetune_memory())


if __name__ == "__main__":
    main()
