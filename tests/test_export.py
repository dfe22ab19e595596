"""Results where others look: Every Eval Ever aggregate records that validate against the
published schema (kept here as test data: tests/data/eee/eval.schema.json, version 0.3.0), and
MTEB's results layout, each carrying evalkit's provenance, one file set per setup."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from evalkit.cli import main

SCHEMA = Path(__file__).with_name("data") / "eee" / "eval.schema.json"


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_cache):
    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVALKIT_CACHE", str(data_cache))
        base = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded"]
        assert main([*base, "--out", str(root / "R"), "--quiet"]) == 0
        assert main([*base, "--model-arg", "dim=16", "--out", str(root / "R"), "--quiet"]) == 0
    return root / "R"


def test_every_eval_ever_records_validate_against_the_published_schema(results, tmp_path):
    assert main(["export", str(results), "--format", "eee", "--out", str(tmp_path / "eee")]) == 0
    files = sorted((tmp_path / "eee").rglob("*.json"))
    assert len(files) == 2  # one per setup
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    names = set()
    for file in files:
        record = json.loads(file.read_text())
        errors = sorted(validator.iter_errors(record), key=str)
        assert not errors, errors[0].message
        names.add(record["model_info"]["name"])
        (top1,) = [
            r
            for r in record["evaluation_results"]
            if r["metric_config"]["metric_name"] == "top1/k=20"
        ]
        assert top1["score_details"]["uncertainty"]["num_samples"] == 384
        assert top1["source_data"]["additional_details"]["stand_in"] == "True"
        assert record["model_info"]["additional_details"]["random_init"] == "True"
    assert names == {"fake (random init)", "fake [dim=16] (random init)"}
    again = tmp_path / "eee2"
    assert main(["export", str(results), "--format", "eee", "--out", str(again)]) == 0
    assert sorted(p.relative_to(again) for p in again.rglob("*.json")) == [
        p.relative_to(tmp_path / "eee") for p in files
    ]  # the same names: a second export overwrites


def test_the_mteb_layout_names_model_revision_and_task(results, tmp_path):
    assert main(["export", str(results), "--format", "mteb", "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.rglob("imagenet-knn.json"))
    assert [f.relative_to(tmp_path).parts[0] for f in files] == ["fake", "fake"]
    revisions = {f.parent.name for f in files}
    assert revisions == {"random-init", "random-init_dim-16"}
    record = json.loads(files[0].read_text())
    (entry,) = record["scores"]["val"]
    assert entry["main_score"] == entry["top1/k=20"] and entry["n"] == 384
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
