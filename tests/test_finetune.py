"""Fine-tuning mode: layer-wise learning-rate decay by hand, the classification and ADE20k
tasks end to end (rows, the caller's backbone untouched, resumable state), tables that set
fine-tuned paper numbers beside fine-tuned runs, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.training.finetune import decayed_groups, layer_of


def test_layer_of_names_across_families():
    assert layer_of("patch_embed.weight", 12) == 0  # vit22b and timm
    assert layer_of("pos_embed", 12) == 0
    assert layer_of("cls_token", 12) == 0
    assert layer_of("blocks.0.attn.q.weight", 12) == 1
    assert layer_of("blocks.11.mlp.fc2.weight", 12) == 12
    assert layer_of("transformer.resblocks.3.ln_1.weight", 12) == 4  # open_clip
    assert layer_of("conv1.weight", 12) == 0
    assert layer_of("norm.weight", 12) == 13
    assert layer_of("head.probe", 12) == 13


def test_decayed_groups_by_hand():
    from evalkit.models.vit22b import build, config

    tower = build(config("test"), seed=0)  # 4 blocks
    head = torch.nn.Linear(64, 3)
    groups = decayed_groups(tower, head, depth=4, decay=0.5)
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    decayed = {id(p): g["decayed"] for g in groups for p in g["params"]}
    assert scale_of[id(tower.patch_embed.weight)] == 0.5**5
    assert scale_of[id(tower.blocks[0].attn.q.weight)] == 0.5**4
    assert scale_of[id(tower.blocks[3].attn.q.weight)] == 0.5**1
    assert scale_of[id(head.weight)] == 1.0
    assert decayed[id(head.weight)] and not decayed[id(head.bias)]
    assert not decayed[id(tower.pos_embed)]  # a 3-d tensor, yet not decayed
    assert sum(len(g["params"]) for g in groups) == len(list(tower.parameters())) + 2


def test_finetuned_classification_row_and_untouched_backbone(ctx):
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    backbone = load_backbone("vit22b/test")
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    task = resolve_task(
        "imagenet-linear",
        ["finetune=true", "finetune_steps=4", "finetune_batch_size=8", "finetune_resolution=32"],
    )
    metrics = {m.metric: m for m in task.run(backbone, ctx)}
    extra = metrics["top1"].extra
    assert extra["finetuned"] is True and extra["resolution"] == 32
    assert extra["finetune_steps"] == 4 and extra["num_classes"] == 24
    assert 0 <= metrics["top1"].value <= metrics["top5"].value <= 100
    after = backbone.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # a copy was trained
    assert not any(p.requires_grad for p in backbone.model.parameters())
    state = list((ctx.extract.cache_dir / "finetune").glob("*/latest.json"))
    assert len(state) == 1 and json.loads(state[0].read_text())["step"] == 4
    assert task.reference == {}  # the paper's ImageNet numbers are frozen probes


def test_finetuned_classification_resumes_to_the_same_numbers(ctx):
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    backbone = load_backbone("vit22b/test")
    task = resolve_task(
        "imagenet-linear",
        ["finetune=true", "finetune_steps=4", "finetune_batch_size=8", "finetune_resolution=32"],
    )
    first = [m.value for m in task.run(backbone, ctx)]
    again = [m.value for m in task.run(backbone, ctx)]  # restored from the finished state
    assert first == again


@pytest.fixture()
def small_scenes(monkeypatch):
    monkeypatch.setenv("EVALKIT_EMBEDDED_SCENES", "24,6")


def test_finetuned_ade20k_end_to_end_and_table(cli_env, small_scenes, capsys):
    from evalkit.cli import main

    common = [
        "--backbone",
        "vit22b/test",
        "--data",
        "embedded",
        "--quiet",
        "--set",
        "image_size=64",
    ]
    assert (
        main(
            [
                "run",
                "--task",
                "ade20k-1/16",
                *common,
                "--set",
                "finetune=true",
                "--set",
                "finetune_steps=3",
                "--set",
                "finetune_batch_size=2",
            ]
        )
        == 0
    )
    assert main(["run", "--task", "ade20k-1/16", *common, "--set", "steps=3"]) == 0
    rows = [json.loads(line) for line in (cli_env / "results/runs/ade20k-1_16.jsonl").open()]
    tuned = [r for r in rows if r["config"]["finetune"]]
    assert len(tuned) == 2 and tuned[0]["extra"]["finetuned"] is True
    assert tuned[0]["extra"]["train_images"] == 2  # ⌈24 / 16⌉
    assert "ade20k" in tuned[0]["data_id"]
    capsys.readouterr()
    assert main(["table", "results/runs"]) == 0
    table = capsys.readouterr().out
    assert "ade20k-1/16 (fine-tuned) (stand-in) miou" in table
    assert "ade20k-1/16 (stand-in) miou" in table
    assert "paper: ViT-22B" not in table  # a stand-in column carries no paper number
    real = Path("real")  # the same rows as if measured on the real set
    real.mkdir()
    for rows in Path("results/runs").glob("*.jsonl"):
        lines = [json.loads(line) for line in rows.read_text().splitlines()]
        for row in lines:
            row["dataset"] = {**row["dataset"], "stand_in": False}
        (real / rows.name).write_text("".join(json.dumps(row) + "\n" for row in lines))
    assert main(["table", "real"]) == 0
    table = capsys.readouterr().out
    assert "paper: ViT-22B" in table and "44.70" in table  # the fine-tuned 1/16 number


def test_finetune_refuses_a_resolution_the_backbone_cannot_take(ctx):
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    backbone = load_backbone("timm/vit_tiny_patch16_224")
    task = resolve_task("imagenet-linear", ["finetune=true", "finetune_resolution=64"])
    with pytest.raises(EvalkitError, match="cannot run at 64 px.*dynamic_img_size"):
        list(task.run(backbone, ctx))


def test_finetune_settings_are_validated():
    from evalkit.core.runner import resolve_task

    with pytest.raises(EvalkitError, match="layer_decay=1.5 is out of range"):
        resolve_task("ade20k-1/16", ["layer_decay=1.5"])
    with pytest.raises(EvalkitError, match="finetune_steps=0"):
        resolve_task("imagenet-linear", ["finetune_steps=0"])
