"""What a task is: a frozen dataclass of protocol settings with ``run(backbone, ctx)`` yielding
metric rows, plus the context it runs in (data, extraction settings, feature cache).

Settings are overridable from the command line (``--set key=value``): values are parsed to the
field's type and an unknown key is an error that lists the valid ones. A setting states its
range or choices where it is declared (``setting(default, POSITIVE)``); every task checks them
when it is built, so the command line and the Python API refuse the same values.
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from evalkit.cache.extraction import extract_features
from evalkit.cache.feature_set import FeatureSet
from evalkit.cache.keys import backbone_spec
from evalkit.cache.settings import STORAGE, ExtractSettings, FeatureRequest
from evalkit.data import DataConfig
from evalkit.data.resolve import data_identity
from evalkit.data.views import decoder_of
from evalkit.errors import EvalkitError, did_you_mean
from evalkit.seeds import SEED_RULE
from evalkit.significance import PerImageTest, default_paired_test
from evalkit.storage.identity import spec_key
from evalkit.storage.writes import replacing


@dataclass(frozen=True)
class Rule:
    """A range or set of choices for a setting: ``text`` says it to the user."""

    text: str
    accepts: Callable[[Any], bool]


POSITIVE = Rule("a positive number", lambda v: v > 0)
NON_NEGATIVE = Rule("zero or more", lambda v: v >= 0)
FRACTION = Rule("a fraction in (0, 1)", lambda v: 0 < v < 1)
SHARE = Rule("a fraction in (0, 1]", lambda v: 0 < v <= 1)
POSITIVES = Rule("a non-empty list of positive numbers", lambda v: bool(v) and min(v) > 0)
LAYERS = Rule("a non-empty list of layer indices", lambda v: bool(v))


def one_of(*choices: str) -> Rule:
    return Rule(f"one of {', '.join(choices)}", lambda v: v in choices)


def setting(default, rule: Rule):
    """A task setting with its rule, checked whenever the task is built."""
    return field(default=default, metadata={"rule": rule})


# --- what a run costs (``Task.plan``, ``evalkit plan``) -----------------------------------

BYTES = {name: dtype.itemsize for name, dtype in STORAGE.items()}  # per stored element


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a backbone: its feature width, depth, patch and the memory of its
    weights and of one image's forward pass on each rank."""

    name: str
    embed_dim: int
    depth: int
    patch: int
    image: int
    weight_bytes_per_rank: int
    activation_bytes_per_image: int
    flops_per_image: int = 0  # one forward pass at ``image`` px


@dataclass(frozen=True)
class PlanInputs:
    """What a task's ``plan`` sees: the backbone's shape, split sizes, number of classes where
    known, the storage dtype of the cache, the extraction batch, the cache's shard size, the
    data-parallel ranks a training stage splits its batch (and, under FSDP2, its state) over,
    and the memory of a rank's accelerator."""

    shape: Shape
    sizes: dict[str, int]
    classes: int
    storage: str = "fp32"
    batch_size: int = 64
    shard_size: int = 1024
    dp: int = 1
    device_bytes: int = 0  # one rank's accelerator memory (0: none, or not known)

    @property
    def row_bytes(self) -> int:
        return self.shape.embed_dim * BYTES[self.storage]


@dataclass
class Stage:
    name: str
    mode: str
    forward_passes: int = 0
    cache_bytes: int = 0
    host_bytes: int = 0
    device_bytes: int = 0
    backward: bool = False  # the passes also train the backbone (≈ 3 forward passes each)
    image: int = 0  # side of the passes' images, when not the backbone's own
    flops: int = 0  # work the passes do not describe: models the task trains itself


def extraction_stage(inputs: PlanInputs, rows: int, *, layers: int = 1) -> Stage:
    """Pooled features of ``rows`` images at ``layers`` layers, extracted into the cache."""
    return Stage(
        "extract features",
        "cached",
        forward_passes=rows,
        cache_bytes=rows * layers * inputs.row_bytes,
        device_bytes=inputs.batch_size * inputs.shape.activation_bytes_per_image,
    )


