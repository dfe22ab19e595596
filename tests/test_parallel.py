"""Sharded inference on 2 CPU processes (gloo): tensor parallel and FSDP2 equal the unsharded
model, the all-reduce count per block, per-rank memory, checkpoint slices, and the CLI
under torchrun writing the same metrics as one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))


def torchrun(*args, cwd=None, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [
        TORCHRUN,
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    from evalkit.models.vit22b import build, config
    from evalkit.storage.checkpoints import save_checkpoint

    tmp = tmp_path_factory.mktemp("parallel")
    cfg = config("test")
    state = build(cfg, seed=11).state_dict()
    checkpoint = save_checkpoint(state, tmp / "ckpt", cfg.as_dict(), shard_bytes=200_000)
    script = Path(__file__).with_name("parallel_checks.py")
    torchrun(str(script), str(tmp / "result.json"), str(checkpoint))
    return json.loads((tmp / "result.json").read_text())


def test_tensor_parallel_equals_unsharded(checks):
    for name, result in checks["tensor_parallel"].items():
        assert result["max_err"] <= 1e-5, name
        assert result["max_err_tokens"] <= 1e-5, name


def test_one_all_reduce_per_parallel_block_two_per_sequential(checks):
    results = checks["tensor_parallel"]
    assert results["default"]["all_reduces"] == results["default"]["depth"]
    assert results["sequential"]["all_reduces"] == 2 * results["sequential"]["depth"]


def test_per_rank_parameters_about_half(checks):
    for name, result in checks["tensor_parallel"].items():
        # Replicated: embeddings, norms, out-projection biases and the MAP head.
        assert 0.5 < result["bytes_ratio"] < 0.75, (name, result["bytes_ratio"])


def test_backbone_extraction_runs_sharded_matmuls(checks):
    """Feature extraction runs under inference_mode; the adapter must still reduce once per
    block and never gather the sharded weights."""
    result = checks["backbone"]
    assert result["max_err"] <= 1e-5
    assert result["comms"] == {"c10d_functional.all_reduce": 4}


def test_sharded_checkpoint_loads_same_weights_on_every_layout(checks):
    assert checks["checkpoint"]["tp"] <= 1e-5
    assert checks["checkpoint"]["fsdp"] <= 1e-5


@pytest.mark.long
def test_torchrun_cli_matches_single_process(cli_env, data_cache):
    """Same features up to float summation order (≤ 1e-5), and then exactly the same hold-out
    curve, chosen L2 and metrics: the probe's fits are pinned to their optimum (float64, run
    to the gradient tolerance), so a 1e-6 change in the features moves no prediction."""
    args = ["--task", "imagenet-linear", "--backbone", "vit22b/test", "--data", "embedded"]
    env = {"EVALKIT_CACHE": str(data_cache), "HF_HUB_OFFLINE": "1"}
    single = subprocess.run(
        [sys.executable, "-m", "evalkit", "run", *args, "--out", "one", "--cache-dir", "c1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cli_env,
        env={**os.environ, **env},
    )
    assert single.returncode == 0, single.stderr
    torchrun(
        "-m",
        "evalkit",
        "run",
        *args,
        "--tp",
        "2",
        "--out",
        "two",
        "--cache-dir",
        "c2",
        cwd=cli_env,
        env_extra=env,
    )
    from evalkit.core.results import load_rows

    one = {r["metric"]: r for r in load_rows([cli_env / "one"])}
    two = {r["metric"]: r for r in load_rows([cli_env / "two"])}
    assert set(one) == set(two) == {"top1", "top5"}
    assert len(load_rows([cli_env / "two"])) == 2  # rank 0 alone wrote rows
    for metric, row in one.items():
        assert row["extra"]["l2"] == two[metric]["extra"]["l2"]
        assert row["extra"]["holdout_top1_by_l2"] == two[metric]["extra"]["holdout_top1_by_l2"]
        assert row["value"] == two[metric]["value"]
    first, second = cached_features(cli_env / "c1"), cached_features(cli_env / "c2")
    assert first.keys() == second.keys() == {"train", "val"}
    for split, features in first.items():
        assert (features - second[split]).abs().max() <= 1e-5
    api_rows_match_cli_rows_under_torchrun(cli_env, env)


API_SCRIPT = """
import evalkit
evalkit.run("imagenet-linear", "vit22b/test", data="embedded", tp=2, out="api", cache_dir="c2",
            no_cache=True, progress=False)
