"""Timed under torchrun by bench_vit22b_blocks.py: best-of-N forward time of a stack of
parallel and of sequential blocks, sharded over all ranks (tensor parallel), and the number of
all-reduces per block. Args: OUT.json WIDTH DEPTH BATCH REPEATS."""

from __future__ import annotations

import json
import sys
import time

import torch
from torch.distributed.tensor.debug import CommDebugMode

from evalkit import distributed as mesh
from evalkit.models.vit22b import ViT, config, init_value
from evalkit.parallel.load import RandomSource, materialize
from evalkit.parallel.sharding import apply_tensor_parallel


def model_for(width: int, depth: int, parallel: bool, layout) -> ViT:
    size = {384: "s", 768: "b", 1024: "l"}[width]
    with torch.device("meta"):
        model = ViT(config(size, depth=depth, parallel=parallel, pool="gap"))
    if layout.tp_size > 1:
        apply_tensor_parallel(model, layout.mesh["tp"])
    model.to_empty(device="cpu")
    return materialize(model, RandomSource(init_value, 0)).eval().requires_grad_(False)


def best_forward(blocks, x, repeats: int) -> float:
    best = float("inf")
    with torch.no_grad():
        blocks(x)
        for _ in range(repeats):
            mesh.barrier()
            start = time.perf_counter()
            blocks(x)
            best = min(best, time.perf_counter() - start)
    return best


def main():
    out, width, depth, batch, repeats = sys.argv[1], *map(int, sys.argv[2:])
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    layout = mesh.setup(world)
    torch.manual_seed(0)
    x = torch.randn(batch, 256, width)
    result = {}
    for name, parallel in (("parallel", True), ("sequential", False)):
        blocks = torch.nn.Sequential(*model_for(width, depth, parallel, layout).blocks)
        result[name] = best_forward(blocks, x, repeats)
        with torch.no_grad(), CommDebugMode() as comm:
            blocks(x)
        result[f"allreduces_per_block_{name}"] = comm.get_total_counts() / depth
    result["allreduces_per_block"] = {
        k: result.pop(f"allreduces_per_block_{k}") for k in ("parallel", "sequential")
    }
    if layout.main:
        with open(out, "w") as f:
            json.dump(result, f)
    mesh.teardown()


if __name__ == "__main__":
    main()
