"""The one driver: ``run(spec)`` runs every (task, backbone, seed) of a ``RunSpec`` and yields
its rows. The command line and ``evalkit.run()`` are thin faces over it.

The runner owns the defaults (device, dtype, cache folder), the process layout (set up before the
first job and torn down in ``finally``), loading each backbone once (once per seed when its
weights are random: a job is its own inputs), and a fresh ``TaskContext`` per job, so a job's
provenance counts only its own images. A job is identified by the key of its ``job_spec`` (task
and settings, backbone and options, weights, dtypes, data, seed); a job's rows are appended
together when it finishes, and a rerun skips a job whose metrics are all on disk under that key
unless ``rerun`` is set. A job that ``evalkit.core.costs`` says does not fit this
machine is refused before it starts (``force`` runs it). Extracted features live in the feature cache, so
a job that crashed resumes from its finished shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from evalkit import distributed, tracking
from evalkit.backbones import (
    BackboneOptions,
    check_backbone_model,
    load_backbone,
    row_name,
    row_weights_id,
)
from evalkit.batching import job_limits
from evalkit.cache.features import STORAGE, ExtractSettings
from evalkit.core.catalog import TASKS, resolve_task, task_settings
from evalkit.core.costs import auto_batch_size, unfit
from evalkit.core.numerics import reset_peak_memory, run_numerics
from evalkit.core.results import (
    FAILED,
    Row,
    append_rows,
    holds_run_key,
    load_rows,
    predictions_file,
    replace_rows,
    rows_file,
)
from evalkit.core.rows import make_row, provenance
from evalkit.core.suites import expand
from evalkit.core.task import Task, TaskContext, job_spec, rows_complete
from evalkit.data import DECODERS, PIXELS, DataConfig
from evalkit.data.check import find_data
from evalkit.data.resolve import is_stand_in
from evalkit.device import check_device, default_device, default_dtype, keep_freed_buffers
from evalkit.errors import EvalkitError, warn
from evalkit.storage.identity import cache_root, library_versions, read_json, spec_key
from evalkit.storage.shards import DAMAGED
from evalkit.storage.writes import appending, locked_file, writable
from evalkit.tracking import LogTarget

RUN_SETTINGS = {"decoder": DECODERS, "pixels": PIXELS}  # also taken as --set key=value
MAX_SEED = 2**31 - 1  # every generator seeded from it (torch, numpy, derived seeds) takes it


@dataclass(frozen=True)
class RunSpec:
    """Everything one command asks for. ``None`` means the runner's default: device ``cuda``
    when available, else ``cpu``; dtype ``bf16`` on CUDA, else ``fp32``; cache folder
    ``$EVALKIT_CACHE`` or ``~/.cache/evalkit``. A backbone without weights is initialised
    from each job's own seed."""

    tasks: tuple[str, ...]
    backbones: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    overrides: tuple[str, ...] = ()  # task settings, "key=value"
    weights: str | None = None
    pretrained: bool = False
    random_init: bool = False
    model_args: dict = field(default_factory=dict, hash=False)  # backbone constructor options
    data: str = "auto"  # auto | folder | hf | embedded
    data_dir: Path | None = None
    verify_data: bool = False  # data identities re-hash files whose stamp is unchanged
    out: Path = Path("results/runs")
    force: bool = False  # run although the plan says it does not fit
    rerun: bool = False  # recompute jobs whose rows are on disk
    cache_dir: Path | None = None
    no_cache: bool = False
    verify_cache: bool = False  # re-read every cached shard the run uses, whatever its stamp
    batch_size: int | str = 64  # or "auto": the planner's estimate for the device's free memory
    workers: int | None = None
    device: str | None = None
    dtype: str | None = None
    cache_dtype: str | None = None  # how features are stored: default bf16 for bf16 runs
    progress: bool = True
    tp: int = 1
    fsdp: bool = False
    save_predictions: bool = False  # per-image outputs as Parquet beside the rows
    read_only_cache: bool = False  # set by the runner when the cache cannot be written
    log: tuple[str, ...] = ()  # experiment trackers, "wandb|mlflow|tensorboard[:key=value,...]"
    decoder: str = "auto"  # how image files are decoded: auto | pil | tensor (evalkit.data.views)
    pixels: str = "auto"  # decoded views kept for the next backbone: auto | cache | decode
    zoo: bool = False  # part of a comparison of backbones (set by --zoo; several --backbone)
    # the (backbone, seed, task) cells this process runs (None: all): its share (``share``)
    cells: frozenset | None = field(default=None, hash=False)

    def __post_init__(self):
        for name in ("tasks", "backbones", "seeds", "overrides", "log"):
            value = getattr(self, name)
            as_tuple = (value,) if isinstance(value, str | int) else tuple(value)
            object.__setattr__(self, name, as_tuple)
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "tasks", expand(self.tasks))  # suite:<name> → its tasks
        self._take_run_settings()
        self.check()

    @property
    def is_zoo(self) -> bool:
        """Part of a comparison of backbones: its cells keep per-image outputs for paired tests,
        and a failing cell does not stop the others."""
        return self.zoo or len(self.backbones) > 1

    def _take_run_settings(self):
        """``--set decoder=…`` and ``--set pixels=…`` name how the whole run reads images, not
        a task setting: they become the spec's own fields."""
        kept = []
        for pair in self.overrides:
            key, _, value = pair.partition("=")
            if key.strip() in RUN_SETTINGS:
                object.__setattr__(self, key.strip(), value.strip())
            else:
                kept.append(pair)
        object.__setattr__(self, "overrides", tuple(kept))

    def check(self):
        """Refuse options that would fail later with a traceback or give a wrong number."""
        if self.batch_size != "auto" and not (
            isinstance(self.batch_size, int) and self.batch_size >= 1
        ):
            raise EvalkitError(f"--batch-size must be auto or at least 1, got {self.batch_size}")
        if self.workers is not None and self.workers < 0:
            raise EvalkitError(f"--workers must be 0 or more, got {self.workers}")
        if self.tp < 1:
            raise EvalkitError(f"--tp must be at least 1, got {self.tp}")
        if self.dtype not in (None, "fp32", "bf16"):
            raise EvalkitError(f"--dtype must be fp32 or bf16, got {self.dtype!r}")
        if self.cache_dtype not in (None, *STORAGE):
            raise EvalkitError(
                f"--cache-dtype must be fp32, bf16 or fp16, got {self.cache_dtype!r}"
            )
        if self.device is not None:
            check_device(self.device)
        for name, allowed in RUN_SETTINGS.items():
            if getattr(self, name) not in allowed:
                raise EvalkitError(
                    f"--{name} {getattr(self, name)}: expected one of {', '.join(allowed)}"
                )
        for target in self.log:
            LogTarget.parse(target)
        self._check_together()
        bad_seeds = [s for s in self.seeds if not 0 <= s <= MAX_SEED]
        if bad_seeds:
            raise EvalkitError(f"--seed {bad_seeds[0]}: expected a whole number in 0 … {MAX_SEED}")

    def _check_together(self):
        """Options that cannot both hold: one would be silently ignored."""
        if self.weights and len(self.backbones) > 1:
            raise EvalkitError(
                "--weights names one checkpoint but several backbones are given: run them "
                "one at a time, or give each its weights in a --zoo file"
            )
        if self.weights and self.pretrained:
            raise EvalkitError(
                "--pretrained and --weights both name the weights: keep one (--weights PATH "
                "reads a local checkpoint; --pretrained the published ones)"
            )
        if self.data_dir is not None and self.data == "embedded":
            raise EvalkitError(
                "--data-dir is not read with --data embedded (the stand-in is written under the "
                "cache folder): drop one of them"
            )

    @property
    def resolved_device(self) -> str:
        return self.device or default_device()

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or default_dtype(self.resolved_device)

    def backbone_options(self, seed: int) -> BackboneOptions:
        """How to build a backbone for the job of ``seed`` (random weights come from it)."""
        return BackboneOptions(
            weights=self.weights,
            pretrained=self.pretrained,
            seed=seed,
            device=self.resolved_device,
            dtype=self.resolved_dtype,
            random_init=self.random_init,
            fsdp=self.fsdp,
            model_kwargs=dict(self.model_args),
        )

    def data_config(self) -> DataConfig:
        """Where the command's data is read from (embedded stand-ins under the cache folder)."""
        root = Path(self.cache_dir or cache_root())
        return DataConfig(
            source=self.data,
            root=self.data_dir,
            cache=root,
            verify=self.verify_data,
            decoder=self.decoder,
            pixels=self.pixels,
        )

    def context(
        self, seed: int, identities: dict | None = None, batch_size: int = 0
    ) -> TaskContext:
        """A fresh context for one job: its own run statistics; ``identities`` (dataset
        identities) may be shared by the jobs of one run, so each dataset is walked once;
        ``batch_size`` is the resolved ``--batch-size auto``."""
        root = Path(self.cache_dir or cache_root())
        extract = ExtractSettings(
            cache_dir=None if self.no_cache else root,
            batch_size=batch_size or self.batch_size,
            workers=self.workers,
            device=self.resolved_device,
            dtype=self.resolved_dtype,
            cache_dtype=self.cache_dtype or self.resolved_dtype,
            progress=self.progress,
            verify_cache=self.verify_cache,
            read_only=self.read_only_cache,
        )
        ctx = TaskContext(
            data=self.data_config(),
            extract=extract,
            seed=seed,
            device=self.resolved_device,
        )
        ctx.identities = identities if identities is not None else {}
        return ctx


