"""evalkit: evaluate frozen vision backbones with the protocols of *Scaling Vision
Transformers to 22 Billion Parameters* (Dehghani et al., 2023).

Public API: ``run``, ``load_backbone``, ``get_task``, ``list_tasks``. Imports are lazy so that
``import evalkit`` and ``evalkit --help`` stay fast.
"""

from __future__ import annotations

__version__ = "0.1.0"


def list_tasks() -> list[str]:
    from evalkit.catalog import TASKS

    return TASKS.names()


def get_task(name: str, overrides: list[str] | None = None):
    from evalkit.runner import resolve_task

    return resolve_task(name, overrides)


def load_backbone(spec: str, **options):
    """``load_backbone("timm/vit_tiny_patch16_224", weights=None, seed=0, device="cpu")``."""
    from evalkit.backbones import BackboneOptions
    from evalkit.backbones import load_backbone as _load

    return _load(spec, BackboneOptions(**options))


def run(
    task: str,
    backbone: str,
    *,
    out_dir="results/runs",
    overrides=None,
    force=False,
    context=None,
    **backbone_options,
):
    """Run one task on one backbone; returns the result rows (also appended under ``out_dir``)."""
    from pathlib import Path

    from evalkit.runner import resolve_task, run_task
    from evalkit.task import TaskContext

    rows, _ = run_task(
        resolve_task(task, overrides),
        load_backbone(backbone, **backbone_options),
        context or TaskContext(),
        out_dir=Path(out_dir),
        force=force,
    )
    return rows
