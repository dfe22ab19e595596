"""evalkit: evaluate frozen vision backbones with the protocols of *Scaling Vision
Transformers to 22 Billion Parameters* (Dehghani et al., 2023).

Public API: ``run``, ``load_backbone``, ``get_task``, ``list_tasks``. Imports are lazy so that
``import evalkit`` and ``evalkit --help`` stay fast.
"""

from __future__ import annotations

import os as _os

__version__ = "0.1.0"


def _strict_mkl_products() -> None:
    """Ask MKL for its strict reproducible mode (``MKL_CBWR=<branch>,STRICT``): its matrix
    products then give the same bits on any thread count. Without it MKL splits a product's
    sums by the thread count for some shapes, and a fit run on the cores free at the moment
    would change with the machine's load. MKL reads the setting once, at its first call, so it
    is set when evalkit is imported (a branch the user chose is kept);
    ``evalkit.device.mkl_strict`` says whether it took."""
    branch = (_os.environ.get("MKL_CBWR") or "AUTO").upper()  # MKL reads upper case only
    _os.environ["MKL_CBWR"] = branch if "STRICT" in branch else f"{branch},STRICT"


_strict_mkl_products()


def list_tasks() -> list[str]:
    from evalkit.core.catalog import TASKS

    return TASKS.names()


def get_task(name: str, overrides=()):
    from evalkit.core.runner import resolve_task

    return resolve_task(name, overrides)


def load_backbone(spec: str, **options):
    """``load_backbone("timm/vit_tiny_patch16_224", weights=None, seed=0, device="cpu")``."""
    from evalkit.backbones import BackboneOptions
    from evalkit.backbones import load_backbone as _load

    return _load(spec, BackboneOptions(**options))


def run(tasks, backbones, **options) -> list[dict]:
    """Run each task on each backbone; returns the result rows (also appended under ``out``).

    ``tasks`` and ``backbones`` are a name or a list of names; ``options`` are the flat options
    of ``evalkit.core.spec.RunSpec.of`` (``seeds``, ``overrides``, ``weights``, ``model_args``,
    ``data``, ``data_dir``, ``out``, ``device``, ``dtype``, ...), the same as the command line's.
    """
    from evalkit.core.runner import run as run_spec
    from evalkit.core.spec import RunSpec

    spec = RunSpec.of(tasks=tasks, backbones=backbones, **options)
    return [row for job in run_spec(spec) for row in job.rows]