@dataclass
class JobResult:
    """One finished (task, backbone, seed): its rows, and whether they came from disk; in a
    zoo (several cells), a cell that failed carries its ``error`` and one that does not apply
    to its backbone a ``note``, and neither stops the others."""

    task: str
    backbone: str
    seed: int
    rows: list[Row]
    skipped: bool
    error: str | None = None
    note: str | None = None

    @property
    def status(self) -> str:
        if self.error:
            return "failed"
        if self.note:
            return "not applicable"
        return "skipped (rows on disk)" if self.skipped else "done"


def run(
    spec: RunSpec, *, on_backbone: Callable | None = None, on_data: Callable | None = None
) -> Iterator[JobResult]:
    """Yield one ``JobResult`` per (backbone, task, seed), in that nesting order.
    ``on_backbone(backbone)`` is called after each backbone loads (the CLI warns there);
    ``on_data(line)`` once per dataset the run reads, found before any backbone is built."""
    tasks = [resolve_task(name, spec.overrides) for name in spec.tasks]  # bad names fail first
    backbones = spec.backbones or _no_backbone(tasks)
    zoo = spec.is_zoo or len(tasks) > 1
    for name in [] if zoo else backbones:  # a typo fails before the stand-in data is written
        check_backbone_model(name)  # (in a zoo a backbone that does not load fails its cells)
    writable_folder(spec.out, "--out")  # before any work: where its results would go
    spec = read_only_cache(spec)
    for line in data_found(tasks, spec):  # a missing folder fails in a second, not after a model
        if on_data is not None:
            on_data(line)
    distributed.setup(spec.tp, device=spec.resolved_device)
    keep_freed_buffers()
    restore = run_numerics()
    identities = {}
    try:
        for name in backbones:
            if spec.cells is not None and not any(cell[0] == name for cell in spec.cells):
                continue  # another shard's backbone: not even loaded
            yield from _backbone_cells(spec, name, tasks, identities, on_backbone, zoo)
    finally:
        restore()
        distributed.teardown()


