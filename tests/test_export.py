"""Results where others look, each export checked by its receiver's own rules on real rows:

- Every Eval Ever: the published schema (kept here as test data: tests/data/eee/eval.schema.json,
  version 0.3.0) and the checks EEE's datastore runs after it, re-implemented below from
  ``every_eval_ever/validator/validation_core.py`` and ``scripts/local_validate.py`` of
  github.com/evaleval/every_eval_ever at commit 9bce4136e789ec006c62582f5f9d107d20f8b398
  (MIT; ``check_path_structure``, ``check_score_metadata``, ``check_model_deployment``,
  ``strict_json_loads``; the package itself needs Python 3.12).
- MTEB: mteb's own reader (``mteb.TaskResult``, ``mteb.ResultCache.load_results``,
  ``ModelMeta``), installed by the ``test`` extra.

Each export carries evalkit's provenance, one file set per setup."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path, PurePosixPath

import jsonschema
import pytest

from evalkit.cli import main

SCHEMA = Path(__file__).with_name("data") / "eee" / "eval.schema.json"


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_cache):
    """Real rows: kNN (no standard error) of two setups, and a linear probe (with one)."""
    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVALKIT_CACHE", str(data_cache))
        base = ["--backbone", "fake", "--data", "embedded", "--out", str(root / "R"), "--quiet"]
        assert main(["run", "--task", "imagenet-knn", *base]) == 0
        assert main(["run", "--task", "imagenet-knn", "--model-arg", "dim=16", *base]) == 0
        assert main(["run", "--task", "imagenet-linear", *base]) == 0
    return root / "R"


# EEE's datastore rules (validation_core.py: _EXPECTED_PATH_PARTS, _UUID_RE,
# _INVALID_PATH_COMPONENT_CHARS, _WINDOWS_RESERVED_NAMES, _DEPLOYMENT_TYPES,
# _MODEL_AVAILABILITY_TYPES), in our own words
EEE_UUID4_FILE = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.json$"
)
EEE_BAD_CHARS = re.compile(r'[<>:"\\|?*\x00-\x1f]')
EEE_RESERVED = {
    "CON",
    "PRN",
    "AUX",
    "NUL",
    *(f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10)),
}
EEE_DEPLOYMENT = {"self_deployed", "externally_managed", "unknown"}
EEE_AVAILABILITY = {"open_weights", "closed_weights", "unknown"}


def eee_repo_path(file: Path) -> str:
    """The path the datastore sees: from the nearest folder named ``data`` (local_validate.py's
    ``_repo_path_under_data``); a file outside one is at an unknown, failing place."""
    data = next((p for p in file.parents if p.name == "data"), None)
    return file.relative_to(data.parent).as_posix() if data else file.name


def eee_path_findings(repo_path: str) -> list[str]:
    """``check_path_structure``: data/<collection>/<developer>/<model>/<uuid4>.json."""
    parts = PurePosixPath(repo_path).parts
    if len(parts) != 5:
        return [f"Unexpected path depth: {len(parts)} components in {repo_path!r}"]
    if parts[0] != "data":
        return [f"path does not start with data/: {repo_path!r}"]
    for part in parts[1:4]:
        if (
            part in {"data", ".", ".."}
            or EEE_BAD_CHARS.search(part)
            or part.endswith((".", " "))
            or part.split(".", 1)[0].upper() in EEE_RESERVED
        ):
            return [f"unportable or reserved component {part!r}"]
    if not EEE_UUID4_FILE.fullmatch(parts[4]):
        return [f"file name {parts[4]!r} is not {{UUID4}}.json"]
    return []


def eee_bound(value):
    if value in ("Infinity", "-Infinity"):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    return None


def eee_score_findings(record: dict) -> list[str]:
    """``check_score_metadata``: a continuous metric has both bounds, the score lies within
    them, and every uncertainty number is finite."""
    found = []
    for i, result in enumerate(record["evaluation_results"]):
        metric, score = result["metric_config"], result["score_details"]["score"]
        low, high = eee_bound(metric.get("min_score")), eee_bound(metric.get("max_score"))
        if metric.get("score_type") == "continuous" and (low is None or high is None):
            found.append(f"[{i}] continuous metric without both bounds")
        elif low is not None and high is not None and not low <= score <= high:
            found.append(f"[{i}] score {score} outside [{low}, {high}]")
        spread = result["score_details"].get("uncertainty", {})
        numbers = [spread.get("standard_deviation"), spread.get("standard_error", {}).get("value")]
        numbers += [spread.get("confidence_interval", {}).get(k) for k in ("lower", "upper")]
        if any(n is not None and not math.isfinite(n) for n in numbers):
            found.append(f"[{i}] non-finite uncertainty")
    return found


def eee_deployment_findings(record: dict) -> list[str]:
    """``check_model_deployment``: both axes present and from EEE's vocabulary."""
    details = record["model_info"].get("additional_details", {})
    found = []
    if details.get("deployment_type") not in EEE_DEPLOYMENT:
        found.append(f"deployment_type {details.get('deployment_type')!r}")
    if details.get("model_availability") not in EEE_AVAILABILITY:
        found.append(f"model_availability {details.get('model_availability')!r}")
    return found


