"""Training on a split larger than memory: batches shuffled across the cache's shards are a
pure function of (seed, step) and read at most two windows of shards; LiT's text tower and the
video head give the same losses and metrics streamed as resident; the planner sizes the streamed
stages and checks a named target per rank and per host."""

from __future__ import annotations

import pytest
import torch

import evalkit
from evalkit.heads.train import ShardedOrder


def _order(seed=0, batch=48, window=None):
    starts = torch.arange(0, 1000, 100)  # ten shards of 100 rows
    keep = torch.ones(1000, dtype=torch.bool)
    keep[::7] = False  # unreadable rows are never drawn
    order = ShardedOrder.of(starts, keep, batch, seed)
    return order if window is None else ShardedOrder(order.shards, batch, seed, window)


def test_sharded_order_is_a_function_of_seed_and_step():
    a, b = _order(), _order()
    assert all(torch.equal(a.batch(s), b.batch(s)) for s in (5, 0, 40, 3))  # any order of asks
    assert not torch.equal(_order(seed=1).batch(0), a.batch(0))
    epoch = a.epoch(0)
    kept = torch.arange(1000)[torch.arange(1000) % 7 != 0]
    assert torch.equal(epoch.sort().values, kept)  # each epoch draws every kept row once
    steps = a.rows // a.batch_size
    assert torch.equal(torch.cat([a.batch(s) for s in range(steps)]), epoch[: steps * 48])


def test_a_batch_reads_at_most_two_windows_of_shards():
    order = _order(window=2)
    for step in range(60):
        shards = (order.batch(step) // 100).unique()
        assert len(shards) <= 2 * order.window


def run(task, tmp_path, **settings):
    overrides = [f"{k}={v}" for k, v in settings.items()]
    rows = evalkit.run(
        task,
        "fake",
        data="embedded",
        out=tmp_path / str(settings),
        cache_dir=tmp_path / "cache",
        overrides=overrides,
        progress=False,
    )
    return {r["metric"]: r for r in rows}


@pytest.mark.parametrize(
    ("task", "loss"),
    [
        pytest.param("lit-imagenet", "lit_final_loss", marks=pytest.mark.long),
        ("kinetics400", "final_loss"),
    ],
)
def test_streamed_training_equals_resident(tmp_path, data_cache, monkeypatch, task, loss):
    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    resident = run(task, tmp_path, steps=20)
    streamed = run(task, tmp_path, steps=20, resident_gb=0)
    if task == "lit-imagenet":
        assert (resident["top1"]["extra"]["lit_mode"], streamed["top1"]["extra"]["lit_mode"]) == (
            "resident",
            "streamed",
        )
    for metric, row in resident.items():
        assert row["extra"][loss] == pytest.approx(streamed[metric]["extra"][loss], rel=1e-6)
        assert row["value"] == streamed[metric]["value"]


def test_the_planner_streams_lit_and_checks_a_target_per_rank_and_host(capsys):
    from evalkit.cli import main

    args = ["plan", "--task", "lit-imagenet", "--backbone", "vit22b", "--dtype", "bf16"]
    assert main([*args, "--target", "8xH100-80GB", "--tp", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "LiT text tower │ streamed" in out or "streamed" in out
    assert "fits 8xH100-80GB" in out and "8 on 1 host(s)" in out
    assert main([*args, "--tp", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "for a host's 8 ranks" in out and "does not fit this machine" in out
    assert main([*args, "--target", "gpus=8,gpu_gb=80,host_gb=512", "--tp", "16"]) == 0
    assert "16 on 2 host(s)" in " ".join(capsys.readouterr().out.split())
    assert main([*args, "--target", "gpus=8"]) == 2


def test_reproduce_paper_dry_run_places_every_row_on_a_target(tmp_path, capsys):
    from evalkit.cli import main

    args = ["reproduce", "--scale", "paper", "--dry-run", "--out", str(tmp_path)]
    assert main([*args, "--target", "8xH100-80GB"]) == 0
    table = (tmp_path / "compute-paper").with_suffix(".md").read_text()
    placed = [
        line
        for line in table.split("## On 8xH100-80GB")[1].splitlines()
        if line.startswith("| ") and line[2].isdigit()
    ]
    assert [int(line.split("|")[1]) for line in placed] == list(range(1, 13))
    assert "| 5 | 1 × 1 |" in table  # the linear probe of ViT-22B: one GPU of a node
    runnable = {int(line.split("|")[1]): line.split("|")[4].strip() for line in placed}
    assert runnable[5] == runnable[6] == runnable[10] == "yes"  # LiT and video stream
    assert all(v == "yes" for v in runnable.values()), runnable  # every row has a path
    assert runnable[7] == runnable[8] == "yes"  # ViT-22B fine-tuned under torchrun, 8 GPUs
    assert "| 7 | 8 × 1 |" in table