def _backbone_cells(spec: RunSpec, name: str, tasks: list[Task], identities, on_backbone, zoo):
    """The cells of one backbone, seed by seed. In a zoo a task that needs what the backbone
    lacks (a text tower) is a cell that does not apply (asked alone, the task says why not). In a zoo a failing cell is recorded in
    ``<out>/failed-cells.ndjson`` and the zoo goes on; a backbone that does not load fails its cells."""
    done = set()
    given = list(zip(spec.tasks, tasks, strict=True))  # a cell names its task as given
    try:
        for seed, backbone, batch in seeded_backbones(spec, name, on_backbone):
            for asked, task in given:
                done.add((asked, seed))
                if spec.cells is not None and (name, seed, asked) not in spec.cells:
                    continue  # another shard's cell
                if zoo and (lacking := task.lacks(backbone)) is not None:
                    yield JobResult(task.name, name, seed, [], False, note=lacking)
                elif not zoo:
                    yield _cell(spec, task, name, (seed, backbone, batch), identities)
                else:
                    yield _guarded(spec, task, name, (seed, backbone, batch), identities)
    except Exception as exc:
        if not zoo:
            raise
        for seed in spec.seeds:
            for asked, task in given:
                mine = spec.cells is None or (name, seed, asked) in spec.cells
                if (asked, seed) not in done and mine:
                    yield failed_cell(spec, JobResult(task.name, name, seed, [], False), exc)


