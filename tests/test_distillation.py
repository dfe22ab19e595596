"""Distillation: the loss by hand, mixup, the two modes end to end on the stand-in with rows
for teacher, distilled and label-only students."""

from __future__ import annotations

import math

import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.seeds import generator


def student(kind="distilled", **settings):
    from evalkit.tasks.distillation import Distillation, Student

    task = Distillation(**settings)
    teacher = type("Teacher", (), {"classes": ["a", "b"]})()
    return Student(task, kind, teacher, None, ((0.5,) * 3, (0.5,) * 3))


def test_distillation_loss_by_hand():
    logits = torch.tensor([[1.0, 0.0]])
    soft = torch.tensor([[0.25, 0.75]])
    targets = torch.cat([torch.tensor([[1.0, 0.0]]), soft], 1)
    t = 2.0
    s = torch.softmax(logits / t, 1)[0]
    kl = 0.25 * math.log(0.25 / s[0]) + 0.75 * math.log(0.75 / s[1])
    hard = -math.log(torch.softmax(logits, 1)[0, 0])
    loss = student(temperature=t, label_weight=0.5).loss(logits, targets)
    assert loss.item() == pytest.approx(t**2 * kl + 0.5 * hard, rel=1e-5)
    only_labels = student("label_only").loss(logits, targets)
    assert only_labels.item() == pytest.approx(hard, rel=1e-5)


def test_mixup_keeps_the_larger_share_and_mixes_labels_alike():
    images = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 2, 2)
    mixed, lam = student().mix(images, generator(0, "mixup", 7, 0))
    assert 0.5 <= lam <= 1
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.roll(1, 0))
    pairs = torch.tensor([[0, 0], [1, 1], [0, 2], [1, 3]])
    labels = student("label_only").targets(mixed, pairs, lam)[:, :2]
    assert torch.allclose(labels[1], torch.tensor([1 - lam, lam]))
    unmixed, one = student(mode="cached").mix(images, generator(0, "mixup", 7, 0))
    assert one == 1.0 and torch.equal(unmixed, images)


@pytest.mark.parametrize("mode", ["consistent", "cached"])
def test_distillation_runs_both_students_against_one_teacher(fake, ctx, mode):
    from evalkit.core.runner import resolve_task

    task = resolve_task(
        "distill-imagenet",
        [
            f"mode={mode}",
            "steps=4",
            "batch_size=8",
            "student=test",
            "warmup=1",
            "l2_grid=1e-2,1e-3",
            "max_iter=20",
        ],
    )
    rows = {m.metric: m for m in task.run(fake, ctx)}
    assert set(rows) == set(task.metrics())
    assert rows["gain"].value == pytest.approx(
        rows["top1/distilled"].value - rows["top1/label_only"].value
    )
    assert rows["top1/teacher"].value > 100 / 24  # the probe on the fake backbone learns
    assert rows["gain"].extra["mode"] == mode and rows["gain"].extra["mixup"] == (
        mode == "consistent"
    )
    if mode == "cached":
        again = {m.metric: m.value for m in task.run(fake, ctx)}
        assert again == {k: m.value for k, m in rows.items()}  # seeded


def test_distillation_settings_are_checked():
    from evalkit.core.runner import resolve_task

    with pytest.raises(EvalkitError, match="mode=soft"):
        resolve_task("distill-imagenet", ["mode=soft"])
    with pytest.raises(EvalkitError, match="student=xl"):
        resolve_task("distill-imagenet", ["student=xl"])
    with pytest.raises(EvalkitError, match="batch_size=7"):
        resolve_task("distill-imagenet", ["batch_size=7"])