def eee_strict_load(file: Path) -> dict:
    """``strict_json_loads``: no NaN or infinity tokens, no duplicate keys."""

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate key in {file}"
        return dict(pairs)

    def no_constant(token):
        raise AssertionError(f"{token} in {file}")

    return json.loads(file.read_text(), object_pairs_hook=no_duplicates, parse_constant=no_constant)


def eee_datastore_findings(file: Path) -> list[str]:
    """Everything EEE's gate reports for one aggregate file, schema included."""
    record = eee_strict_load(file)
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    found = [error.message for error in validator.iter_errors(record)]
    found += eee_path_findings(eee_repo_path(file))
    return found + eee_score_findings(record) + eee_deployment_findings(record)


def test_every_eval_ever_records_pass_the_datastore_checks(results, tmp_path):
    out = tmp_path / "eee"
    assert main(["export", str(results), "--format", "eee", "--out", str(out)]) == 0
    files = sorted(out.rglob("*.json"))
    assert len(files) == 3  # one per setup and task
    for file in files:
        assert not eee_datastore_findings(file), (file, eee_datastore_findings(file))
    records = {json.loads(f.read_text())["model_info"]["name"]: f for f in files}
    assert set(records) == {"fake (random init)", "fake [dim=16] (random init)"}
    knn = out / "data" / "imagenet-knn" / "evalkit" / "fake"
    assert sorted(f.parent for f in files).count(knn) == 2  # two setups, one model folder


def _results(out: Path, task: str, setup: str = "fake (random init)") -> dict[str, dict]:
    records = [json.loads(f.read_text()) for f in (out / "data" / task).rglob("*.json")]
    (found,) = [r["evaluation_results"] for r in records if r["model_info"]["name"] == setup]
    return {r["metric_config"]["metric_name"]: r for r in found}


