"""The backbone trainer: a SIGKILLed run resumes to the same final loss, a diverging run stops
with a clear error and keeps its last good checkpoint, a damaged checkpoint is refused by name;
attention statistics read from outside the model; the QK-norm stability task end to end."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.schedule import Schedule
from evalkit.training.loop import Diverged, fit

SCRIPT = Path(__file__).with_name("train_resume_script.py")


def test_a_killed_run_resumes_to_the_same_final_loss(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from train_resume_script import SCHEDULE, model_and_batches

    model, batch = model_and_batches()
    uninterrupted = fit(model, batch, torch.nn.functional.cross_entropy, SCHEDULE)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out), "0.05"], env=env)
    deadline = time.time() + 120
    while (
        not (out / "latest.json").exists()
        or json.loads((out / "latest.json").read_text())["step"] < 10
    ):
        assert time.time() < deadline and proc.poll() is None, "no checkpoint was written"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "final.json").exists()
    subprocess.run([sys.executable, str(SCRIPT), str(out), "0"], env=env, check=True, timeout=300)
    resumed = json.loads((out / "final.json").read_text())
    assert len(resumed) == SCHEDULE.steps
    assert resumed[-1]["loss"] == pytest.approx(uninterrupted[-1]["loss"], rel=1e-6)


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    model = torch.nn.Linear(4, 2)
    x = torch.randn(8, 4)

    def batch(step, micro):
        return (x * (math.inf if step == 7 else 1.0)), torch.zeros(8, dtype=torch.long)

    schedule = Schedule(steps=20, batch_size=8, checkpoint_every=5, warmup=1)
    with pytest.raises(Diverged, match="step 7"):
        fit(model, batch, torch.nn.functional.cross_entropy, schedule, out=tmp_path)
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 5


def test_a_damaged_checkpoint_is_refused_by_name(tmp_path):
    model = torch.nn.Linear(4, 2)

    def batch(step, micro):
        return torch.randn(8, 4), torch.zeros(8, dtype=torch.long)

    schedule = Schedule(steps=6, batch_size=8, checkpoint_every=5, warmup=1)
    fit(model, batch, torch.nn.functional.cross_entropy, schedule, out=tmp_path)
    latest = json.loads((tmp_path / "latest.json").read_text())["checkpoint"]
    assert latest == "checkpoint-0000006"  # the end of the run is kept too
    (tmp_path / latest / "trainer.pt").write_bytes(b"damaged")
    with pytest.raises(EvalkitError, match=latest):
        fit(torch.nn.Linear(4, 2), batch, torch.nn.functional.cross_entropy, schedule, out=tmp_path)
    with pytest.raises(EvalkitError, match="shape"):
        fit(torch.nn.Linear(4, 3), batch, torch.nn.functional.cross_entropy, schedule, out=tmp_path)


def test_attention_statistics_equal_a_direct_computation():
    from evalkit.models.vit22b import build, config
    from evalkit.training.probes import AttentionStats

    model = build(config("test", qk_norm=False, image=28), seed=0)
    stats = AttentionStats(model)
    images = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        model(images)
        read = stats.read()
        block = model.blocks[0]
        h = block.norm1(model.embed(images))
        q = block.attn.q(h).unflatten(-1, (-1, block.attn.head_dim)).transpose(1, 2)
        k = block.attn.k(h).unflatten(-1, (-1, block.attn.head_dim)).transpose(1, 2)
        logits = q @ k.transpose(-2, -1) / math.sqrt(block.attn.head_dim)
    assert len(read["max_attention_logit"]) == 4
    assert read["max_attention_logit"][0] == pytest.approx(logits.max().item(), rel=1e-5)
    p = logits.softmax(-1)
    assert read["attention_entropy"][0] == pytest.approx(
        -(p * p.log()).sum(-1).mean().item(), rel=1e-5
    )
    stats.close()


def test_qk_norm_stability_task_reports_every_run(fake, ctx, tmp_path):
    from evalkit.tasks.stability import QKNormStability

    ctx.artifacts = tmp_path / "pictures"
    task = QKNormStability(lrs=(1e-3, 1.0), steps=12, warmup=2, batch_size=16)
    rows = {m.metric: m for m in task.run(fake, ctx)}
    picture = Path(rows["lr_sensitivity/qk_norm"].extra["picture"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(rows) == set(task.metrics())
    for variant in ("qk_norm", "no_qk_norm"):  # the definition: mean over LRs of min(final,
        # initial) − the best of them, from the rows' own final losses
        finals = rows[f"lr_sensitivity/{variant}"].extra["final_loss_by_lr"]
        assert set(finals) == {"0.001", "1"}
        expected = sum(finals.values()) / 2 - min(finals.values())
        assert rows[f"lr_sensitivity/{variant}"].value == pytest.approx(expected)
        for lr, final in finals.items():
            assert final == pytest.approx(min(rows[f"final_loss/{variant}/lr={lr}"].value, final))
    row = rows["max_attention_logit/no_qk_norm/lr=1"]
    curve = row.extra["max_logit_curve"]
    assert curve and not any(math.isnan(v) for v in curve) and min(curve) > 0
    assert curve[0] == row.extra["first_max_logit"] and row.value >= 0


def test_pretrain_ladder_writes_checkpoints_that_weights_loads(cli_env, capsys):
    from evalkit.backbones import load_backbone
    from evalkit.backbones.options import BackboneOptions
    from evalkit.cli import main

    args = [
        "pretrain",
        "--ladder",
        "test",
        "--data",
        "embedded",
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--warmup",
        "2",
        "--checkpoint-every",
        "4",
        "--out",
        "ckpt",
        "--quiet",
    ]
    assert main(args) == 0
    weights = cli_env / "ckpt" / "test" / "model.safetensors"
    summary = json.loads((cli_env / "ckpt" / "ladder.json").read_text())[0]
    assert summary["loss"] == "sigmoid" and summary["steps"] == 6
    backbone = load_backbone("vit22b/test", BackboneOptions(weights=str(weights)))
    assert backbone.info.preprocess.size == 32 and backbone.info.patch_size == 8
    provenance = (cli_env / "ckpt" / "test" / "provenance.json").read_text()
    assert main(args) == 0  # a finished size is not trained again; its provenance stays
    assert (cli_env / "ckpt" / "test" / "provenance.json").read_text() == provenance
    assert json.loads((cli_env / "ckpt" / "test" / "run" / "latest.json").read_text())["step"] == 6
    assert main([*args[:2], "test,xl", *args[3:]]) == 2
    assert "unknown ladder size 'xl'" in capsys.readouterr().err
    again = [*args[:-3], "--out", "again", "--quiet"]
    assert main(again) == 0  # a fresh run with the same seed: the same weights, bit for bit
    assert (cli_env / "again/test/model.safetensors").read_bytes() == weights.read_bytes()


def test_the_committed_regression_backbone_loads():
    from evalkit.backbones import load_backbone
    from evalkit.backbones.options import BackboneOptions

    path = Path(__file__).parent / "regression" / "vit22b-test.safetensors"
    assert path.stat().st_size < 5 * 2**20
    backbone = load_backbone("vit22b/test", BackboneOptions(weights=str(path)))
    assert backbone.info.preprocess.size == 32 and not backbone.info.random_init


@pytest.mark.parametrize("switch", ["parallel", "biases"])
def test_efficiency_ablation_times_both_variants_interleaved(fake, ctx, switch, tmp_path):
    from evalkit.tasks.efficiency import EfficiencyAblation

    ctx.artifacts = tmp_path / "pictures"

    task = EfficiencyAblation(
        switch=switch, size="test", image=32, rounds=2, timed_steps=2, steps=6, warmup=1
    )
    rows = {m.metric: m for m in task.run(fake, ctx)}
    assert set(rows) == set(task.metrics())
    first, second = [
        name.split("/")[1] for name in task.metrics() if name.startswith("images_per_s")
    ]
    per_round = {v: rows[f"images_per_s/{v}"].extra["per_round"] for v in (first, second)}
    assert len(per_round[first]) == 2
    # the median (here the mean) of the two rounds' ratios, and their spread
    ratios = [a / b for a, b in zip(per_round[first], per_round[second], strict=True)]
    assert rows["speedup"].value == pytest.approx(sum(ratios) / 2)
    assert rows["speedup"].std == pytest.approx(abs(ratios[0] - ratios[1]) / 2**0.5)
    assert rows["speedup"].stderr == pytest.approx(rows["speedup"].std / 2**0.5)
    assert Path(rows["speedup"].extra["picture"]).read_bytes()[:4] == b"\x89PNG"
    assert rows[f"images_per_s/{first}"].extra["mfu_note"] == "not measured (no GPU)"
    if switch == "biases":  # "without" is first: the biased model has more parameters
        sizes = [
            sum(p.numel() for p in task.model(name, 3, 0).parameters())
            for name in ("without", "with")
        ]
        assert sizes[0] < sizes[1]


def test_ablations_run_without_a_backbone_and_other_tasks_ask_for_one(cli_env, capsys):
    from evalkit.cli import main
    from evalkit.core.results import load_rows

    small = ["--set", "lrs=1e-3", "--set", "steps=4", "--set", "warmup=1", "--set", "batch_size=8"]
    assert (
        main(
            [
                "run",
                "--task",
                "qk-norm-stability",
                "--data",
                "embedded",
                "--quiet",
                "--out",
                "rows",
                *small,
            ]
        )
        == 0
    )
    rows = load_rows([cli_env / "rows" / "qk-norm-stability.jsonl"])
    assert {r["backbone"] for r in rows} == {"none"} and len(rows) == 6
    assert "random weights" not in capsys.readouterr().err
    assert main(["run", "--task", "imagenet-linear", "--data", "embedded", "--quiet"]) == 2
    assert "needs a backbone" in capsys.readouterr().err


@pytest.mark.long
def test_qk_norm_lr_compares_kept_and_lowered_learning_rates(fake, ctx, tmp_path):
    from evalkit.tasks.stability import QKNormLR

    ctx.artifacts = tmp_path / "pictures"
    task = QKNormLR(sizes=("test", "ti"), steps=4, warmup=1, batch_size=8)
    rows = {m.metric: m for m in task.run(fake, ctx)}
    assert set(rows) == set(task.metrics())
    assert rows["final_loss/lowered/ti"].extra["lr"] == pytest.approx(1e-3 * 64 / 192)
    assert rows["final_loss/kept/ti"].extra["lr"] == 1e-3
    gain = rows["final_loss/lowered/ti"].value - rows["final_loss/kept/ti"].value
    assert rows["gain/ti"].value == pytest.approx(gain)
    assert "not confirmed" in rows["gain/test"].extra["note"]
    assert Path(rows["gain/ti"].extra["picture"]).read_bytes()[:4] == b"\x89PNG"


def test_model_flops_utilisation_by_hand(ctx):
    from evalkit.parallel.sizing import forward_flops
    from evalkit.tasks.efficiency import EfficiencyAblation

    task = EfficiencyAblation(size="test", image=32, peak_tflops=2.0)
    utilisation = task.utilisation("parallel", 1000.0, ctx)
    flops = 3 * forward_flops(task.model_config("parallel"))
    assert utilisation["mfu"] == pytest.approx(1000.0 * flops / 2e12)