"""


def api_rows_match_cli_rows_under_torchrun(cli_env: Path, env: dict):
    """The Python API under torchrun writes the rows the CLI wrote under torchrun."""
    from evalkit.core.results import load_rows

    (cli_env / "api_run.py").write_text(API_SCRIPT)
    torchrun(str(cli_env / "api_run.py"), cwd=cli_env, env_extra=env)
    volatile = {"time", "wall_s", "images_per_s", "peak_mem_mb"}

    def stable(rows):
        return [
            {
                **r,
                "provenance": {k: v for k, v in r["provenance"].items() if k not in volatile},
                "sources": None,  # the cache entries read: the API run used none
            }
            for r in rows
        ]

    assert stable(load_rows([cli_env / "api"])) == stable(load_rows([cli_env / "two"]))


def cached_features(root: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    out = {}
    for folder in (root / "features").iterdir():
        split = json.loads((folder / "meta.json").read_text())["split"]
        shards = sorted(folder.glob("shard-*.safetensors"))
        out[split] = torch.cat([load_file(str(f))["pooled"] for f in shards])
    return out


def test_lit_loss_on_two_ranks_equals_the_joined_batch(tmp_path):
    """Negatives gathered with gradients: the 2-rank loss and averaged gradients are the
    one-process loss and gradients of the joined batch, to float32 rounding. Not bitwise: each
    side multiplies matrices of other shapes (4 rows against 8), for which a BLAS may pick
    other kernels; measured across kernel paths (threads 1–4, MKL's AVX-512, AVX2 and
    compatible code, ATen's AVX2 and AVX-512): at most 2e-6 of the largest gradient entry."""
    torchrun(str(Path(__file__).with_name("lit_gather_check.py")), str(tmp_path / "lit.json"))
    result = json.loads((tmp_path / "lit.json").read_text())
    assert result["gathered"] == pytest.approx(result["joined"], rel=1e-6)
    assert result["grad_diff"] <= 1e-5 * result["grad_scale"]


@pytest.mark.long
def test_trainer_on_two_ranks_equals_one_process(tmp_path):
    """The backbone trainer data parallel, under FSDP2 and tensor parallel, with a resume from
    a checkpoint midway: the losses and gradient norms of every step equal one process's."""
    script = str(Path(__file__).with_name("train_parallel_check.py"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = tmp_path / "single.json"
    subprocess.run(
        [sys.executable, script, str(single), "1", "dp"], check=True, env=env, timeout=600
    )
    torchrun(script, str(tmp_path / "dp.json"), "1", "dp", "fsdp")
    torchrun(script, str(tmp_path / "tp.json"), "2", "tp")
    reference = json.loads(single.read_text())["dp"]
    runs = json.loads((tmp_path / "dp.json").read_text()) | json.loads(
        (tmp_path / "tp.json").read_text()
    )
    assert set(runs) == {"dp", "fsdp", "tp"}
    for mode, log in runs.items():
        assert len(log) == 5, mode
        for ours, theirs in zip(log, reference, strict=True):
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-5), mode
            assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-3), mode
    assert reference[-1]["loss"] < reference[0]["loss"]  # it trains


FINETUNE = [
    "--task",
    "imagenet-linear",
    "--backbone",
    "vit22b/test",
    "--data",
    "embedded",
    "--set",
    "finetune=true",
    "--set",
    "finetune_steps=5",
    "--set",
    "finetune_batch_size=8",
    "--quiet",
]


def finetuned(cwd: Path, name: str) -> tuple[dict, list[dict]]:
    """A fine-tuning run's metrics and its training log (loss and grad norm of each step)."""
    import torch

    from evalkit.core.results import load_rows

    rows = {r["metric"]: r["value"] for r in load_rows([cwd / name])}
    trainer = next((cwd / f"cache-{name}" / "finetune").glob("*/checkpoint-*/trainer.pt"))
    return rows, torch.load(trainer, weights_only=True)["log"]


@pytest.mark.slow  # ~90 s each: in `nox -s slow`; the one-rank paths run by default
def test_fine_tuning_on_two_ranks_equals_one_process(cli_env, data_cache):
    """Data parallel, FSDP2 and tensor parallel fine-tuning of vit22b/test: the loss and grad
    norm of every step and the final metrics of one process (1e-4 relative); a rerun resumes
    from the sharded checkpoint, trains nothing, and scores the same."""
    env = {"EVALKIT_CACHE": str(data_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "evalkit",
            "run",
            *FINETUNE,
            "--out",
            "one",
            "--cache-dir",
            "cache-one",
        ],
        cwd=cli_env,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=600,
    )
    one, log = finetuned(cli_env, "one")
    assert len(log) == 5
    for name, flags in (("dp", []), ("fsdp", ["--fsdp"]), ("tp", ["--tp", "2"])):
        args = [
            "-m",
            "evalkit",
            "run",
            *FINETUNE,
            *flags,
            "--out",
            name,
            "--cache-dir",
            f"cache-{name}",
        ]
        torchrun(*args, cwd=cli_env, env_extra=env)
        rows, ranks_log = finetuned(cli_env, name)
        assert rows == one, name
        for mine, theirs in zip(ranks_log, log, strict=True):
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4), name
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4), name
        torchrun(
            *args[:-4],
            "--out",
            f"{name}-again",
            "--cache-dir",
            f"cache-{name}",
            cwd=cli_env,
            env_extra=env,
        )
        again = {r["metric"]: r["value"] for r in load_rows_of(cli_env / f"{name}-again")}
        assert again == one, f"{name} resumed"


