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

What a run asks for is ``evalkit.core.spec.RunSpec``; what a cell is, its keys, whether it is
done, its share of a zoo and its lock are ``evalkit.core.cells``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from evalkit import distributed, tracking
from evalkit.backbones import check_backbone_model, load_backbone
from evalkit.batching import job_limits
from evalkit.core.catalog import resolve_task
from evalkit.core.cells import _no_backbone, job_lock, request_key
from evalkit.core.costs import unfit
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
from evalkit.core.shapes import auto_batch_size
from evalkit.core.spec import RunSpec
from evalkit.core.task import Task, TaskContext, rows_complete, run_key
from evalkit.data.check import find_data
from evalkit.data.resolve import is_stand_in
from evalkit.device import keep_freed_buffers
from evalkit.errors import EvalkitError, warn
from evalkit.storage.identity import read_json
from evalkit.storage.shards import DAMAGED
from evalkit.storage.writes import appending, writable
from evalkit.tracking import LogTarget


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
    ctx.request_key = request_key(spec, task, name, ctx)
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
    if spec.extract.batch_size != "auto":
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
    if spec.extract.no_cache:
        return spec
    root = spec.extract.root
    if not root.is_dir() or writable(root):
        writable_folder(root, "--cache-dir")
        return spec
    if not os.access(root, os.R_OK | os.X_OK):
        raise EvalkitError(f"--cache-dir {root} can be neither written nor read: choose another")
    warn(
        f"the feature cache {root} is read-only: what it holds is read; what it lacks is "
        "computed in memory for this run and not kept"
    )
    return dataclasses.replace(spec, extract=dataclasses.replace(spec.extract, read_only=True))


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
    key = run_key(task, backbone.info, ctx)
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