def test_each_eee_cell_carries_its_uncertainty_and_protocol_in_typed_fields(results, tmp_path):
    """The linear probe's binomial standard error is EEE's ``standard_error`` (analytic) with
    its 95% interval and n; kNN rows have no standard error, so only n; the protocol sits in
    ``generation_config.additional_details``."""
    out = tmp_path / "eee"
    assert main(["export", str(results), "--format", "eee", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in (results / "imagenet-linear.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["metric"] == "top1"]
    top1 = _results(out, "imagenet-linear")["top1"]
    spread = top1["score_details"]["uncertainty"]
    assert spread["standard_error"] == {"value": row["stderr"], "method": "analytic"}
    interval = spread["confidence_interval"]
    assert interval["confidence_level"] == 0.95
    assert interval["lower"] == pytest.approx(row["value"] - 1.96 * row["stderr"])
    assert interval["upper"] == pytest.approx(row["value"] + 1.96 * row["stderr"])
    assert spread["num_samples"] == 384 and "num_bootstrap_samples" not in spread
    protocol = top1["generation_config"]["additional_details"]
    assert protocol["probe"].startswith("ImageNet-1k linear probe")
    assert (protocol["layers"], protocol["pooling"], protocol["seeds"]) == ("[-1]", "auto", "[0]")
    assert protocol["backbone"] == "frozen" and "resolution" in protocol
    knn = _results(out, "imagenet-knn")["top1/k=20"]
    assert knn["score_details"]["uncertainty"] == {"num_samples": 384}
    assert knn["source_data"]["additional_details"]["stand_in"] == "True"


def test_a_second_eee_export_overwrites_its_records(results, tmp_path):
    """File names are random (EEE wants UUID4); the record's identity is its
    ``evaluation_id``, so exporting again into the same folder replaces, never adds."""
    out = tmp_path / "eee"
    assert main(["export", str(results), "--format", "eee", "--out", str(out)]) == 0
    first = sorted(out.rglob("*.json"))
    assert main(["export", str(results), "--format", "eee", "--out", str(out)]) == 0
    assert sorted(out.rglob("*.json")) == first


def test_mtebs_own_reader_loads_the_mteb_export(results, tmp_path):
    """mteb's ``TaskResult`` reads each file in its current format (no pre-1.11 fallback),
    ``ModelMeta`` accepts each ``model_meta.json`` and ``ResultCache.load_results`` with its
    defaults (model_meta.json required) finds every model, revision and task."""
    import mteb
    from mteb.models.model_meta import ModelMeta

    out = tmp_path / "results"  # a ResultCache's layout: <cache>/results/<model>/<revision>
    assert main(["export", str(results), "--format", "mteb", "--out", str(out)]) == 0
    for file in out.glob("*/*/imagenet-*.json"):
        task = mteb.TaskResult.from_disk(file, load_historic_data=False)
        for entry in task.scores["val"]:
            assert entry["hf_subset"] == "default" and entry["languages"] == []
    for file in out.glob("*/*/model_meta.json"):
        meta = ModelMeta.model_validate(json.loads(file.read_text()))
        assert (meta.name, meta.revision) == ("evalkit/fake", file.parent.name)
    loaded = mteb.ResultCache(tmp_path).load_results(include_remote=False)
    found = {
        (m.model_name, m.model_revision, t.task_name): t
        for m in loaded.model_results
        for t in m.task_results
    }
    assert set(found) == {
        ("evalkit/fake", "random-init", "imagenet-knn"),
        ("evalkit/fake", "random-init", "imagenet-linear"),
        ("evalkit/fake", "random-init_dim-16", "imagenet-knn"),
    }
    (entry,) = found[("evalkit/fake", "random-init", "imagenet-knn")].scores["val"]
    assert entry["main_score"] == entry["top1/k=20"] and entry["n"] == 384
    record = json.loads((out / "evalkit__fake" / "random-init" / "imagenet-knn.json").read_text())
    assert record["evalkit"]["dataset"] == "imagenet (stand-in)"


def test_each_metrics_direction_is_exported_as_lower_is_better(results, tmp_path):
    """``lower_is_better`` is the row's direction inverted: a higher-is-better accuracy is
    false, the same row marked lower-is-better (an error, a loss) is true."""
    folder = tmp_path / "R"
    folder.mkdir()
    rows = [json.loads(x) for x in (results / "imagenet-knn.jsonl").read_text().splitlines()]
    flipped = [r | {"metric": f"{r['metric']}-error", "higher_is_better": False} for r in rows]
    lines = [json.dumps(r) + "\n" for r in rows + flipped]
    (folder / "imagenet-knn.jsonl").write_text("".join(lines))
    assert main(["export", str(folder), "--format", "eee", "--out", str(tmp_path / "eee")]) == 0
    directions = {
        result["metric_config"]["metric_name"]: result["metric_config"]["lower_is_better"]
        for file in (tmp_path / "eee").rglob("*.json")
        for result in json.loads(file.read_text())["evaluation_results"]
    }
    assert directions["top1/k=20"] is False and directions["top1/k=20-error"] is True
