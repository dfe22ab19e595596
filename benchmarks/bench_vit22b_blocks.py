"""The paper's efficiency switches on this machine (Dehghani et al. 2023 §2; effect-table rows
3-4 in docs/protocols.md): parallel vs sequential block, bias-free vs biased (QKV and LayerNorm biases), and fused vs
separate projections (QKV + MLP-in in one matmul, attn-out + MLP-out in one), forward and
forward+backward throughput at two widths; then the tensor-parallel mechanism on 2 CPU ranks
(``benchmarks/tp_timing.py``): the parallel block's TP=2 forward against the sequential
block's, and TP=2 against one process.

Each ratio is taken per repeat from interleaved timings (so drift hits both sides) and reported
as median [min, max] over the repeats. Ratios > 1 mean the first-named variant is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import report
from evalkit.models.vit22b import Block, config


class FusedParallelBlock(nn.Module):
    """The same parallel block with its four in-projections in one matmul and its two
    out-projections in another (the fusion the parallel layout allows)."""

    def __init__(self, block: Block):
        super().__init__()
        attn, mlp = block.attn, block.mlp
        self.norm, self.q_norm, self.k_norm = block.norm1, attn.q_norm, attn.k_norm
        self.head_dim, self.width = attn.head_dim, attn.q.in_features
        self.hidden = mlp.fc1.out_features
        weight = torch.cat([attn.q.weight, attn.k.weight, attn.v.weight, mlp.fc1.weight])
        self.fc_in = nn.Linear(self.width, weight.shape[0], bias=False)
        self.fc_in.weight = nn.Parameter(weight.detach().clone())
        self.mlp_bias = nn.Parameter(mlp.fc1.bias.detach().clone())
        self.fc_out = nn.Linear(self.width + self.hidden, self.width)
        self.fc_out.weight = nn.Parameter(
            torch.cat([attn.out.weight, mlp.fc2.weight], dim=1).detach().clone()
        )
        self.fc_out.bias = nn.Parameter((attn.out.bias + mlp.fc2.bias).detach().clone())

    def forward(self, x):
        q, k, v, h = self.fc_in(self.norm(x)).split([self.width] * 3 + [self.hidden], dim=-1)
        heads = [t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in (q, k, v)]
        y = nn.functional.scaled_dot_product_attention(
            self.q_norm(heads[0]), self.k_norm(heads[1]), heads[2]
        )
        mixed = torch.cat([y.transpose(1, 2).flatten(2), nn.functional.gelu(h + self.mlp_bias)], -1)
        return x + self.fc_out(mixed)


def stack(cfg, depth: int, *, fused: bool = False) -> nn.Module:
    torch.manual_seed(0)
    blocks = [Block(cfg) for _ in range(depth)]
    return nn.Sequential(*[FusedParallelBlock(b) if fused else b for b in blocks])


def timer(model: nn.Module, x: torch.Tensor, backward: bool):
    def run():
        if backward:
            model(x).square().mean().backward()
        else:
            with torch.no_grad():
                model(x)

    run()  # warm-up

    def timed():
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    return timed


def compare(first, second, *, repeats: int) -> dict:
    """Per-repeat speed ratio time(second)/time(first): > 1 means ``first`` is faster."""
    ratios = []
    for _ in range(repeats):
        ratios.append(second() / first())
    return {
        "median": round(statistics.median(ratios), 3),
        "min": round(min(ratios), 3),
        "max": round(max(ratios), 3),
    }


PAIRS = {
    "parallel_vs_sequential": ({}, {"parallel": False}, False),
    "biasfree_vs_biased": ({}, {"qkv_bias": True, "ln_bias": True, "norm": "layer"}, False),
    "fused_vs_separate": ({}, {}, True),
}


def single_process(widths, *, depth: int, batch: int, repeats: int) -> dict:
    out = {}
    for width in widths:
        size = {384: "s", 768: "b", 1024: "l"}[width]
        x = torch.randn(batch, 256, width)
        for name, (a, b, fused) in PAIRS.items():
            for backward in (False, True):
                model_a = stack(config(size, **a), depth, fused=fused)
                model_b = stack(config(size, **b), depth)
                key = f"{name}/w{width}/{'fwd+bwd' if backward else 'fwd'}"
                out[key] = compare(
                    timer(model_a, x, backward), timer(model_b, x, backward), repeats=repeats
                )
                print(key, out[key], flush=True)
    return out


def tensor_parallel(*, width: int, depth: int, batch: int, repeats: int) -> dict:
    """Runs tp_timing.py on 2 ranks (1 thread each) and on 1 rank (1 and 2 threads)."""
    script = Path(__file__).with_name("tp_timing.py")
    runs = {"tp2": (2, "1"), "tp1_1thread": (1, "1"), "tp1_2threads": (1, "2")}
    times = {}
    for name, (ranks, threads) in runs.items():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script)]
            cmd += [f.name, str(width), str(depth), str(batch), str(repeats)]
            env = {**os.environ, "OMP_NUM_THREADS": threads}
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            times[name] = json.loads(Path(f.name).read_text())
    tp2 = times["tp2"]
    return {
        "tp2_parallel_vs_sequential": round(tp2["sequential"] / tp2["parallel"], 3),
        "tp2_allreduces_per_block": tp2["allreduces_per_block"],
        "tp2_vs_1rank_1thread": round(times["tp1_1thread"]["parallel"] / tp2["parallel"], 3),
        "tp2_vs_1rank_2threads": round(times["tp1_2threads"]["parallel"] / tp2["parallel"], 3),
        "seconds": times,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", default="384,768")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    record = {
        "threads": torch.get_num_threads(),
        "tokens": 256,
        "batch": args.batch,
        "depth": args.depth,
        "single_process": single_process(
            widths, depth=args.depth, batch=args.batch, repeats=args.repeats
        ),
        "tensor_parallel": tensor_parallel(
            width=768, depth=args.depth, batch=args.batch, repeats=args.repeats
        ),
    }
    report("vit22b_blocks", record)


if __name__ == "__main__":
    main()
