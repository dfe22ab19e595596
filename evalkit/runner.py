"""Run one task on one backbone and write its rows with provenance.

A run is identified by (task, task version, backbone, weights id, resolved config, seed). Rows
are appended as each metric finishes; a rerun skips a run whose metrics are all on disk unless
``force`` is set. Extracted features live in the feature cache, so a run that crashed resumes
from its finished shards.
"""

from __future__ import annotations

import functools
import hashlib
import json
import resource
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from evalkit.catalog import TASKS
from evalkit.parallel import mesh
from evalkit.results import Row, append_row, load_rows, rows_file
from evalkit.task import Task, TaskContext


def resolve_task(name: str, overrides: list[str] | None = None) -> Task:
    entry = TASKS.get(name)
    task = entry.load()()
    return task.with_overrides(list(overrides or []))


def alias_note(name: str) -> str | None:
    """A note when ``name`` is an alias, naming the real task."""
    entry = TASKS.get(name)
    return f"{name!r} is an alias of {entry.alias_of!r}" if entry.alias_of else None


def hash_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_task(
    task: Task, backbone, ctx: TaskContext, *, out_dir: Path, force: bool = False
) -> tuple[list[Row], bool]:
    """Run ``task`` on ``backbone``; returns (rows, skipped)."""
    config = task.config()
    config_hash = hash_json(config)
    info = backbone.info
    run_key = hash_json(
        [task.name, task.version, info.name, info.weights_id, config_hash, ctx.seed]
    )
    path = rows_file(out_dir, task.name)
    done = [r for r in load_rows([path]) if r.get("run_key") == run_key] if path.exists() else []
    mesh.barrier()  # every rank has decided before rank 0 appends anything
    if not force and {r["metric"] for r in done} >= set(task.metrics()):
        return done, True
    start = time.perf_counter()
    ctx.artifacts = Path(out_dir) / "pictures"
    rows = []
    for metric in task.run(backbone, ctx):
        row: Row = {
            "task": task.name,
            "task_version": task.version,
            "backbone": info.name,
            "weights_id": info.weights_id,
            "random_init": info.random_init,
            "metric": metric.metric,
            "value": metric.value,
            "stderr": metric.stderr,
            "higher_is_better": metric.higher_is_better,
            "n": metric.n,
            "seeds": metric.seeds,
            "seed": ctx.seed,
            "config": config,
            "config_hash": config_hash,
            "run_key": run_key,
            "data_id": dict(ctx.stats["data"]),
            "extra": metric.extra,
            "provenance": provenance(ctx, wall_s=time.perf_counter() - start),
        }
        if mesh.current().main:
            append_row(path, row)
        rows.append(row)
    return rows, False


def provenance(ctx: TaskContext, *, wall_s: float) -> dict:
    seconds = ctx.stats["seconds"]
    return {
        **environment(),
        "device": ctx.extract.device,
        "dtype": ctx.extract.dtype,
        "wall_s": round(wall_s, 3),
        "images_per_s": round(ctx.stats["images"] / seconds, 2) if seconds else None,
        "peak_mem_mb": peak_memory_mb(ctx.extract.device),
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


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda") and torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
