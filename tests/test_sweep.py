"""Sweeps: plans from the command line and TOML, jobs skipped when their rows are on disk, the
local and submitit executors end to end, and the Slurm batch script of a dry run."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.reproduction.sweep import Resources, plan_from_args, plan_from_toml

SMALL = ["--task", "imagenet-1shot", "--backbone", "fake", "--data", "embedded", "--out", "sweep"]


def test_plans_from_arguments_and_toml(tmp_path):
    plan = plan_from_args(["a", "b"], ["x"], (0, 1), ["steps=3"])
    assert [(j.task, j.seed) for j in plan.jobs] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(j.overrides == ("steps=3",) for j in plan.jobs)
    toml = tmp_path / "plan.toml"
    toml.write_text(
        'out = "o"\n[[jobs]]\ntask = "imagenet-linear"\nbackbone = ["fake", "timm/x"]\n'
        'seeds = [0, 2]\nset = ["holdout=0.1"]\n'
    )
    plan = plan_from_toml(toml)
    assert len(plan.jobs) == 4 and str(plan.out) == "o"
    assert plan.jobs[-1].backbone == "timm/x" and plan.jobs[-1].seed == 2
    toml.write_text('[[jobs]]\ntask = "a"\nbackbones = "x"\n')
    with pytest.raises(EvalkitError, match="job 1: expected task, backbone"):
        plan_from_toml(toml)
    toml.write_text("[[jobs]\n")
    with pytest.raises(EvalkitError, match="not valid TOML"):
        plan_from_toml(toml)


def test_commands_launch_torchrun_across_gpus_and_nodes():
    one = plan_from_args(["t"], ["b"], (0,))
    assert one.command(one.jobs[0])[1:4] == ["-m", "evalkit", "run"]
    gpus = plan_from_args(["t"], ["b"], (0,), resources=Resources(gpus=8, tp=8))
    command = gpus.command(gpus.jobs[0])
    assert command[:3] == ["torchrun", "--nproc-per-node", "8"] and command[-2:] == ["--tp", "8"]
    nodes = plan_from_args(["t"], ["b"], (0,), resources=Resources(gpus=8, nodes=4))
    line = nodes.command(nodes.jobs[0])[2]
    assert "--nnodes 4" in line and "--rdzv-endpoint" in line


def test_local_sweep_runs_jobs_and_skips_finished_ones(cli_env, capsys):
    assert main(["sweep", *SMALL, "--seeds", "0,1"]) == 0
    rows = [json.loads(x) for x in (cli_env / "sweep/imagenet-1shot.jsonl").open()]
    assert sorted({r["seed"] for r in rows}) == [0, 1]
    capsys.readouterr()
    assert main(["sweep", *SMALL, "--seeds", "0,1"]) == 0
    assert "2 job(s), 2 already done, 0 to run" in capsys.readouterr().out


def test_submitit_local_executor_runs_the_array(cli_env):
    assert main(["sweep", *SMALL, "--seeds", "3", "--executor", "submitit-local"]) == 0
    rows = [json.loads(x) for x in (cli_env / "sweep/imagenet-1shot.jsonl").open()]
    assert {r["seed"] for r in rows} == {3}


def test_slurm_dry_run_prints_the_batch_script(cli_env, capsys):
    args = [
        "sweep",
        "--task",
        "imagenet-linear",
        "--task",
        "ade20k-1/16",
        "--backbone",
        "vit22b",
        "--executor",
        "slurm",
        "--dry-run",
        "--gpus-per-job",
        "8",
        "--tp",
        "8",
        "--partition",
        "gpu",
        "--timeout-min",
        "600",
    ]
    assert main(args) == 0
    script = capsys.readouterr().out
    for line in (
        "#SBATCH --array=0-1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=600",
    ):
        assert line in script
    assert script.count("torchrun --nproc-per-node 8 -m evalkit run") == 2


@pytest.mark.parametrize(
    "options",
    [
        {"partition": "gpu", "gpus_per_node": 8, "mem": "64GB", "time": 600, "cpus_per_task": 10},
        {"partition": None, "gpus_per_node": None, "mem": None, "time": 60, "cpus_per_task": 2},
    ],
)
def test_the_dry_runs_batch_script_is_the_one_submitit_writes(tmp_path, options):
    """The script a dry run prints without submitit is, line for line, the one submitit
    writes when it submits the array."""
    slurm = pytest.importorskip("submitit.slurm.slurm")
    from evalkit.reproduction.sbatch import sbatch_script

    folder = str(tmp_path / "submitit" / "%j")
    common = {"job_name": "evalkit-sweep", "nodes": 1, "ntasks_per_node": 1, **options}
    ours = sbatch_script("cmd a", folder, count=3, parallelism=2, **common)
    theirs = slurm._make_sbatch_string(
        command="cmd a", folder=folder, array_parallelism=2, map_count=3, **common
    )
    assert ours == theirs


def test_sweep_errors(cli_env):
    assert main(["sweep", "--backbone", "fake"]) == 2
    assert main(["sweep", "--task", "imagenet-lineer", "--backbone", "fake"]) == 2
    assert main(["sweep", *SMALL, "--seeds", "a"]) == 2


def test_a_job_finds_rows_under_the_name_its_backbone_gives_them(cli_env, tmp_path):
    from evalkit.reproduction.sweep import Job, Sweep, finished, job_rows, request_key

    plan = Sweep(jobs=(), out=tmp_path, run_args=("--data", "embedded"))
    key = request_key(plan, Job("imagenet-linear", "vit22b"), {})
    assert key == request_key(plan, Job("imagenet-linear", "vit22b/22b"), {})
    row = {"task": "imagenet-linear", "backbone": "vit22b/22b", "seed": 0, "request_key": key}
    lines = [json.dumps(row | {"metric": m, "value": v}) for m, v in (("top1", 1.0), ("top5", 2.0))]
    lines.append(json.dumps(row | {"metric": "top1", "value": 3.0}))  # a later run's row
    (tmp_path / "imagenet-linear.jsonl").write_text("\n".join(lines) + "\n")
    assert finished(plan, Job("imagenet-linear", "vit22b"))  # rows say vit22b/22b
    assert {r["metric"]: r["value"] for r in job_rows(plan, Job("imagenet-linear", "vit22b"))} == {
        "top1": 3.0,
        "top5": 2.0,
    }
    assert not finished(plan, Job("imagenet-linear", "vit22b/e"))


@pytest.mark.parametrize("task", ["imagenet-knn[ks=20]", "adek20k-1/16"])
def test_a_job_named_with_settings_or_an_alias_reads_the_rows_file_of_its_task(
    cli_env, tmp_path, task
):
    """A task named with inline settings or by an alias writes the rows file of the task it
    resolves to; the cell looks there, or a sweep would rerun it for ever."""
    from evalkit.core.catalog import resolve_task
    from evalkit.core.results import rows_file
    from evalkit.reproduction.sweep import Job, Sweep, finished, request_key

    plan = Sweep(jobs=(), out=tmp_path, run_args=("--data", "embedded"))
    job = Job(task, "fake")
    row = {"task": resolve_task(task).name, "backbone": "fake", "seed": 0}
    row["request_key"] = request_key(plan, job, {})
    metrics = resolve_task(task).metrics()
    lines = [json.dumps(row | {"metric": m, "value": 1.0}) for m in metrics]
    rows_file(tmp_path, resolve_task(task).name).write_text("\n".join(lines) + "\n")
    assert finished(plan, job)


def test_a_job_run_with_every_keyed_option_is_seen_as_finished(cli_env, data_cache):
    """The sweep reads a job's key off the job's own command line: every run option that
    reaches the rows' request key (decoder, dtypes, data, model options, task settings given
    to the whole plan) is the one the run itself used, so a finished job is not relaunched."""
    from evalkit.reproduction.sweep import Job, Sweep, finished

    run_args = (
        *("--data", "embedded", "--cache-dir", str(data_cache), "--verify-data"),
        *("--decoder", "pil", "--pixels", "decode", "--device", "cpu", "--cache-dtype", "bf16"),
        *("--model-arg", "depth=2", "--random-init", "--set", "l2=512"),
    )
    plan = Sweep(jobs=(), out=cli_env / "sweep", run_args=run_args)
    job = Job("imagenet-1shot", "fake", seed=2, overrides=("seeds=2",))
    assert not finished(plan, job)
    assert main(plan.command(job)[3:]) == 0  # the job's own `evalkit run ...`
    assert finished(plan, job)
    for changed in (("--decoder", "tensor"), ("--set", "l2=256"), ("--dtype", "bf16")):
        other = Sweep(jobs=(), out=plan.out, run_args=(*run_args, *changed))
        assert not finished(other, job), changed


def test_a_jobs_key_takes_the_dtype_of_its_machines_device(cli_env, monkeypatch):
    """The job's device is its machine's: a plan naming cuda, or giving its jobs GPUs, keys
    the job's rows with a GPU's dtype, even where the plan is read on a machine without one."""
    from evalkit.reproduction.sweep import Job, Sweep, request_key

    monkeypatch.delenv("EVALKIT_DEVICE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # this machine: no GPU
    job, data = Job("imagenet-linear", "fake"), ("--data", "embedded")

    def key(*run_args, **plan):
        return request_key(
            Sweep(jobs=(), out=cli_env, run_args=(*data, *run_args), **plan), job, {}
        )

    gpu = key("--dtype", "bf16")
    assert key("--device", "cuda") == gpu
    assert key(resources=Resources(gpus=1)) == gpu
    assert key("--device", "cpu") == key() == key("--dtype", "fp32") != gpu
