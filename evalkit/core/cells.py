"""The unit of work: a cell, one (backbone setup, seed, task) of a ``RunSpec``, and its keys.
``cells_of`` lists a spec's cells in the runner's order; ``request_spec`` is what a cell asks
for, known before its backbone loads (its key, ``request_key_of``, is carried by its rows), so
``finished`` tells a cell whose rows are all on disk without loading a model. A zoo's cells are
cut into shares (``shard_asked`` reads ``--shard`` or the engine's array index, ``share`` cuts
by the features the cells read, ``study_record`` names every cell for ``evalkit merge``), and
``job_lock`` keeps two processes from running one job on one ``--out`` at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
from pathlib import Path

from evalkit import distributed
from evalkit.backbones import row_name, row_weights_id
from evalkit.core.catalog import resolve_task
from evalkit.core.results import load_rows, rows_file
from evalkit.core.spec import RunSpec
from evalkit.core.task import Task, TaskContext, rows_complete
from evalkit.errors import EvalkitError, warn
from evalkit.seeds import SEED_RULE
from evalkit.storage.identity import library_versions, spec_key
from evalkit.storage.writes import locked_file


def shard_asked(text: str | None, environ: dict) -> tuple[int, int] | None:
    """The share of a zoo's cells this process runs, as (index, count): ``--shard I/N`` (I
    from 0), else what the engine that started it says — a Slurm array task (its position in
    the array: ``SLURM_ARRAY_TASK_ID`` counted from ``SLURM_ARRAY_TASK_MIN`` in steps of
    ``SLURM_ARRAY_TASK_STEP``, over ``SLURM_ARRAY_TASK_COUNT`` tasks or the array's
    min…max) or a Kubernetes Indexed Job pod (``JOB_COMPLETION_INDEX``, over
    ``EVALKIT_SHARDS``, the job's completions) — else None: every cell. A bad value is one
    line naming the variable it came from."""
    if text is not None:
        return _parsed_shard(text, "--shard")
    if "SLURM_ARRAY_TASK_ID" in environ:
        return _slurm_share(environ)
    if "JOB_COMPLETION_INDEX" in environ:
        if "EVALKIT_SHARDS" not in environ:
            raise EvalkitError(
                "JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job) but not EVALKIT_SHARDS: "
                "set it to the job's completions in the pod's env, or pass --shard I/N"
            )
        index, count = (
            _env_int(environ, name) for name in ("JOB_COMPLETION_INDEX", "EVALKIT_SHARDS")
        )
        return _parsed_shard(f"{index}/{count}", "JOB_COMPLETION_INDEX/EVALKIT_SHARDS")
    if "EVALKIT_SHARDS" in environ:
        raise EvalkitError(
            f"EVALKIT_SHARDS={environ['EVALKIT_SHARDS']} is set but not JOB_COMPLETION_INDEX, "
            "which says which share this process runs (a Kubernetes Indexed Job sets it): "
            "every process would run every cell; pass --shard I/N or unset EVALKIT_SHARDS"
        )
    return None


SLURM = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP")


def _slurm_share(environ: dict) -> tuple[int, int]:
    """A Slurm array task's position in its array and the array's size. A stepped array
    (``--array=0-8:2``) counts in steps; a list (``--array=1,5,7``) has no position that
    Slurm's variables tell, and is refused."""
    task, first = _env_int(environ, SLURM[0]), _env_int(environ, SLURM[1], 0)
    step = _env_int(environ, SLURM[2], 1) or 1
    last = _env_int(environ, "SLURM_ARRAY_TASK_MAX", None)
    count = _env_int(environ, "SLURM_ARRAY_TASK_COUNT", None)
    if count is None and last is None:
        raise EvalkitError(
            "SLURM_ARRAY_TASK_ID is set but not the array's size (SLURM_ARRAY_TASK_COUNT or "
            "SLURM_ARRAY_TASK_MAX): pass --shard I/N"
        )
    spanned = (last - first) // step + 1 if last is not None else None
    count = count if count is not None else spanned
    position, off_step = divmod(task - first, step)
    if count == 1 and task != 0:  # one index of a larger array submitted again
        raise EvalkitError(
            f"this Slurm array has one task (SLURM_ARRAY_TASK_ID={task}): an index of a larger "
            "array submitted again does not say how many shares there are; pass --shard "
            f"{task}/N with the first array's size N"
        )
    if off_step or not 0 <= position < count or (spanned is not None and spanned != count):
        read = ", ".join(
            f"{n}={environ[n]}"
            for n in (*SLURM, "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT")
            if n in environ
        )
        raise EvalkitError(
            f"this Slurm array task's position cannot be told from {read}: an array of ids "
            "that are not evenly spaced (--array=1,5,7) has none; submit --array=0-N-1 (or "
            "A-B:STEP), or pass --shard I/N"
        )
    return _parsed_shard(f"{position}/{count}", "the Slurm array")


def _env_int(environ: dict, name: str, default=...) -> int | None:
    """An integer environment variable, or one line naming it when it is not one."""
    if name not in environ:
        if default is ...:
            raise EvalkitError(f"{name} is not set")
        return default
    try:
        return int(environ[name])
    except ValueError:
        raise EvalkitError(
            f"{name}={environ[name]!r}: expected a whole number (it says which share of the "
            "cells this process runs); fix the variable or pass --shard I/N"
        ) from None


def _parsed_shard(text: str, source: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    try:
        shard = int(index), int(count)
    except ValueError:
        shard = (-1, 0)
    if not 0 <= shard[0] < shard[1]:
        given = f"--shard {text}" if source == "--shard" else f"{source} gives {text}"
        raise EvalkitError(f"{given}: expected I/N with 0 ≤ I < N, e.g. --shard 0/4")
    return shard


def cells_of(spec: RunSpec) -> list[tuple[str, int, str]]:
    """Every (backbone, seed, task) cell of a spec, in the order the runner runs them."""
    backbones = spec.backbones or _no_backbone(
        [resolve_task(t, spec.overrides) for t in spec.tasks]
    )
    return [(name, seed, task) for name in backbones for seed in spec.seeds for task in spec.tasks]


def share(specs: list[RunSpec], shard: tuple[int, int]) -> tuple[list[RunSpec], dict, dict]:
    """The specs of a zoo cut to the ``shard`` = (index, count) share of its cells (cut by
    the features they read: ``shares_by_features``), then the cells of the share whose rows
    are on disk are left out, so a rerun of the same array does only what is left.
    The share is cut from every cell, not from those left, since array tasks start at
    different times: a share cut from what one of them saw left could miss a cell another
    took for its own. Returns the specs (each with its ``cells``; a spec with none is
    dropped), the counts, and the study's record (``study_record``)."""
    index, count = shard
    everything = [(number, cell) for number, spec in enumerate(specs) for cell in cells_of(spec)]
    identities: dict = {}  # each data set identified once, for the record and the done cells
    read: dict = {}  # rows file → its rows: each read once however many cells it holds
    cut = shares_by_features(everything, count)
    record = study_record(specs, everything, cut, identities) | {"share": index}
    share_ = [everything[i] for i in cut[index]]
    mine = [(n, cell) for n, cell in share_ if not finished(specs[n], cell, identities, read)]
    kept = [
        dataclasses.replace(spec, cells=frozenset(cell for n, cell in mine if n == number))
        for number, spec in enumerate(specs)
    ]
    counts = {"cells": len(everything), "share": len(share_), "mine": len(mine)}
    return [spec for spec in kept if spec.cells], counts, record


def shares_by_features(cells: list[tuple[int, tuple]], count: int) -> list[list[int]]:
    """The positions in ``cells`` ((spec number, (backbone, seed, task)), in the runner's
    order) of each of ``count`` shares. The cells of one backbone setup read the same
    features, so they go to one share together, and each setup's features are extracted on
    one machine only; setups are dealt largest first to the share with the fewest cells (a
    cell is the unit of cost), and a setup is split only when there are fewer setups than
    shares. Every process computes the same cut from the same zoo."""
    groups: dict[tuple, list[int]] = {}
    for position, (number, cell) in enumerate(cells):
        groups.setdefault((number, cell[0]), []).append(position)
    units = list(groups.values())
    while len(units) < count and any(len(unit) > 1 for unit in units):
        largest = max(units, key=len)
        units.remove(largest)
        units += [largest[: len(largest) // 2], largest[len(largest) // 2 :]]
    shares: list[list[int]] = [[] for _ in range(count)]
    for unit in sorted(units, key=lambda u: (-len(u), u[0])):
        smallest = min(range(count), key=lambda i: (len(shares[i]), i))
        shares[smallest] += unit
    return [sorted(positions) for positions in shares]


def study_record(specs: list[RunSpec], everything: list, cut: list, identities: dict) -> dict:
    """What a share belongs to, kept beside its rows (``<out>/shares/``): every cell of the
    study (``everything``, as ``share`` lists them), named as rows and failure records name
    them, the share each cell went to (``cut``) and the count, so a merge can tell which
    cells no merged share delivered. ``share`` adds the share's own index."""
    described = [_described(specs[number], cell, identities) for number, cell in everything]
    share_of = [0] * len(everything)
    for index, positions in enumerate(cut):
        for position in positions:
            share_of[position] = index
    return {
        "study": spec_key({"cells": described}, length=16),
        "of": len(cut),
        "cells": described,
        "share_of": share_of,
    }


def _described(spec: RunSpec, cell: tuple[str, int, str], identities: dict) -> dict:
    """A cell as its rows will name it: the request key they carry (settings, weights and
    data included), and for people the task, backbone, seed, options and weights."""
    name, seed, task_name = cell
    return {
        "request_key": request_key_of(spec, cell, identities),
        "task": resolve_task(task_name, spec.overrides).name,
        "asked": task_name,
        "backbone": name,
        "seed": seed,
        "options": dict(spec.model_args),
        "weights": spec.weights,
    }


def request_key_of(spec: RunSpec, cell: tuple[str, int, str], identities: dict) -> str | None:
    """The request key the rows of ``cell`` carry (task and settings, backbone and options,
    weights, data, seed: ``request_spec``), known before its backbone is built; None where
    its data cannot be read here."""
    name, seed, task_name = cell
    task = resolve_task(task_name, spec.overrides)
    try:
        return request_key(spec, task, name, spec.context(seed, identities))
    except EvalkitError:
        return None


def cell_rows(spec: RunSpec, cell: tuple[str, int, str], identities: dict, read: dict) -> list:
    """The newest row of each metric of ``cell`` on disk under its request's key (known before
    its backbone is built); none where its data cannot be read here. ``read`` keeps each rows
    file's rows once read."""
    path = rows_file(spec.out, resolve_task(cell[2], spec.overrides).name)  # as the runner
    if not path.exists():
        return []
    key = request_key_of(spec, cell, identities)
    if key is None:
        return []  # its data cannot be read here: the cell runs and says why
    if path not in read:
        read[path] = load_rows([path])
    return list({r["metric"]: r for r in read[path] if r.get("request_key") == key}.values())


def finished(spec: RunSpec, cell: tuple[str, int, str], identities: dict, read: dict) -> bool:
    """Whether every metric of ``cell`` has its row on disk under the cell's request key: what
    ``--shard``, ``evalkit sweep`` and ``evalkit reproduce`` skip."""
    task = resolve_task(cell[2], spec.overrides)
    return rows_complete(task.metrics(), cell_rows(spec, cell, identities, read))


def _no_backbone(tasks: list[Task]) -> tuple[str, ...]:
    """Runs without ``--backbone``: only tasks that train their own models may."""
    needing = [task.name for task in tasks if not task.trains_own_model]
    if needing:
        raise EvalkitError(
            f"{needing[0]} needs a backbone: pass --backbone, e.g. timm/vit_tiny_patch16_224"
        )
    return ("none",)


def request_key(spec: RunSpec, task: Task, backbone: str, ctx: TaskContext) -> str:
    """The key of ``request_spec``: what a cell's rows carry as ``request_key``, the one place
    it is made."""
    return spec_key(request_spec(spec, task, backbone, ctx), length=16)


def request_spec(spec: RunSpec, task: Task, backbone: str, ctx: TaskContext) -> dict:
    """What a job is asked for, known before its backbone loads: the task (name, version,
    settings), the backbone's name and options, the weights' content id (or how untrained
    weights are seeded), dtypes, library versions, data files and seed. Rows carry its key, so
    a sweep can tell a finished job without loading a model; the job itself still compares the
    whole ``job_spec`` (which adds what the loaded backbone reports: preprocessing, ...)."""
    return {
        "task": task.name,
        "version": task.version,
        "config": task.config(),
        "backbone": row_name(backbone),
        "weights": _weights_asked(spec, backbone, ctx.seed),
        "model_args": dict(sorted(spec.model_args.items())),
        "dtype": ctx.extract.dtype,
        "cache_dtype": ctx.extract.cache_dtype,
        "decoder": ctx.data.decoder,
        "libraries": library_versions(row_name(backbone)),
        "data": {name: ctx.data_identity(name) for name in task.datasets()},
        "seed": ctx.seed,
        "seed_rule": SEED_RULE,
    }


def _weights_asked(spec: RunSpec, backbone: str, seed: int) -> str:
    if spec.weights:
        return row_weights_id(backbone, spec.weights)
    if spec.pretrained:
        return "pretrained"  # the hub file's content id is in the job's own key
    return f"random-init:{seed}:{spec.random_init}"


@contextlib.contextmanager
def job_lock(out_dir: Path, key: str):
    """An exclusive ``flock`` on ``<out>/.locks/<run key>.lock`` while one process runs the
    job (the kernel releases it when the process dies, so a killed run blocks nothing); the
    file is removed when the job ends, so finished runs leave no lock files behind. Under
    torchrun the ranks of one job decide together, and no lock is taken."""
    if distributed.current().mesh is not None:
        yield
        return
    folder = Path(out_dir) / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.lock"
    handle = _locked(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: a waiter then sees a stale file
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when no other job holds a lock there


def _locked(path: Path):
    """``path`` opened and exclusively locked, saying so while another process holds it; a
    file removed by its last holder while this process waited is stale, and the lock is
    taken again on the file now at ``path``."""
    return locked_file(path, take=lambda handle: wait_for_lock(handle, path))


def wait_for_lock(handle, path: Path):
    """Take the job's lock; while another process holds it, say so in one line first, since
    the wait may last as long as that process's job."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        warn(
            f"waiting for another run of this job to finish (it holds {path}); its rows are "
            "then reused"
        )
    fcntl.flock(handle, fcntl.LOCK_EX)
