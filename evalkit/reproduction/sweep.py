"""Sweeps: a plan of (task, backbone, settings, seed) jobs, run one after another on this
machine or submitted to a Slurm cluster through submitit (docs/architecture.md, "Sweeps").

A plan comes from the command line (``--task A --task B --backbone X --seeds 0,1,2``) or a
TOML file (``[[jobs]]`` tables with ``task``, ``backbone``, ``seeds``, ``set``, ``weights``;
task and backbone may be lists). Every job is one ``evalkit run`` command: in its own process
(``torchrun`` when it spans several GPUs), so a job that crashes or runs out of memory leaves
the others running, and the rows it finished stay on disk. Jobs whose rows are already under
the output folder with the job's request key (task and settings, backbone and options, weights
content, dtypes, library versions, data files, seed: ``cells.request_spec``) are not started
again; the job itself still compares the full run key and reruns what changed.

Executors: ``local`` (sequential, the default), ``slurm`` (one job array, GPUs and nodes per
job, torchrun inside a job for sharded backbones; ``--dry-run`` prints the batch script instead
of submitting it) and ``submitit-local`` (submitit's local executor: the Slurm code path on one
machine, for tests and debugging).
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from evalkit.device import CPUS_PER_GPU
from evalkit.errors import EvalkitError

EXECUTORS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class Job:
    task: str
    backbone: str
    seed: int = 0
    overrides: tuple[str, ...] = ()
    weights: str | None = None
    # this job's own, instead of the plan's (not part of which job it is)
    resources: Resources | None = field(default=None, compare=False)

    def label(self) -> str:
        settings = f" [{', '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.task} × {self.backbone} seed {self.seed}{settings}"


@dataclass(frozen=True)
class Resources:
    """What each job gets on a cluster, and how it is launched there."""

    gpus: int = 0  # per job: > 1 runs the job under torchrun with that many processes
    nodes: int = 1
    tp: int = 1  # tensor-parallel size passed to evalkit run
    fsdp: bool = False
    partition: str | None = None
    timeout_min: int = 240
    cpus_per_task: int | None = None  # default: CPUS_PER_GPU for each GPU, 8 without one
    mem_gb: int | None = None
    array_parallelism: int = 32

    @property
    def cpus(self) -> int:
        """CPUs asked per job: its decoding workers run on them (``evalkit.data.feeding``)."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return CPUS_PER_GPU * self.gpus if self.gpus else 8


@dataclass(frozen=True)
class Sweep:
    jobs: tuple[Job, ...]
    out: Path = Path("results/sweep")
    run_args: tuple[str, ...] = ()  # options every job's `evalkit run` gets (--data, ...)
    resources: Resources = field(default_factory=Resources)

    def resources_of(self, job: Job) -> Resources:
        return job.resources or self.resources

    def groups(self, jobs: list[Job]) -> dict[Resources, list[Job]]:
        """Jobs by the resources they get: one job array each."""
        grouped: dict[Resources, list[Job]] = {}
        for job in jobs:
            grouped.setdefault(self.resources_of(job), []).append(job)
        return grouped

    def run_arguments(self, job: Job) -> list[str]:
        """The job's ``evalkit run`` arguments (``run`` first), whatever launches them."""
        args = [
            "run",
            "--task",
            job.task,
            "--backbone",
            job.backbone,
            "--seed",
            str(job.seed),
            "--out",
            str(self.out.absolute()),
            "--quiet",
            *self.run_args,
        ]
        for override in job.overrides:
            args += ["--set", override]
        if job.weights:
            args += ["--weights", job.weights]
        r = self.resources_of(job)
        if r.tp > 1:
            args += ["--tp", str(r.tp)]
        if r.fsdp:
            args += ["--fsdp"]
        return args

    def command(self, job: Job) -> list[str]:
        """The job's command line: ``python -m evalkit run ...`` or, across GPUs, torchrun."""
        args, r = self.run_arguments(job), self.resources_of(job)
        if r.nodes > 1:  # one torchrun per node, meeting at the job's first node
            rendezvous = (
                "--rdzv-id $SLURM_JOB_ID --rdzv-backend c10d --rdzv-endpoint "
                "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1):29500"
            )
            line = (
                f"torchrun --nnodes {r.nodes} --nproc-per-node {max(1, r.gpus)} {rendezvous} "
                f"-m evalkit {shlex.join(args)}"
            )
            return ["bash", "-c", line]
        if r.gpus > 1:
            return ["torchrun", "--nproc-per-node", str(r.gpus), "-m", "evalkit", *args]
        return [sys.executable, "-m", "evalkit", *args]


