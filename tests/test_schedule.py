"""The one schedule: built in one place from the fields a task declares (``declared_schedule``),
the dense heads' one warm-up whichever trainer runs them, and the head trainer refusing by name
what it does not do rather than training without it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from evalkit.core.catalog import TASKS, resolve_task
from evalkit.errors import EvalkitError
from evalkit.heads.train import train
from evalkit.schedule import Schedule, declared_schedule, head_warmup


@dataclass
class Declares:
    steps: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 4
    finetune_steps: int = 12
    finetune_lr: float = 1e-4
    finetune_accumulate: int = 2
    shots: int = 5  # not a schedule field: never read


def test_a_task_schedule_takes_every_field_it_declares_and_nothing_it_does_not():
    schedule = declared_schedule(Declares(), 7, b2=0.999)
    assert schedule == Schedule(steps=40, batch_size=8, lr=3e-3, warmup=4, b2=0.999, seed=7)


def test_the_recipe_overrides_a_declared_field_and_a_prefix_names_another_set():
    assert declared_schedule(Declares(), 0, batch_size=2).batch_size == 2
    tuned = declared_schedule(Declares(), 1, prefix="finetune_")
    assert (tuned.steps, tuned.lr, tuned.accumulate, tuned.batch_size) == (12, 1e-4, 2, 32)


def test_every_built_in_task_with_a_schedule_declares_fields_of_the_right_type():
    kinds = {"steps": int, "batch_size": int, "lr": float, "warmup": int, "weight_decay": float}
    for entry in TASKS.entries():
        task = resolve_task(entry.name)
        for name, kind in kinds.items():
            if hasattr(task, name):
                assert isinstance(getattr(task, name), kind | int), (entry.name, name)


def test_the_dense_heads_warm_up_is_one_rule():
    assert [head_warmup(s) for s in (3, 9, 10, 300, 2000)] == [0, 0, 1, 30, 50]
    no_warm_up = Schedule(steps=4, warmup=head_warmup(4))
    assert [round(no_warm_up.factor(k), 3) for k in range(4)] == [1.0, 0.854, 0.5, 0.146]


def test_both_modes_of_a_dense_head_train_on_one_schedule(monkeypatch):
    from evalkit.protocols import grids

    task = resolve_task("ade20k-1/16")
    assert isinstance(task, grids.DenseSettings)
    seen = []
    monkeypatch.setattr(grids, "train", lambda head, loss, n, cfg, **_: seen.append(cfg))

    class Ctx:
        seed, device = 3, "cpu"

        class extract:
            progress = False

    task.train_head(torch.nn.Linear(1, 1), None, 10, Ctx)
    assert seen == [task.head_schedule(3)]


@pytest.mark.parametrize(
    "field, value",
    [("optimizer", "adafactor"), ("independent_wd", True), ("z_loss", 1e-4), ("accumulate", 2)],
)
def test_the_head_trainer_refuses_what_it_does_not_do(field, value):
    head = torch.nn.Linear(2, 2)
    schedule = Schedule(steps=2, batch_size=2, **{field: value})
    with pytest.raises(EvalkitError) as refused:
        train(head, lambda i: head(torch.ones(len(i), 2)).sum(), 4, schedule)
    assert str(refused.value).startswith(f"the head trainer does not do {field}={value!r}")


def test_the_head_trainer_runs_a_schedule_it_honours():
    head = torch.nn.Linear(2, 2)
    losses = train(head, lambda i: head(torch.ones(len(i), 2)).pow(2).sum(), 4, Schedule(steps=3))
    assert len(losses) == 3 and losses[-1] < losses[0]
