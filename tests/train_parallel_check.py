"""The backbone trainer under ``torchrun --nproc-per-node 2`` (gloo, CPU), or in one process
for the reference; run by tests/test_training.py.

``argv``: the JSON to write (rank 0), the tensor-parallel size, then the modes to run: ``dp``
(whole copies, gradients averaged), ``fsdp`` (FSDP2 over the data-parallel ranks), ``tp``
(the family's tensor-parallel plan). Each mode trains ``vit22b/test`` with a classifier for 3
steps with checkpoints, then a fresh model resumes from them to step 5; the log of all 5
steps is written.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from evalkit import distributed as mesh
from evalkit.models.vit22b import build, config
from evalkit.schedule import Schedule
from evalkit.training.loop import fit, sampled_batches
from evalkit.training.pretrain import Classifier, shard


class Noise(torch.utils.data.Dataset):
    """Seeded random 32-px images in 3 classes."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=generator), index % 3


def train(mode: str, out: Path, steps: int) -> list[dict]:
    torch.manual_seed(0)  # the classifier's init, the same on every rank (as pretrain does)
    model = Classifier(build(config("test", image=32, patch=8), seed=0), 3)
    model = shard(model, fsdp=mode == "fsdp")
    schedule = Schedule(steps=steps, batch_size=8, lr=3e-3, warmup=2, checkpoint_every=2)
    batches = sampled_batches(Noise(), schedule.batch_size, schedule.seed)
    return fit(model, batches, torch.nn.functional.cross_entropy, schedule, out=out)


def main(path: str, tp: str, *modes: str):
    layout = mesh.setup(int(tp))
    result = {}
    for mode in modes:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            if layout.mesh is not None:  # every rank writes into rank 0's folder
                holder = [str(out)]
                torch.distributed.broadcast_object_list(holder, src=0)
                out = Path(holder[0])
            train(mode, out, steps=3)
            log = train(mode, out, steps=5)  # resumes at step 3
            mesh.barrier()
        result[mode] = [{"loss": e["loss"], "grad_norm": e["grad_norm"]} for e in log]
    if layout.main:
        Path(path).write_text(json.dumps(result))
    mesh.teardown()


if __name__ == "__main__":
    main(*sys.argv[1:])
