"""Run under ``torchrun --nproc-per-node 2`` (gloo, CPU) by tests/test_parallel.py.

Each data-parallel rank holds half of a batch of LiT pairs; the loss with negatives gathered
across ranks, and the averaged gradients, must equal one process's on the joined batch.
Rank 0 writes what it measured as JSON to the path in argv[1].
"""

from __future__ import annotations

import json
import sys

import torch

from evalkit import distributed as mesh
from evalkit.distributed import average_gradients
from evalkit.heads.text import LitModel, TowerConfig, contrastive_loss, tokenizer


def main():
    layout = mesh.setup(1)
    cfg = TowerConfig(width=32, heads=2, layers=1, embed_dim=16, image_head=True)
    torch.manual_seed(0)
    model = LitModel(cfg)
    features = torch.randn(8, 16)
    tokens = tokenizer(cfg.context)([f"caption number {i}" for i in range(8)])
    mine = slice(4 * layout.dp_rank, 4 * layout.dp_rank + 4)
    loss = model.loss(features[mine], tokens[mine])
    loss.backward()
    average_gradients(model)
    shared = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    joined = contrastive_loss(
        model.embed_images(features), model.embed_text(tokens), model.log_temperature, model.bias
    )
    joined.backward()
    diff = max(
        (shared[n] - p.grad).abs().max().item()
        for n, p in model.named_parameters()
        if p.grad is not None
    )
    scale = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
    assert set(shared) == {n for n, p in model.named_parameters() if p.grad is not None}
    if layout.main:
        with open(sys.argv[1], "w") as f:
            json.dump(
                {
                    "gathered": loss.item(),
                    "joined": joined.item(),
                    "grad_diff": diff,
                    "grad_scale": scale,
                },
                f,
            )
    mesh.teardown()


if __name__ == "__main__":
    main()