def _guarded(spec: RunSpec, task: Task, name: str, seeded, identities) -> JobResult:
    try:
        return _cell(spec, task, name, seeded, identities)
    except Exception as exc:  # noqa: BLE001 - in a zoo a failure is the cell's alone
        return failed_cell(spec, JobResult(task.name, name, seeded[0], [], False), exc)


def _cell(spec: RunSpec, task: Task, name: str, seeded, identities) -> JobResult:
    seed, backbone, batch = seeded
    ctx = spec.context(seed, identities, batch)
    ctx.request_key = spec_key(request_spec(spec, task, name, ctx), length=16)
    with tracked_job(spec, task, backbone.info, ctx) as log:
        rows, skipped = run_task(
            task,
            backbone,
            ctx,
            out_dir=spec.out,
            force=spec.force,
            rerun=spec.rerun,
            predictions=spec.save_predictions or spec.is_zoo,
        )
        log.rows(rows)
        log.pictures(rows)
        log.artifact(ctx.predictions)
    return JobResult(task.name, name, seed, rows, skipped)


def failed_cell(spec: RunSpec, result: JobResult, exc: Exception) -> JobResult:
    """``result`` with the error of ``exc``, recorded in ``<out>/failed-cells.ndjson`` (by the
    main process) for the leaderboard to name what is missing and why."""
    error = str(exc) if isinstance(exc, EvalkitError) else f"{type(exc).__name__}: {exc}"
    result = dataclasses.replace(result, error=error.strip().splitlines()[-1] if error else "")
    if distributed.current().main:
        record = {k: getattr(result, k) for k in ("task", "backbone", "seed", "error")}
        record |= {"weights": spec.weights, "options": dict(spec.model_args)}
        record["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")  # with its offset: any reader
        appending(spec.out / FAILED, (json.dumps(record, sort_keys=True) + "\n").encode())
    return result


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
        return spec_key(request_spec(spec, task, name, spec.context(seed, identities)), length=16)
    except EvalkitError:
        return None


def finished(spec: RunSpec, cell: tuple[str, int, str], identities: dict, read: dict) -> bool:
    """Whether a cell's rows are on disk under its request's key, every metric there (known
    before its backbone is built); ``read`` keeps each rows file's rows once read."""
    name, seed, task_name = cell
    path = rows_file(spec.out, task_name)
    if not path.exists():
        return False
    task = resolve_task(task_name, spec.overrides)
    key = request_key_of(spec, cell, identities)
    if key is None:
        return False  # its data cannot be read here: the cell runs and says why
    if path not in read:
        read[path] = load_rows([path])
    rows = [r for r in read[path] if r.get("request_key") == key]
    return rows_complete(task.metrics(), rows)


def data_found(tasks: list[Task], spec: RunSpec) -> list[str]:
    """One line per dataset the tasks read, every split of every task opened (no image
    decoded), then each task's settings checked against its data (``Task.check_data``): all
    before any backbone is built, whatever the order of the tasks."""
    opened = {}
    lines = find_data(merged_reads(tasks), spec.data_config(), opened)
    for task in tasks:
        task.check_data(opened)
    return lines


def merged_reads(tasks: list[Task]) -> dict[str, dict[str, str]]:
    """Every split each task reads, per dataset; a split some task trains on comes first
    (the classes of the others are matched to it)."""
    reads: dict[str, dict[str, str]] = defaultdict(dict)
    for task in tasks:
        for name, splits in task.reads().items():
            if len(splits) > 1:  # the first is this task's training split
                first = next(iter(splits.items()))
                reads[name] = dict([first, *reads[name].items()])
            reads[name] |= splits
    return dict(reads)


