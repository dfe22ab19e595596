"""``evalkit export RESULTS --format eee|mteb``: result rows in the layouts other tools read.

- ``eee``: Every Eval Ever aggregate records (``eval.schema.json``, schema version 0.3.0): one
  record per setup and task, one evaluation result per metric and seed, each with its
  standard error and n, and evalkit's provenance (weights id, options, random init, data
  identity, stand-in, device, evalkit version) as string details. Files go to
  ``OUT/<task>/<backbone>/<uuid>.json``, the uuid derived from the record's identity so a
  second export overwrites rather than adds.
- ``mteb``: MTEB's results layout, ``OUT/<org__model>/<revision>/<task>.json``, the revision
  being the weights id (or ``random-init``), scores per split with the headline metric as
  ``main_score``.

Rows are grouped by setup (``setup_labels``) exactly as tables group them, so two setups of
one backbone never share a file.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path

from evalkit.core.results import Row, dataset_label, load_rows, setup_key, setup_labels
from evalkit.errors import EvalkitError
from evalkit.storage.writes import replacing

FORMATS = ("eee", "mteb")
EEE_VERSION = "0.3.0"
PERCENT = ("top", "accuracy", "miou", "pixel_acc")  # metrics in 0–100 points


def export(results: Path, out: Path, fmt: str, *, organization: str = "unknown") -> list[Path]:
    """Write ``results``' rows to ``out`` in format ``fmt``; the files written."""
    if fmt not in FORMATS:
        raise EvalkitError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    rows = load_rows([results])
    if not rows:
        raise EvalkitError(f"no result rows under {results} (expected evalkit run's *.jsonl)")
    labels = setup_labels(rows)
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[(setup_key(row), row["task"], dataset_label(row))].append(row)
    written = []
    for (setup, task, _), members in sorted(groups.items(), key=lambda item: str(item[0])):
        label = labels[setup]
        if fmt == "eee":
            record = eee_record(members, label, organization)
            path = out / _slug(task) / _slug(members[0]["backbone"]) / f"{record['_file']}.json"
            del record["_file"]
        else:
            record = mteb_record(members)
            model = members[0]["backbone"].replace("/", "__")
            path = (
                out
                / model
                / _slug(_revision(members[0]) + _options(members[0]))
                / f"{_slug(task)}.json"
            )
        with replacing(path) as tmp:
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


def eee_record(rows: list[Row], label: str, organization: str) -> dict:
    """One Every Eval Ever aggregate record: a setup's rows of one task (and data)."""
    first = rows[0]
    provenance = first.get("provenance", {})
    evaluation_id = f"{first['task']}/{label}/{provenance.get('time', '')}"
    return {
        "_file": str(uuid.uuid5(uuid.NAMESPACE_URL, f"evalkit:{first['task']}:{label}")),
        "schema_version": EEE_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": str(provenance.get("time", "")),
        "retrieved_timestamp": str(int(_epoch(provenance.get("time")))),
        "source_metadata": {
            "source_name": "evalkit",
            "source_type": "evaluation_run",
            "source_organization_name": organization,
            "evaluator_relationship": "third_party",
        },
        "model_info": {
            "name": label,
            "id": first["backbone"],
            "additional_details": {
                "deployment_type": "self_deployed",
                "model_availability": "unknown",
                **_strings(
                    weights_id=first.get("weights_id"),
                    weights_source=first.get("weights_source"),
                    backbone_options=json.dumps(
                        first.get("backbone_options") or {}, sort_keys=True
                    ),
                    random_init=bool(first.get("random_init")),
                ),
            },
        },
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


def _eee_result(row: Row) -> dict:
    recorded = row.get("dataset") if isinstance(row.get("dataset"), dict) else {}
    percent = row["metric"].startswith(PERCENT)
    score = {"score": float(row["value"])}
    if row.get("stderr") is not None or row.get("n"):
        score["uncertainty"] = {
            **(
                {"standard_error": {"value": float(row["stderr"]), "method": "analytic"}}
                if row.get("stderr") is not None
                else {}
            ),
            **({"num_samples": int(row["n"])} if row.get("n") else {}),
        }
    score["details"] = _strings(
        seed=row.get("seed"), run_key=row.get("run_key"), std_over_seeds=row.get("std")
    )
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
            "metric_unit": "percent" if percent else "points",
            "min_score": 0.0 if percent else None,
            "max_score": 100.0 if percent else None,
        },
        "score_details": score,
    }


def mteb_record(rows: list[Row]) -> dict:
    """One task's rows of a setup in MTEB's results layout, with evalkit's provenance."""
    first = rows[0]
    split = (first.get("config") or {}).get("eval_split", "test")
    scores: dict[int, dict] = defaultdict(dict)
    for row in rows:  # one score entry per seed
        entry = scores[row.get("seed", 0)]
        entry[row["metric"]] = row["value"]
        if row.get("stderr") is not None:
            entry[f"{row['metric']}_stderr"] = row["stderr"]
        entry["n"] = row.get("n")
    for seed, entry in scores.items():
        entry["main_score"] = entry.get(first["metric"])
        entry["hf_subset"] = "default"
        entry["seed"] = seed
    provenance = first.get("provenance", {})
    return {
        "task_name": first["task"],
        "dataset_revision": json.dumps(first.get("data_id") or {}, sort_keys=True),
        "evaluation_time": provenance.get("wall_s"),
        "scores": {split: list(scores.values())},
        "evalkit": {
            "version": provenance.get("evalkit"),
            "weights_id": first.get("weights_id"),
            "backbone_options": first.get("backbone_options") or {},
            "random_init": bool(first.get("random_init")),
            "dataset": dataset_label(first),
            "device": provenance.get("device"),
        },
    }


def _revision(row: Row) -> str:
    return "random-init" if row.get("random_init") else str(row.get("weights_id") or "unknown")


def _options(row: Row) -> str:
    options = row.get("backbone_options") or {}
    return "".join(f"_{k}-{v}" for k, v in sorted(options.items()))


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)


def _strings(**values) -> dict[str, str]:
    """Details as the schema takes them: strings only, absent values left out."""
    return {key: str(value) for key, value in values.items() if value is not None}


def _epoch(text) -> float:
    import datetime

    try:
        return datetime.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return 0.0
