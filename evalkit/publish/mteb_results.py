"""MTEB's results layout: ``OUT/<org__model>/<revision>/<task>.json`` beside a
``model_meta.json`` per model and revision, the files ``mteb.ResultCache`` reads from its
``results/`` folder (export with ``--out <cache>/results``).

What mteb's reader requires (``mteb/results/task_result.py`` and
``mteb/cache/result_cache.py``, mteb 2.26):

- ``mteb_version``: without it a file is taken for the pre-1.11 format, which then needs
  fields evalkit does not have; below 1.12.48 the reader looks the task up in mteb's own
  registry, which knows no evalkit task. So files name the mteb release whose reader the
  tests load them with (``MTEB_VERSION``): the format they follow, not a program that ran.
- every score entry has ``main_score``, ``hf_subset`` (a string) and ``languages`` (a list:
  empty, as an image probe reads no language).
- ``model_meta.json`` in the revision folder (``name``, ``revision`` and mteb's other
  ``ModelMeta`` fields): without it ``load_results`` skips the folder by default. ``name``
  must be ``organization/model``: evalkit's own backbones (``fake``) are ``evalkit/fake``.

The revision is the weights id (or ``random-init``) with the backbone's options appended.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from evalkit.core.labels import dataset_label
from evalkit.core.results import Row
from evalkit.publish.eee import OWN_DEVELOPER

MTEB_VERSION = "2.26.24"


def result_path(out: Path, rows: list[Row], task: str) -> Path:
    """``out/<org__model>/<revision>/<task>.json``."""
    return revision_folder(out, rows[0]) / f"{_slug(task)}.json"


def revision_folder(out: Path, row: Row) -> Path:
    return out / model_name(row).replace("/", "__") / _slug(revision(row))


def model_name(row: Row) -> str:
    """``organization/model`` as mteb's ``ModelMeta`` insists: a bare backbone name is one of
    evalkit's own (``fake`` → ``evalkit/fake``)."""
    backbone = row["backbone"]
    return backbone if "/" in backbone else f"{OWN_DEVELOPER}/{backbone}"


def revision(row: Row) -> str:
    weights = "random-init" if row.get("random_init") else str(row.get("weights_id") or "unknown")
    options = row.get("backbone_options") or {}
    return weights + "".join(f"_{k}-{v}" for k, v in sorted(options.items()))


def mteb_record(rows: list[Row]) -> dict:
    """One task's rows of a setup as mteb's ``TaskResult``, with evalkit's provenance."""
    first = rows[0]
    split = (first.get("config") or {}).get("eval_split", "test")
    provenance = first.get("provenance", {})
    return {
        "task_name": first["task"],
        "mteb_version": MTEB_VERSION,
        "dataset_revision": json.dumps(first.get("data_id") or {}, sort_keys=True),
        "evaluation_time": provenance.get("wall_s"),
        "scores": {split: _scores(rows)},
        "evalkit": {
            "version": provenance.get("evalkit"),
            "weights_id": first.get("weights_id"),
            "backbone_options": first.get("backbone_options") or {},
            "random_init": bool(first.get("random_init")),
            "dataset": dataset_label(first),
            "device": provenance.get("device"),
        },
    }


def _scores(rows: list[Row]) -> list[dict]:
    """One score entry per seed: every metric, its standard error where known, n, and the
    keys mteb requires of each entry."""
    scores: dict[int, dict] = defaultdict(dict)
    for row in rows:
        entry = scores[row.get("seed", 0)]
        entry[row["metric"]] = row["value"]
        if row.get("stderr") is not None and math.isfinite(row["stderr"]):
            entry[f"{row['metric']}_stderr"] = row["stderr"]
        entry["n"] = row.get("n")
    required = {"hf_subset": "default", "languages": []}
    headline = rows[0]["metric"]
    return [
        {**entry, **required, "main_score": entry.get(headline), "seed": seed}
        for seed, entry in scores.items()
    ]


def model_meta(row: Row) -> dict:
    """``model_meta.json``: mteb's ``ModelMeta`` fields, unknown ones null; ``name`` and
    ``revision`` are what the reader takes the folder's identity from."""
    return {
        "name": model_name(row),
        "revision": revision(row),
        "release_date": None,
        "languages": None,
        "loader": None,
        "n_parameters": None,
        "memory_usage_mb": None,
        "max_tokens": None,
        "embed_dim": None,
        "license": None,
        "open_weights": None,
        "public_training_code": None,
        "public_training_data": None,
        "framework": ["PyTorch"],
        "reference": None,
        "similarity_fn_name": None,
        "use_instructions": None,
        "training_datasets": None,
        "modalities": ["image"],
    }


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)