def seeded_backbones(spec: RunSpec, name: str, on_backbone: Callable | None):
    """(seed, backbone, batch size) for each of the command's seeds: a backbone with random
    weights is built from each job's own seed, so a job's numbers never depend on the other
    seeds of its command; one whose weights are read is loaded (and its batch size planned)
    once for all of them."""
    backbone = batch = None
    for seed in spec.seeds:
        if backbone is None or backbone.info.random_init:
            del backbone  # free it before the next one loads
            backbone = load_backbone(name, spec.backbone_options(seed))
            if on_backbone is not None:
                on_backbone(backbone)
            batch = _batch_size(spec, backbone)
        yield seed, backbone, batch


def _batch_size(spec: RunSpec, backbone) -> int:
    """The planner's batch size for ``--batch-size auto``, else 0 (the spec's own)."""
    if spec.batch_size != "auto":
        return 0
    return auto_batch_size(backbone, spec.resolved_device, spec.resolved_dtype, spec.tp)


def tracked_job(spec: RunSpec, task: Task, info, ctx: TaskContext):
    """The job's tracker runs (``--log``), on the main process only: named by task, backbone,
    seed and the request's key (two setups of one backbone never share a name), with the
    setup's options, weights and data as parameters."""
    main = distributed.current().main
    targets = tuple(LogTarget.parse(t) for t in spec.log) if main else ()
    datasets = task.datasets()
    config = {
        "task": task.name,
        "backbone": info.name,
        "backbone_options": json.dumps(info.options, sort_keys=True, default=str),
        "weights_id": info.weights_id,
        "random_init": info.random_init,
        "dataset": "+".join(datasets),
        "stand_in": any(is_stand_in(name, ctx.data) for name in datasets),
        "seed": ctx.seed,
        "settings": task.config(),
    }
    name = f"{task.name}/{info.name}/s{ctx.seed}/{ctx.request_key[:8]}"
    return tracking.job(targets, spec.out, name, config)


def read_only_cache(spec: RunSpec) -> RunSpec:
    """``spec`` as given when its cache is writable; when the cache folder exists but cannot
    be written (a team's cache on a read-only mount), ``spec`` reading it read-only, with one
    warning. A path that is a file, or a folder that cannot be made, is a one-line error."""
    if spec.no_cache:
        return spec
    root = Path(spec.cache_dir or cache_root())
    if not root.is_dir() or writable(root):
        writable_folder(root, "--cache-dir")
        return spec
    if not os.access(root, os.R_OK | os.X_OK):
        raise EvalkitError(f"--cache-dir {root} can be neither written nor read: choose another")
    warn(
        f"the feature cache {root} is read-only: what it holds is read; what it lacks is "
        "computed in memory for this run and not kept"
    )
    return dataclasses.replace(spec, read_only_cache=True)


def writable_folder(path: Path, flag: str):
    """``path`` is a folder this process can write in (made if missing), or a one-line error."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EvalkitError(f"{flag} {path} is a file: expected a folder (or a path to make one)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise EvalkitError(
            f"{flag} {path} is not a writable folder ({exc.strerror or exc}): choose another"
        ) from None


def _no_backbone(tasks: list[Task]) -> tuple[str, ...]:
    """Runs without ``--backbone``: only tasks that train their own models may."""
    needing = [task.name for task in tasks if not task.trains_own_model]
    if needing:
        raise EvalkitError(
            f"{needing[0]} needs a backbone: pass --backbone, e.g. timm/vit_tiny_patch16_224"
        )
    return ("none",)


def alias_note(name: str) -> str | None:
    """A note when ``name`` is an alias, naming the real task."""
    entry = TASKS.get(task_settings(name)[0])
    return f"{name!r} is an alias of {entry.alias_of!r}" if entry.alias_of else None


def run_task(
    task: Task,
    backbone,
    ctx: TaskContext,
    *,
    out_dir: Path,
    force: bool = False,
    rerun: bool = False,
    predictions: bool = False,
) -> tuple[list[Row], bool]:
    """Run ``task`` on ``backbone``; returns (rows, skipped). Rows on disk are reused only
    when their run key — the whole ``job_spec`` — matches (and, with ``predictions``, when
    the per-image Parquet file is there too). Identical jobs started at once on one ``--out``
    run one after the other: the later finds the earlier's rows and skips."""
    key = spec_key(job_spec(task, backbone.info, ctx), length=16)
    with job_lock(out_dir, key):
        return _run_task(
            task,
            backbone,
            ctx,
            key,
            out_dir=out_dir,
            force=force,
            rerun=rerun,
            predictions=predictions,
        )


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


