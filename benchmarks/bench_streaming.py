"""Peak RSS of training on a cached split that is streamed, for a small and an 8× larger split:
LiT's text tower on 10k vs 80k caption pairs, and the video head on 1k vs 8k clips. Each size
runs in a fresh process on feature shards written like the cache's (safetensors, 1,024 rows),
with the task's own order and reader (``evalkit.heads.train``) and ``resident_gb=0`` behaviour.

Target: the larger split's peak RSS within 10% of the smaller's (the baseline, same run).
Run: ``python -m benchmarks.bench_streaming``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.common import peak_rss_mb, report

SHARD = 1024
DIM = 768  # a ViT-B's embeddings
STEPS = 30


def write_shards(folder: Path, rows: int, frames: int) -> list[Path]:
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    paths = []
    for start in range(0, rows, SHARD):
        n = min(SHARD, rows - start)
        shape = (n, frames, DIM) if frames else (n, DIM)
        pooled = torch.randn(shape, generator=generator).bfloat16()
        path = folder / f"shard-{start // SHARD:05d}.safetensors"
        save_file({"pooled": pooled, "labels": torch.randint(0, 400, (n,))}, str(path))
        paths.append(path)
    return paths


def lit_steps(feats) -> None:
    from evalkit.heads.text import LitModel, TowerConfig, tokenizer
    from evalkit.heads.train import ShardedOrder, ShardReader

    order = ShardedOrder.of(feats.starts, torch.ones(len(feats), dtype=torch.bool), 256, 0)
    reader = ShardReader(feats, 2 * order.window, resident=False)
    model = LitModel(TowerConfig(layers=2, embed_dim=DIM, image_head=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    words = tokenizer(16)
    for step in range(STEPS):
        batch = order.batch(step)
        texts = [f"a photo of thing {i}" for i in batch.tolist()]
        loss = model.loss(reader.take(batch), words(texts))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def video_steps(feats) -> None:
    from evalkit.heads.temporal import HeadConfig, build_head
    from evalkit.heads.train import ShardedOrder, ShardReader

    order = ShardedOrder.of(feats.starts, torch.ones(len(feats), dtype=torch.bool), 64, 0)
    reader = ShardReader(feats, 2 * order.window, resident=False)
    head = build_head(HeadConfig("temporal", 0, 2), DIM, 400, frames=8)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    for step in range(STEPS):
        batch = order.batch(step)
        loss = torch.nn.functional.cross_entropy(head(reader.take(batch)), feats.labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def child(kind: str, folder: str) -> dict:
    from evalkit.cache.feature_set import FeatureSet

    feats = FeatureSet(sorted(Path(folder).glob("shard-*.safetensors")), from_cache=True)
    (lit_steps if kind == "lit" else video_steps)(feats)
    return {"peak_rss_mb": peak_rss_mb()}


def measure(kind: str, rows: int) -> dict:
    """The peak RSS of a fresh process training on ``rows`` rows written here beforehand."""
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(Path(tmp), rows, frames=8 if kind == "video" else 0)
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_streaming", "--child", kind, tmp],
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.splitlines()[-1])


def main():
    record = {}
    for kind, small, large in (("lit", 10_000, 80_000), ("video", 1_000, 8_000)):
        base, big = measure(kind, small), measure(kind, large)
        record[kind] = {
            f"peak_rss_mb_{small}": round(base["peak_rss_mb"]),
            f"peak_rss_mb_{large}": round(big["peak_rss_mb"]),
            "ratio": round(big["peak_rss_mb"] / base["peak_rss_mb"], 3),
            "target": "≤ 1.10",
        }
    report("bench_streaming", record)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        main()