def load_rows_of(path: Path) -> list[dict]:
    from evalkit.core.results import load_rows

    return load_rows([path])


@pytest.mark.long
def test_fsdp_extraction_on_two_ranks_equals_one_process(cli_env, data_cache):
    """Under FSDP2 a rank with fewer shards to extract (here: none) keeps running forwards
    until the other is done, so the gathers stay in step instead of hanging."""
    from evalkit.core.results import load_rows

    env = {"EVALKIT_CACHE": str(data_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [
        "run",
        "--task",
        "imagenet-5shot",
        "--backbone",
        "vit22b/test",
        "--data",
        "embedded",
        "--quiet",
    ]
    subprocess.run(
        [sys.executable, "-m", "evalkit", *args, "--out", "one", "--cache-dir", "c1"],
        cwd=cli_env,
        env={**os.environ, **env},
        check=True,
        timeout=600,
    )
    torchrun(
        "-m",
        "evalkit",
        *args,
        "--fsdp",
        "--out",
        "two",
        "--cache-dir",
        "c2",
        cwd=cli_env,
        env_extra=env,
    )
    one, two = ({r["metric"]: r["value"] for r in load_rows([cli_env / d])} for d in ("one", "two"))
    assert one.keys() == {"top1"} and two == pytest.approx(one, abs=1e-9)


DISTILL = [
    "run",
    "--task",
    "distill-imagenet",
    "--backbone",
    "vit22b/test",
    "--data",
    "embedded",
    "--set",
    "student=test",
    "--set",
    "steps=4",
    "--set",
    "batch_size=8",
    "--set",
    "warmup=1",
    "--quiet",
]


@pytest.mark.slow  # ~90 s each: in `nox -s slow`; the one-rank paths run by default
def test_distillation_on_two_ranks_equals_one_process(cli_env, data_cache):
    """The teacher sharded (FSDP2 or tensor parallel) while the student trains data-parallel
    in the same job: teacher, distilled and label-only numbers of one process. Mixup pairs
    each image with the one before it in the whole batch, across the ranks' shares."""
    from evalkit.core.results import load_rows

    env = {"EVALKIT_CACHE": str(data_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "evalkit", *DISTILL, "--out", "one", "--cache-dir", "c1"],
        cwd=cli_env,
        env={**os.environ, **env},
        check=True,
        timeout=600,
    )
    one = {r["metric"]: r["value"] for r in load_rows([cli_env / "one"])}
    for name, flags in (("fsdp", ["--fsdp"]), ("tp", ["--tp", "2"])):
        torchrun(
            "-m",
            "evalkit",
            *DISTILL,
            *flags,
            "--out",
            name,
            "--cache-dir",
            f"c-{name}",
            cwd=cli_env,
            env_extra=env,
        )
        rows = {r["metric"]: r["value"] for r in load_rows([cli_env / name])}
        assert rows == pytest.approx(one, rel=1e-4), name


DECODE_SCRIPT = """
import json, os, sys
from pathlib import Path
from evalkit import distributed as mesh, load_backbone
from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.data import DataConfig
from evalkit.data.resolve import open_dataset

mesh.setup(tp=2)
backbone = load_backbone("vit22b/test", random_init=True)
data = open_dataset("imagenet", "val", DataConfig(source="embedded", cache=Path(sys.argv[2])),
                    transform=backbone.transform())
decoded = []
read = type(data).__getitem__
type(data).__getitem__ = lambda self, i: decoded.append(i) or read(self, i)
settings = ExtractSettings(cache_dir=sys.argv[3], workers=0, progress=False, shard_size=128)
request = FeatureRequest(pool="map")
features = extract_features(backbone, data, request=request, settings=settings, split="val")
with open(f"{sys.argv[1]}.{mesh.current().rank}", "w") as f:
    json.dump({"decoded": len(decoded), "rows": len(features.labels)}, f)
mesh.teardown()
"""


def test_a_tensor_parallel_group_decodes_each_image_once(tmp_path, data_cache):
    script = tmp_path / "decode.py"
    script.write_text(DECODE_SCRIPT)
    torchrun(str(script), str(tmp_path / "count"), str(data_cache), str(tmp_path / "cache"))
    counts = [json.loads((tmp_path / f"count.{rank}").read_text()) for rank in (0, 1)]
    assert counts[0]["decoded"] == counts[0]["rows"] > 0  # the group's first rank decodes
    assert counts[1] == {"decoded": 0, "rows": counts[0]["rows"]}  # the other receives them
