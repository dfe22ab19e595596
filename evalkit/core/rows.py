"""What a result row records: the metric and its interval, the task and its settings, the
backbone and its weights, the data it was computed on (named as views show it, stand-in data
marked), the paper's numbers it sits beside, the run keys, and the provenance of the machine and
libraries that computed it (``docs/results.md``, "Result rows")."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from evalkit.core.catalog import resolve_task
from evalkit.core.numerics import numerics, peak_memory_mb
from evalkit.core.results import Row
from evalkit.core.task import Task, TaskContext
from evalkit.data.resolve import hub_source, is_stand_in
from evalkit.seeds import SEED_RULE


def hash_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_row(task: Task, info, metric, ctx: TaskContext, *, key: str) -> Row:
    return {
        "task": task.name,
        "task_version": task.version,
        "backbone": info.name,
        "weights_id": info.weights_id,
        "weights_source": info.source,  # hub repository@commit, local file, or random init
        "backbone_options": info.options,
        "random_init": info.random_init,
        "metric": metric.metric,
        "value": metric.value,
        "stderr": metric.stderr,
        "std": metric.std,
        "higher_is_better": metric.higher_is_better,
        "n": metric.n,
        "seeds": list(metric.seeds) if metric.seeds is not None else [ctx.seed],
        "seed": ctx.seed,
        "seed_rule": SEED_RULE,  # how its draws were seeded (evalkit.seeds): views keep rules apart
        "config": task.config(),
        "config_hash": hash_json(task.config()),
        "run_key": key,
        "request_key": ctx.request_key,
        "data_id": dict(ctx.stats["data"]),  # per split: its files, labels and how they are read
        # the files alone, as the job's request walked them (never walked again here)
        "data_files": {name: ctx.identities.get(name) for name in task.datasets()},
        "decoder": ctx.stats.get("decoder"),  # of the image files read (None: no evaluation view)
        "dataset": (dataset := dataset_record(task, ctx)),
        "paper": dict(task.reference.get(metric.metric, {})) if dataset["own"] else {},
        **({"data_source": source} if (source := hub_source(task.config().get("dataset"))) else {}),
        "extra": metric.extra,
        "sources": {"features": sorted(ctx.stats.get("features", ()))},  # when: provenance
    }


def dataset_record(task: Task, ctx: TaskContext) -> dict:
    """The data a row was computed on, as views name it: the dataset(s) read, whether they are
    the task's own (``--set dataset=`` changes them) and whether they are evalkit's embedded
    stand-in rather than the real set (a number on it is not the real set's number)."""
    names = task.datasets()
    return {
        "name": "+".join(names),
        "own": names == resolve_task(task.name).datasets(),
        "stand_in": any(is_stand_in(name, ctx.data) for name in names),
    }


def provenance(ctx: TaskContext, *, wall_s: float) -> dict:
    seconds = ctx.stats["seconds"]
    return {
        **environment(),
        **numerics(),
        "device": ctx.device,
        "dtype": ctx.extract.dtype,
        "cache_dtype": ctx.extract.cache_dtype,
        "batch_size": ctx.extract.limit.used(ctx.extract.batch_size),  # after any back-off
        "wall_s": round(wall_s, 3),
        "images_extracted": ctx.stats["images"],  # this job's own forward passes
        "images_per_s": round(ctx.stats["images"] / seconds, 2) if seconds else None,
        "peak_mem_mb": peak_memory_mb(ctx.device),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@functools.cache
def environment() -> dict:
    def pkg(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "evalkit": pkg("evalkit"),
        "git_sha": git_sha(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "timm": pkg("timm"),
        "open_clip": pkg("open_clip_torch"),
    }


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