def _run_task(
    task: Task,
    backbone,
    ctx: TaskContext,
    key: str,
    *,
    out_dir: Path,
    force: bool,
    rerun: bool,
    predictions: bool,
) -> tuple[list[Row], bool]:
    path = rows_file(out_dir, task.name)
    done = [r for r in load_rows([path]) if r.get("run_key") == key] if path.exists() else []
    if predictions and distributed.current().main:
        ctx.predictions = predictions_file(out_dir, task.name, backbone.info.name, ctx.seed, key)
    distributed.barrier()  # every rank has decided before rank 0 appends anything
    have_predictions = ctx.predictions is None or readable_parquet(ctx.predictions)
    sound = not rows_after_damage(done, ctx.extract.cache_dir)
    if not rerun and rows_complete(task.metrics(), done) and have_predictions and sound:
        return done, True
    if not force and (problems := unfit(task, backbone, ctx, tp=distributed.current().tp_size)):
        raise EvalkitError(
            f"{task.name} on {backbone.info.name} does not fit this machine: {problems[0]} "
            f"(see `evalkit plan`; --force runs it anyway)"
        )
    start = time.perf_counter()
    reset_peak_memory(ctx.device)  # this job's peak, not the run's
    ctx.artifacts = Path(out_dir) / "pictures"
    rows = []
    with job_limits() as limits:
        for metric in task.run(backbone, ctx):
            row = make_row(task, backbone.info, metric, ctx, key=key)
            row["provenance"] = provenance(ctx, wall_s=time.perf_counter() - start)
            if (training := limits.get("training")) is not None and training.size:
                row["provenance"]["training_batch_piece"] = training.size
            rows.append(row)
    if distributed.current().main and (done or holds_run_key(path, key)):
        replace_rows(path, key, rows)  # --rerun: the job's new rows replace its old ones
    elif distributed.current().main:
        append_rows(path, rows)  # the job's rows land together or not at all
    return rows, False


def rows_after_damage(rows: list[Row], cache_dir: Path | None) -> bool:
    """Whether ``rows`` were computed from cached features later found damaged (or derived
    from damaged views): their numbers may carry the damage, so the job is recomputed, with
    one line saying why."""
    if cache_dir is None or not rows:
        return False
    for row in rows:
        computed = row_time(row)
        for key in (row.get("sources") or {}).get("features", ()):
            found = read_json(Path(cache_dir) / "features" / key / DAMAGED)
            if found and max(found.values()) >= computed:
                warn(
                    f"the rows of {row['task']} × {row['backbone']} were computed from cached "
                    "features since found damaged: recomputing them"
                )
                return True
    return False


def row_time(row: Row) -> float:
    """When a row was computed (seconds since the epoch, to the second; 0 when unknown)."""
    import datetime

    try:
        return datetime.datetime.strptime(
            row["provenance"]["time"], "%Y-%m-%dT%H:%M:%S%z"
        ).timestamp()
    except (KeyError, TypeError, ValueError):
        return 0.0


def readable_parquet(path: Path) -> bool:
    """Whether ``path`` is a whole Parquet file: a damaged or cut-off one (its footer is
    checked) is recomputed, with one line saying so."""
    import pyarrow.parquet as pq

    if not path.exists():
        return False
    try:
        pq.read_metadata(path)
    except Exception:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        warn(f"{path} is damaged or cut off: the cell is recomputed")
        return False
    return True


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
    }


def _weights_asked(spec: RunSpec, backbone: str, seed: int) -> str:
    if spec.weights:
        return row_weights_id(backbone, spec.weights)
    if spec.pretrained:
        return "pretrained"  # the hub file's content id is in the job's own key
    return f"random-init:{seed}:{spec.random_init}"