@dataclass
class Metric:
    """One result of a task; the runner adds provenance to make it a row."""

    metric: str
    value: float
    higher_is_better: bool = True
    stderr: float | None = None  # standard error of the value
    std: float | None = None  # standard deviation over the metric's own seeds
    n: int | None = None
    seeds: list[int] | None = None  # the seeds the value pools; None: the job's own seed
    extra: dict[str, Any] = field(default_factory=dict)


class Task:
    """Mixin for task dataclasses. Subclasses set ``version`` and may set ``reference``:
    ``{metric: {paper model: value}}``, the paper's numbers as docs/protocols.md lists them."""

    name: str
    version: ClassVar[int] = 1
    reference: ClassVar[dict[str, dict[str, float]]] = {}
    trains_own_model: ClassVar[bool] = False  # ablations: run without --backbone

    def __post_init__(self):
        for f in dataclasses.fields(self):
            rule, value = f.metadata.get("rule"), getattr(self, f.name)
            if rule is not None and not _accepts(rule, value):
                raise EvalkitError(
                    f"task {self.name}: {f.name}={_show(value)} is out of range: "
                    f"expected {rule.text}"
                )

    def run(self, backbone, ctx: TaskContext) -> Iterator[Metric]:
        raise NotImplementedError

    def metrics(self) -> list[str]:
        """Metric names one run can produce; a rerun is skipped when all are on disk (a top-k
        at or above the class count is never reported: ``rows_complete``)."""
        raise NotImplementedError

    def plan(self, inputs) -> list:
        """The stages of a run and what each holds (``evalkit plan``); by default one feature
        extraction of every split at the last layer."""
        return [extraction_stage(inputs, sum(inputs.sizes.values()))]

    def splits(self) -> tuple[str, ...]:
        """The splits a run reads, the training split first (``evalkit check-data``)."""
        return ("train", "val")

    def datasets(self) -> tuple[str, ...]:
        """The datasets a run reads (their files are part of the run key): by default the
        ``dataset`` setting, when the task has one."""
        name = getattr(self, "dataset", None)
        return (name,) if isinstance(name, str) else ()

    def reads(self) -> dict[str, dict[str, str]]:
        """What a run reads, for ``evalkit plan`` and ``check-data``: per dataset, its splits,
        keyed by the name ``plan`` looks their sizes up by (the training split first). By
        default, every split of ``splits()`` of every dataset of ``datasets()``."""
        return {name: {split: split for split in self.splits()} for name in self.datasets()}

    def check_data(self, opened: dict) -> None:
        """Refuse settings the data cannot serve, before any backbone is built: ``opened``
        maps (dataset, split) to every split the command reads, opened without decoding an
        image. By default nothing is checked."""

    def paired_test(self, metric: str, columns: set[str]) -> PerImageTest | None:
        """How ``metric`` is recomputed from this task's per-image outputs (a frame with
        ``columns``), for the leaderboard's paired tests; None when it cannot be. By default
        a per-image column of the metric's name whose mean is the metric; a task whose
        outputs say more declares its own."""
        return default_paired_test(metric, columns)

    def lacks(self, backbone) -> str | None:
        """Why this task does not apply to ``backbone`` (None when it does): a zoo records
        such a cell as not applicable rather than failed."""
        return None

    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_overrides(self, pairs: list[str]) -> Task:
        hints = typing.get_type_hints(type(self))
        settable = [f.name for f in dataclasses.fields(self) if f.name != "name"]
        changes = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            if not sep:
                raise EvalkitError(f"--set expects key=value, got {pair!r}")
            if key not in settable:
                hint = did_you_mean(key, settable, f"evalkit ls settings {self.name}")
                raise EvalkitError(f"task {self.name} has no setting {key!r}: {hint}")
            changes[key] = parse_value(raw, hints[key], key)
        return dataclasses.replace(self, **changes)


def _accepts(rule: Rule, value) -> bool:
    try:
        return bool(rule.accepts(value))
    except (TypeError, ValueError):
        return False


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def parse_value(raw: str, kind, key: str):
    """Parse a ``--set`` value to the field's type (int, float, bool, str, tuple of those)."""
    if typing.get_origin(kind) is tuple:
        inner = typing.get_args(kind)[0]
        return tuple(parse_value(part, inner, key) for part in raw.split(",") if part)
    if kind is bool and raw.lower() in TRUE | FALSE:
        return raw.lower() in TRUE
    if kind in (int, float, str):
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if kind is float and value is not None and not math.isfinite(value):
            raise EvalkitError(f"--set {key}={raw}: expected a finite number")
        if value is not None:
            return value
    name = getattr(kind, "__name__", str(kind))
    raise EvalkitError(f"--set {key}={raw}: expected a value of type {name}")


