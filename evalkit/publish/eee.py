"""Every Eval Ever (EEE) aggregate records, laid out as EEE's datastore accepts them.

EEE's merge gate (``every_eval_ever/validator/validation_core.py`` in evaleval/every_eval_ever)
checks more than the JSON schema (``eval.schema.json``, version 0.3.0):

- the path is ``data/<collection>/<developer>/<model>/<uuid4>.json``: five parts, each folder a
  portable name other than ``data``, the file name a random (version 4) UUID. So a record's
  deterministic identity is its ``evaluation_id``, never its file name; a second export into
  the same folder finds the record by that id and overwrites its file.
- a continuous metric declares both bounds and its score lies inside them (``±Infinity`` where
  evalkit knows no bound); every uncertainty number is finite.
- ``model_info`` states ``deployment_type`` and ``model_availability`` from EEE's vocabulary.

Here the collection is the task, the developer the backbone id's prefix (``timm`` of
``timm/vit_small_patch16_224``; evalkit for a bare name such as ``fake``), the model the rest.

Where things go in a record (``docs/cluster.md``, "Exporting"):

- uncertainty: ``score_details.uncertainty`` per result: ``standard_error`` with its ``method``
  (``analytic``, or ``bootstrap`` with ``num_bootstrap_samples``), a 95% ``confidence_interval``
  (score ± 1.96 standard errors, clipped to the metric's range) and ``num_samples`` (n).
- the frozen-backbone protocol (probe, layers, pooling, resolution, seeds, the task's whole
  config): ``evaluation_results[].generation_config.additional_details``, EEE's place for
  settings without a typed field; nothing else holds it.
- evalkit's provenance (weights, options, data identity, stand-in, device, versions): the
  ``additional_details`` of ``model_info``, ``source_data`` and ``eval_library``.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from pathlib import Path

from evalkit.core.catalog import TASKS
from evalkit.core.labels import dataset_label
from evalkit.core.results import Row
from evalkit.errors import EvalkitError
from evalkit.metrics import BOOTSTRAP_DRAWS

EEE_VERSION = "0.3.0"
PERCENT = ("top", "accuracy", "miou", "pixel_acc")  # metrics in 0–100 points
# the standard errors tasks compute by resampling images (tasks/segmentation.py,
# tasks/calibration.py, with evalkit.metrics.bootstrap_stderr); every other one is analytic
BOOTSTRAPPED = ("miou", "ece")
Z95 = 1.96
OWN_DEVELOPER = "evalkit"  # evalkit's built-in backbones (fake, the ablations' own models)
_UNPORTABLE = re.compile(r'[<>:"\\|?*/\x00-\x1f]')
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10))}


def record_path(out: Path, record: dict, task: str) -> Path:
    """Where ``record`` goes under ``out``: ``out/data/<task>/<developer>/<model>/<uuid4>.json``,
    reusing the file of a record with the same ``evaluation_id`` already there."""
    model = record["model_info"]
    folder = out / "data" / _component(task) / _component(model["developer"])
    folder = folder / _component(_model_name(model["id"]))
    return folder / f"{_existing_uuid(folder, record['evaluation_id']) or uuid.uuid4()}.json"


def _existing_uuid(folder: Path, evaluation_id: str) -> str | None:
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            if json.loads(file.read_text()).get("evaluation_id") == evaluation_id:
                return file.stem
        except (OSError, ValueError, AttributeError):
            continue  # not ours to judge: another file in the folder
    return None


def _model_name(backbone: str) -> str:
    return backbone.split("/", 1)[1] if "/" in backbone else backbone


def developer(backbone: str) -> str:
    """The developer folder as EEE derives it: the prefix before the first ``/``."""
    return backbone.split("/", 1)[0] if "/" in backbone else OWN_DEVELOPER


def _component(text: str) -> str:
    """One portable path component (EEE's ``check_path_structure`` rules)."""
    name = _UNPORTABLE.sub("_", text).rstrip(". ")
    if name.split(".", 1)[0].upper() in _RESERVED or name == "data":
        name = f"_{name}"
    if not name:
        raise EvalkitError(f"eee: {text!r} gives no usable folder name")
    return name


def eee_record(rows: list[Row], label: str, organization: str) -> dict:
    """One Every Eval Ever aggregate record: a setup's rows of one task (and data)."""
    first = rows[0]
    provenance = first.get("provenance", {})
    return {
        "schema_version": EEE_VERSION,
        # the record's identity: task, data, setup and when it ran (the file name is random)
        "evaluation_id": f"evalkit:{first['task']}:{dataset_label(first)}:{label}:"
        f"{provenance.get('time', '')}",
        "evaluation_timestamp": str(provenance.get("time", "")),
        "retrieved_timestamp": str(int(_epoch(provenance.get("time")))),
        "source_metadata": {
            "source_name": "evalkit",
            "source_type": "evaluation_run",
            "source_organization_name": organization,
            "evaluator_relationship": "third_party",
        },
        "model_info": _model_info(first, label),
        "eval_library": {
            "name": "evalkit",
            "version": str(provenance.get("evalkit") or "unknown"),
            "additional_details": _strings(
                device=provenance.get("device"),
                torch=provenance.get("torch"),
                git_sha=provenance.get("git_sha"),
            ),
        },
        "evaluation_results": [_eee_result(row) for row in rows],
    }


def _model_info(row: Row, label: str) -> dict:
    return {
        "name": label,
        "id": row["backbone"],
        "developer": developer(row["backbone"]),
        "additional_details": {
            # evalkit runs the backbone itself; whether its weights are public it cannot tell
            "deployment_type": "self_deployed",
            "model_availability": "unknown",
            **_strings(
                weights_id=row.get("weights_id"),
                weights_source=row.get("weights_source"),
                backbone_options=json.dumps(row.get("backbone_options") or {}, sort_keys=True),
                random_init=bool(row.get("random_init")),
            ),
        },
    }


def _eee_result(row: Row) -> dict:
    recorded = row.get("dataset") if isinstance(row.get("dataset"), dict) else {}
    bounds = _bounds(row["metric"])
    return {
        "evaluation_result_id": f"{row.get('run_key')}:{row['metric']}:{row.get('seed', 0)}",
        "evaluation_name": row["task"],
        "source_data": {
            "dataset_name": dataset_label(row) or row["task"],
            "source_type": "other",
            "additional_details": _strings(
                stand_in=bool(recorded.get("stand_in")),
                data_id=json.dumps(row.get("data_id") or {}, sort_keys=True),
                data_source=row.get("data_source"),
            ),
        },
        "metric_config": {
            "metric_id": f"evalkit.{row['metric']}",
            "metric_name": row["metric"],
            "lower_is_better": not row.get("higher_is_better", True),
            "score_type": "continuous",
            "metric_unit": "percent" if bounds[0] == 0.0 else "points",
            "min_score": bounds[0],
            "max_score": bounds[1],
        },
        "score_details": {
            "score": float(row["value"]),
            **({"uncertainty": u} if (u := uncertainty(row, bounds)) else {}),
            "details": _strings(seed=row.get("seed"), run_key=row.get("run_key"), **_spread(row)),
        },
        "generation_config": {"additional_details": protocol(row)},
    }


def _bounds(metric: str) -> tuple[float | str, float | str]:
    """A continuous metric's range: 0–100 for percentages; unbounded (EEE's ``±Infinity``
    strings, never null) where evalkit knows no range."""
    return (0.0, 100.0) if metric.startswith(PERCENT) else ("-Infinity", "Infinity")


def uncertainty(row: Row, bounds: tuple) -> dict:
    """The row's uncertainty in EEE's typed fields: standard error (and how it was computed),
    its 95% normal interval, n and the bootstrap's resamples; only what the row knows."""
    found: dict = {"num_samples": int(row["n"])} if row.get("n") else {}
    stderr = row.get("stderr")
    if stderr is None or not math.isfinite(stderr):
        return found
    bootstrap = row["metric"].startswith(BOOTSTRAPPED)
    value = float(row["value"])
    low, high = (b if isinstance(b, float) else None for b in bounds)
    found["standard_error"] = {"value": float(stderr), "method": _se_method(bootstrap)}
    found["confidence_interval"] = {
        "lower": max(value - Z95 * stderr, low) if low is not None else value - Z95 * stderr,
        "upper": min(value + Z95 * stderr, high) if high is not None else value + Z95 * stderr,
        "confidence_level": 0.95,
        "method": "normal: score ± 1.96 standard errors, clipped to the metric's range",
    }
    if bootstrap:
        found["num_bootstrap_samples"] = BOOTSTRAP_DRAWS
    return found


def _se_method(bootstrap: bool) -> str:
    return "bootstrap" if bootstrap else "analytic"


def _spread(row: Row) -> dict:
    """A spread over the task's own seeds or draws is not EEE's ``standard_deviation`` (that
    is over per-sample scores), so it stays a detail, with how many draws it is over."""
    if row.get("std") is None:
        return {}
    return {"std_over_draws": row["std"], "draws": len(row.get("seeds") or [])}


def protocol(row: Row) -> dict[str, str]:
    """The frozen-backbone protocol that produced the row, as strings: the probe (the task's
    own summary, its head, frozen or fine-tuned), the layers read, the pooling, the input
    resolution, the seeds and the task's whole config."""
    config = row.get("config") or {}
    options = row.get("backbone_options") or {}
    return _strings(
        probe=_probe(row["task"]),
        head=config.get("head"),
        backbone="fine-tuned" if config.get("finetune") else "frozen",
        layers=json.dumps(config.get("layers", [-1])),
        pooling=config.get("pool", "auto"),
        resolution=str(options.get("img_size") or "the backbone's own input size"),
        resize=config.get("resize"),
        seeds=json.dumps(row.get("seeds") or [row.get("seed", 0)]),
        task_config=json.dumps(config, sort_keys=True),
        config_hash=row.get("config_hash"),
    )


def _probe(task: str) -> str:
    try:
        return TASKS.get(task.partition("[")[0]).summary or task
    except EvalkitError:  # a task no longer registered: its name is all there is
        return task


def _strings(**values) -> dict[str, str]:
    """Details as the schema takes them: strings only, absent values left out."""
    return {key: str(value) for key, value in values.items() if value is not None}


def _epoch(text) -> float:
    import datetime

    try:
        return datetime.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return 0.0
