"""The same numbers on every machine of the project's kind: what evalkit promises is
computed under every kernel path this CPU can take (benchmarks/kernels.py — thread counts, MKL's
code branches, oneDNN and ATen instruction caps) and must agree, so a CPU with AVX-512 BF16
or AMX and one without run the same checks. kNN is promised to the last bit; the probe's
decisions (chosen L2, hold-out hits per L2, test hits) and predictions after a back-off are
promised equal (docs/reliability.md, "The same numbers on every machine"); so are
model-vs-human's decisions and the fairness evaluation's parity thresholds, to the last bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_knn import _near_duplicates
from test_repeatable import resnet_features

from benchmarks.kernels import kernel_paths, run_under

pytestmark = pytest.mark.long  # the long tier: CI runs it as its own step (nox -s long)

SCRIPT = str(Path(__file__).with_name("kernel_check.py"))
ATEN = {"default": "DEFAULT", "avx2": "AVX2"}


@pytest.fixture(scope="module")
def features(tmp_path_factory, data_cache) -> str:
    """Mean-pooled features of a random ResNet-18: a spectrum spanning orders of magnitude."""
    path = tmp_path_factory.mktemp("kernels") / "resnet.pt"
    x, y, xv, yv = resnet_features(data_cache)
    singular = torch.linalg.svdvals(x - x.mean(0))
    assert singular[0] / singular[len(singular) // 2] > 10  # ill-conditioned indeed
    torch.save([x, y, xv, yv], path)
    return str(path)


@pytest.fixture(scope="module")
def results(features):
    duplicates = str(Path(features).with_name("knn.pt"))
    torch.save(_near_duplicates(), duplicates)
    return {
        name: json.loads(run_under(env, SCRIPT, features, duplicates))
        for name, env in kernel_paths().items()
    }


def test_each_kernel_path_is_the_one_asked_for(results):
    for name, env in kernel_paths().items():
        assert results[name]["threads"] == int(env["OMP_NUM_THREADS"]), name
        if "ATEN_CPU_CAPABILITY" in env:
            assert results[name]["aten"] == ATEN[env["ATEN_CPU_CAPABILITY"]], name


def test_knn_neighbours_are_bitwise_the_same_on_every_kernel_path_and_search(results):
    first = results["1 thread"]["knn"]
    assert len(set(first.values())) == 1, first  # fp32 and bf16 search, any chunking
    for name, found in results.items():
        assert found["knn"] == first, name


def test_probe_decisions_and_backed_off_predictions_agree_on_every_kernel_path(results):
    first = results["1 thread"]
    assert all(first["probe"]["converged"]), first
    for name, found in results.items():
        assert found["probe"] == first["probe"], name
        assert found["backed_off"] == first["backed_off"], name


def test_category_decisions_and_parity_thresholds_agree_on_every_kernel_path(results):
    first = results["1 thread"]["alignment"]
    assert len(first["rates"]) == 2 and 0 < first["objective"] < 1
    for name, found in results.items():
        assert found["alignment"] == first, name


def test_probe_decisions_hold_on_features_nudged_as_another_extraction_would(features, results):
    """Another summation order in the extraction moves features by about 1e-6 (relative)."""
    script = str(Path(__file__).with_name("probe_threads_script.py"))
    nudged = json.loads(run_under({"OMP_NUM_THREADS": "2"}, script, features, "2", "1e-6"))
    assert nudged == results["1 thread"]["probe"]
