"""Run by tests/test_training.py as a separate process that the test may SIGKILL: trains a
tiny classifier into argv[1] (checkpoints every 5 steps) and writes the final log to
argv[1]/final.json. argv[2] is seconds to sleep per step (to give the test time to kill it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from evalkit.schedule import Schedule
from evalkit.training.loop import fit

SCHEDULE = Schedule(steps=30, batch_size=16, lr=3e-3, warmup=3, checkpoint_every=5)


def model_and_batches(delay: float = 0.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 3))
    data = torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
    labels = (data[:, 0] > 0).long() + (data[:, 1] > 0).long()

    def batch(step: int, micro: int):
        time.sleep(delay)
        pick = torch.randint(0, 200, (16,), generator=torch.Generator().manual_seed(step))
        return data[pick], labels[pick]

    return model, batch


if __name__ == "__main__":
    out = Path(sys.argv[1])
    model, batch = model_and_batches(float(sys.argv[2]))
    log = fit(model, batch, torch.nn.functional.cross_entropy, SCHEDULE, out=out)
    (out / "final.json").write_text(json.dumps(log))