def plan_from_args(tasks, backbones, seeds, overrides=(), weights=None, **plan) -> Sweep:
    """Every (task, backbone, seed) of the lists, with the same settings."""
    if not tasks or not backbones:
        raise EvalkitError("a sweep needs at least one --task and one --backbone (or --plan FILE)")
    jobs = tuple(
        Job(t, b, s, tuple(overrides), weights)
        for t, b, s in itertools.product(tasks, backbones, seeds)
    )
    return Sweep(jobs=jobs, **plan)


def plan_from_toml(path: Path, **plan) -> Sweep:
    """A TOML plan: ``[[jobs]]`` tables; top-level ``out`` and ``run_args`` may be given."""
    try:
        spec = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise EvalkitError(f"no plan file {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EvalkitError(f"plan {path} is not valid TOML: {exc}") from None
    entries = spec.get("jobs")
    if not entries:
        raise EvalkitError(f"plan {path} has no [[jobs]]: each needs task and backbone")
    jobs = []
    for number, entry in enumerate(entries, 1):
        unknown = set(entry) - {"task", "backbone", "seeds", "set", "weights"}
        if unknown or "task" not in entry or "backbone" not in entry:
            raise EvalkitError(
                f"plan {path}, job {number}: expected task, backbone and optionally seeds, set, "
                f"weights; got {', '.join(sorted(entry))}"
            )
        for task, backbone, seed in itertools.product(
            _listed(entry["task"]), _listed(entry["backbone"]), _listed(entry.get("seeds", 0))
        ):
            jobs.append(
                Job(
                    task,
                    backbone,
                    int(seed),
                    tuple(_listed(entry.get("set", []))),
                    entry.get("weights"),
                )
            )
    if "out" in spec:
        plan["out"] = Path(spec["out"])
    plan["run_args"] = (*tuple(spec.get("run_args", ())), *plan.get("run_args", ()))
    return Sweep(jobs=tuple(jobs), **plan)


def _listed(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def check(plan: Sweep):
    """Unknown task names and settings, and run options the run would refuse, fail before
    anything starts."""
    for job in plan.jobs:
        job_task(plan, job)


def job_task(plan: Sweep, job: Job, spec=None):
    """The task as the job's run resolves it: with the settings of the plan's ``--set`` and
    the job's own (``spec``: the job's ``RunSpec`` when the caller has it)."""
    from evalkit.core.runner import resolve_task

    spec = spec or job_run_spec(plan, job)
    return resolve_task(job.task, spec.overrides)


def finished(plan: Sweep, job: Job, read: dict | None = None) -> bool:
    """Rows of every metric of ``job`` are already under the plan's output folder: the cell's
    own rule (``cells.finished``), on the ``RunSpec`` of the job's run line."""
    from evalkit.core.cells import finished as cell_finished

    read = {} if read is None else read
    return cell_finished(
        job_run_spec(plan, job), job_cell(job), read.setdefault("identities", {}), read
    )


def job_rows(plan: Sweep, job: Job, read: dict | None = None) -> list[dict]:
    """The newest row of each metric of ``job`` under the plan's output folder whose request
    key is the one the job's run would give them (``cells.cell_rows``). ``read`` keeps each
    rows file read, and each dataset walked, once."""
    from evalkit.core.cells import cell_rows

    read = {} if read is None else read
    return cell_rows(
        job_run_spec(plan, job), job_cell(job), read.setdefault("identities", {}), read
    )


def request_key(plan: Sweep, job: Job, identities: dict) -> str | None:
    """The key ``evalkit run`` gives the rows of ``job`` (``cells.request_key_of``)."""
    from evalkit.core.cells import request_key_of

    return request_key_of(job_run_spec(plan, job), job_cell(job), identities)


def job_cell(job: Job) -> tuple[str, int, str]:
    """The (backbone, seed, task) cell ``job`` runs, as the runner names it."""
    return (job.backbone, job.seed, job.task)


def job_run_spec(plan: Sweep, job: Job):
    """The ``RunSpec`` of a job's ``evalkit run`` line, read off that line by the run's own
    parser (``core.run_options``), so every option that reaches the key is the run's."""
    from evalkit.core.run_options import parse_run, run_spec

    args = parse_run(plan.run_arguments(job)[1:])
    args.dtype = args.dtype or _job_default_dtype(plan, job, args.device)
    # the device is the job's machine's, not this one's (which need not have it): only the
    # dtype it implies reaches the key
    args.device = None
    return run_spec(args)


def _job_default_dtype(plan: Sweep, job: Job, device: str | None) -> str | None:
    """The dtype the job's run defaults to where it is known here: that of its ``--device``
    (or of ``EVALKIT_DEVICE``, which the job inherits), or of a GPU when the job is given
    GPUs; ``None`` (this machine's default) otherwise."""
    from evalkit.device import default_dtype

    gpu = "cuda" if plan.resources_of(job).gpus else None
    device = device or os.environ.get("EVALKIT_DEVICE") or gpu
    return default_dtype(device) if device else None


def pending(plan: Sweep) -> list[Job]:
    read = {}
    return [job for job in plan.jobs if not finished(plan, job, read)]


def run_local(plan: Sweep, jobs: list[Job], echo=print) -> list[tuple[Job, int]]:
    """Each job in its own process, one after another; returns (job, exit code) pairs."""
    results = []
    for number, job in enumerate(jobs, 1):
        echo(f"[{number}/{len(jobs)}] {job.label()}")
        results.append((job, subprocess.run(plan.command(job)).returncode))
    return results


def submit(plan: Sweep, jobs: list[Job], *, cluster: str):
    """One submitit job array per kind of resources (``cluster``: slurm or local); returns
    submitit's jobs in the order of ``jobs``."""
    import submitit

    submitted = {}
    for resources, group in plan.groups(jobs).items():
        executor = submitit.AutoExecutor(folder=plan.out / "submitit" / "%j", cluster=cluster)
        executor.update_parameters(**_parameters(resources, cluster))
        with executor.batch():
            handles = [
                executor.submit(submitit.helpers.CommandFunction(plan.command(job)))
                for job in group
            ]
        submitted |= dict(zip(group, handles, strict=True))
    return [submitted[job] for job in jobs]


def _parameters(r: Resources, cluster: str) -> dict:
    params = {
        "timeout_min": r.timeout_min,
        "nodes": r.nodes,
        "tasks_per_node": 1,
        "name": "evalkit-sweep",
    }
    if cluster == "slurm":
        params |= {
            "gpus_per_node": r.gpus,
            "cpus_per_task": r.cpus,
            "slurm_array_parallelism": r.array_parallelism,
        }
        if r.partition:
            params["slurm_partition"] = r.partition
        if r.mem_gb:
            params["mem_gb"] = r.mem_gb
    return params


def batch_script(plan: Sweep, jobs: list[Job]) -> str:
    """The Slurm batch script of each job array, as submitit would write it, each followed by
    the command each of its array tasks runs (``--dry-run``)."""
    return "\n".join(_array_script(plan, r, group) for r, group in plan.groups(jobs).items())


def _array_script(plan: Sweep, r: Resources, jobs: list[Job]) -> str:
    from evalkit.reproduction.sbatch import sbatch_script  # a dry run needs no submitit

    script = sbatch_script(
        "<each array task runs its command below>",
        str(plan.out / "submitit" / "%j"),
        count=len(jobs),
        parallelism=r.array_parallelism,
        job_name="evalkit-sweep",
        partition=r.partition,
        time=r.timeout_min,
        nodes=r.nodes,
        ntasks_per_node=1,
        cpus_per_task=r.cpus,
        gpus_per_node=r.gpus or None,
        mem=f"{r.mem_gb}GB" if r.mem_gb else None,
    )
    tasks = [f"# task {i}: {shlex.join(plan.command(job))}" for i, job in enumerate(jobs)]
    return script + "\n" + "\n".join(tasks) + "\n"