@dataclass
class TaskContext:
    """What a task may use: where data is, how to extract features, the seed, run stats."""

    data: DataConfig = field(default_factory=DataConfig)
    extract: ExtractSettings = field(default_factory=ExtractSettings)
    seed: int = 0
    device: str | None = None  # where the job computes (None: the extraction settings' device)
    stats: dict[str, Any] = field(default_factory=lambda: {"images": 0, "seconds": 0.0, "data": {}})
    artifacts: Path | None = None  # where tasks write pictures (set by the runner)
    identities: dict[str, str] = field(default_factory=dict)  # shared by the jobs of one run
    predictions: Path | None = None  # where to write per-image outputs (--save-predictions)
    request_key: str | None = None  # the job's key before its backbone loads (set by the runner)

    def __post_init__(self):
        """One device for the whole job: the context's, which extraction follows."""
        self.device = self.device or self.extract.device
        if self.extract.device != self.device:
            self.extract = dataclasses.replace(self.extract, device=self.device)

    def save_predictions(self, columns: dict[str, list]):
        """Write one row per image (``columns``: name → values) as Parquet, when asked for;
        written to a temporary name and renamed, so a crash leaves no half file."""
        if self.predictions is None:
            return
        import pandas as pd

        with replacing(self.predictions) as tmp:
            pd.DataFrame(columns).to_parquet(tmp, index=False)

    def data_identity(self, name: str) -> str:
        """Identity of every file of dataset ``name`` (walked once per run)."""
        if name not in self.identities:
            self.identities[name] = data_identity(name, self.data)
        return self.identities[name]

    def features(
        self, backbone, dataset, *, split: str, request: FeatureRequest, subset=None
    ) -> FeatureSet:
        start = time.perf_counter()
        feats = extract_features(
            backbone, dataset, request=request, settings=self.extract, split=split, subset=subset
        )
        if not feats.from_cache:  # a resumed extraction counts only what it computed
            self.stats["images"] += feats.extracted
            self.stats["seconds"] += time.perf_counter() - start
        self.stats["data"][split] = feats.dataset_id
        if getattr(feats, "key", None):  # the rows follow their features (derived_from_damaged)
            self.stats.setdefault("features", set()).add(feats.key)
        if (decoder := decoder_of(getattr(dataset, "transform", None))) is not None:
            self.stats["decoder"] = decoder
        return feats


def resolve_pool(pool: str, backbone) -> str:
    """``auto`` means the backbone's preferred pooling (its first supported one)."""
    return backbone.info.pools[0] if pool == "auto" else pool


def job_spec(task: Task, info, ctx: TaskContext) -> dict:
    """The one description of what produces a job's numbers: the task (name, version,
    settings), the backbone as the feature cache sees it, the files of every dataset the task
    reads, and the seed."""
    return {
        "task": task.name,
        "version": task.version,
        "config": task.config(),
        "backbone": backbone_spec(info, ctx.extract.dtype),
        "cache_dtype": ctx.extract.cache_dtype,
        "decoder": ctx.data.decoder,
        "data": {name: ctx.data_identity(name) for name in task.datasets()},
        "seed": ctx.seed,
        "seed_rule": SEED_RULE,
    }


def run_key(task: Task, info, ctx: TaskContext) -> str:
    """The key of ``job_spec``: a job's rows' ``run_key`` and the name of what it keeps (a
    fine-tuned model), made here only."""
    return spec_key(job_spec(task, info, ctx), length=16)


def rows_complete(expected: list[str], rows: list[dict]) -> bool:
    """Whether ``rows`` (one job's) hold every metric of ``expected``, a top-k the rows' class
    count leaves out (``num_classes`` in their extras) not being expected."""
    from evalkit.metrics import beyond_classes

    found = {row["metric"] for row in rows}
    classes = max(((row.get("extra") or {}).get("num_classes") or 0 for row in rows), default=0)
    return bool(rows) and all(m in found or beyond_classes(m, classes) for m in expected)
