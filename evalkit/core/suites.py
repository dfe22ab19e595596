"""Suites: named sets of tasks with their settings, usable wherever a task is (``--task
suite:classification``), listed by ``evalkit ls suites``.

An entry is a task name with optional settings in brackets (``imagenet-linear[eval_split=
imagenet-r]``), as ``--task`` takes them too. The built-in suites follow the paper's
downstream evaluations (docs/tasks.md, "Suites"); a TOML file named by ``$EVALKIT_SUITES``
adds suites of the user's (or replaces a built-in one of the same name)::

    [suites.mine]
    about = "what this suite is for"
    tasks = ["imagenet-knn", "imagenet-linear[eval_split=imagenet-r]"]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tomllib

from evalkit.errors import EvalkitError, did_you_mean

PREFIX = "suite:"
USER_SUITES = "EVALKIT_SUITES"
OOD_SETS = ("imagenet-v2", "imagenet-r", "imagenet-a", "imagenet-real", "objectnet")


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    tasks: tuple[str, ...]
    source: str = "built-in"


BUILT_IN = (
    Suite(
        "paper",
        "the paper's downstream evaluations at their protocols: linear probe, few-shot, LiT "
        "zero-shot, ADE20k 1/16, Waymo depth (DPT and linear), Kinetics-400, calibration, "
        "distillation, shape bias and human alignment (model-vs-human), CelebA fairness",
        (
            "imagenet-linear",
            "imagenet-10shot",
            "lit-objectnet",
            "ade20k-1/16",
            "waymo-depth-dpt",
            "waymo-depth-linear",
            "kinetics400",
            "imagenet-ece",
            "distill-imagenet",
            "model-vs-human",
            "celeba-fairness-smiling",
            "celeba-fairness-attractive",
        ),
    ),
    Suite(
        "classification",
        "linear probe, few-shot (1/5/10/25), kNN, and zero-shot for backbones with a text tower",
        (
            "imagenet-linear",
            "imagenet-1shot",
            "imagenet-5shot",
            "imagenet-10shot",
            "imagenet-25shot",
            "imagenet-knn",
            "zeroshot-imagenet",
        ),
    ),
    Suite(
        "dense",
        "frozen-feature segmentation and depth: ADE20k 1/16 and 1/1, Waymo, NYU and KITTI depth",
        (
            "ade20k-1/16",
            "ade20k-1/1",
            "waymo-depth-dpt",
            "waymo-depth-linear",
            "nyu-depth-linear",
            "kitti-depth-linear",
        ),
    ),
    Suite(
        "robustness",
        "the ImageNet probe scored on the OOD sets (v2, R, A, ReaL, ObjectNet), and calibration "
        "on ImageNet and ImageNet-C",
        (
            *(f"imagenet-linear[eval_split={name}]" for name in OOD_SETS),
            "imagenet-ece",
            "imagenet-c-ece",
        ),
    ),
)


def all_suites() -> dict[str, Suite]:
    """The built-in suites, and the user's from ``$EVALKIT_SUITES`` (a user suite of a built-in
    suite's name replaces it)."""
    suites = {suite.name: suite for suite in BUILT_IN}
    path = os.environ.get(USER_SUITES)
    if path:
        suites |= {suite.name: suite for suite in read_suites(Path(path))}
    return suites


def read_suites(path: Path) -> list[Suite]:
    """The suites of a TOML file: ``[suites.<name>]`` tables with ``tasks`` (and ``about``)."""
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8")).get("suites", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EvalkitError(f"${USER_SUITES}={path}: cannot read it as TOML ({exc})") from None
    suites = []
    for name, table in tables.items():
        tasks = table.get("tasks") if isinstance(table, dict) else None
        if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
            raise EvalkitError(
                f'{path}: suite {name!r} needs tasks = ["task", ...] (a non-empty list of names)'
            )
        suites.append(Suite(name, str(table.get("about", "")), tuple(tasks), str(path)))
    return suites


def expand(names) -> tuple[str, ...]:
    """Task names with every ``suite:<name>`` replaced by its tasks, in order, each once."""
    expanded = []
    for name in names:
        for task in suite_tasks(name) if name.startswith(PREFIX) else (name,):
            if task not in expanded:
                expanded.append(task)
    return tuple(expanded)


def suite_tasks(name: str) -> tuple[str, ...]:
    suites = all_suites()
    wanted = name.removeprefix(PREFIX)
    if wanted not in suites:
        hint = did_you_mean(wanted, list(suites), "evalkit ls suites")
        raise EvalkitError(f"unknown suite {wanted!r}: {hint}")
    return suites[wanted].tasks
