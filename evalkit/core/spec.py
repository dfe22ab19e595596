"""The run's settings: ``RunSpec``, everything one command asks for (tasks, backbones, seeds,
options, how data is read (``DataOptions``) and how features are extracted
(``ExtractOptions``)), checked when it is made, with the defaults it leaves to the runner
(device, dtype, cache folder) and the ``TaskContext`` it gives each job. ``RunSpec.of`` makes
one from the flat options of ``evalkit.run`` and the command line; ``NESTED`` says where each
of those that is not its own field goes. ``RUN_SETTINGS`` are the ``--set`` keys that name how
the whole run reads images; ``MAX_SEED`` the largest seed a run takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from evalkit.backbones import BackboneOptions
from evalkit.cache.settings import STORAGE, ExtractOptions
from evalkit.core.suites import expand
from evalkit.core.task import TaskContext
from evalkit.data import DECODERS, PIXELS, DataConfig, DataOptions
from evalkit.device import check_device, default_device, default_dtype
from evalkit.errors import EvalkitError
from evalkit.tracking import LogTarget

RUN_SETTINGS = {"decoder": DECODERS, "pixels": PIXELS}  # also taken as --set key=value

# The flat options of evalkit.run and the command line that live in a nested setting:
# option -> (RunSpec field, name in that field's settings)
NESTED = {
    "data": ("data", "source"),
    "data_dir": ("data", "root"),
    "verify_data": ("data", "verify"),
    "decoder": ("data", "decoder"),
    "pixels": ("data", "pixels"),
    "cache_dir": ("extract", "cache_dir"),
    "no_cache": ("extract", "no_cache"),
    "verify_cache": ("extract", "verify_cache"),
    "batch_size": ("extract", "batch_size"),
    "workers": ("extract", "workers"),
    "cache_dtype": ("extract", "cache_dtype"),
    "progress": ("extract", "progress"),
    "read_only_cache": ("extract", "read_only"),
}


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
    data: DataOptions = DataOptions()
    out: Path = Path("results/runs")
    force: bool = False  # run although the plan says it does not fit
    rerun: bool = False  # recompute jobs whose rows are on disk
    extract: ExtractOptions = ExtractOptions()
    device: str | None = None
    dtype: str | None = None
    tp: int = 1
    fsdp: bool = False
    save_predictions: bool = False  # per-image outputs as Parquet beside the rows
    log: tuple[str, ...] = ()  # experiment trackers, "wandb|mlflow|tensorboard[:key=value,...]"
    zoo: bool = False  # part of a comparison of backbones (set by --zoo; several --backbone)
    # the (backbone, seed, task) cells this process runs (None: all): its share (``share``)
    cells: frozenset | None = field(default=None, hash=False)

    @classmethod
    def of(cls, **options) -> RunSpec:
        """A spec from flat options, as ``evalkit.run`` and the command line give them: each
        of ``NESTED`` into its setting, the others as they are."""
        nested = {"data": {}, "extract": {}}
        own = {}
        for name, value in options.items():
            if name in NESTED:
                home, key = NESTED[name]
                nested[home][key] = value
            else:
                own[name] = value
        return cls(
            **own, data=DataOptions(**nested["data"]), extract=ExtractOptions(**nested["extract"])
        )

    @classmethod
    def option_names(cls) -> list[str]:
        """Every flat option ``of`` takes."""
        return [f.name for f in fields(cls) if f.name not in ("data", "extract")] + list(NESTED)

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
        a task setting: they become the spec's data options."""
        kept = []
        for pair in self.overrides:
            key, _, value = pair.partition("=")
            if key.strip() in RUN_SETTINGS:
                object.__setattr__(self, "data", replace(self.data, **{key.strip(): value.strip()}))
            else:
                kept.append(pair)
        object.__setattr__(self, "overrides", tuple(kept))

    def check(self):
        """Refuse options that would fail later with a traceback or give a wrong number."""
        extract = self.extract
        if extract.batch_size != "auto" and not (
            isinstance(extract.batch_size, int) and extract.batch_size >= 1
        ):
            raise EvalkitError(f"--batch-size must be auto or at least 1, got {extract.batch_size}")
        if extract.workers is not None and extract.workers < 0:
            raise EvalkitError(f"--workers must be 0 or more, got {extract.workers}")
        if self.tp < 1:
            raise EvalkitError(f"--tp must be at least 1, got {self.tp}")
        if self.dtype not in (None, "fp32", "bf16"):
            raise EvalkitError(f"--dtype must be fp32 or bf16, got {self.dtype!r}")
        if extract.cache_dtype not in (None, *STORAGE):
            raise EvalkitError(
                f"--cache-dtype must be fp32, bf16 or fp16, got {extract.cache_dtype!r}"
            )
        if self.device is not None:
            check_device(self.device)
        for name, allowed in RUN_SETTINGS.items():
            if getattr(self.data, name) not in allowed:
                raise EvalkitError(
                    f"--{name} {getattr(self.data, name)}: expected one of {', '.join(allowed)}"
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
        if self.data.root is not None and self.data.source == "embedded":
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
        return DataConfig(**vars(self.data), cache=self.extract.root)

    def context(
        self, seed: int, identities: dict | None = None, batch_size: int = 0
    ) -> TaskContext:
        """A fresh context for one job: its own run statistics; ``identities`` (dataset
        identities) may be shared by the jobs of one run, so each dataset is walked once;
        ``batch_size`` is the resolved ``--batch-size auto``."""
        ctx = TaskContext(
            data=self.data_config(),
            extract=self.extract.settings(self.resolved_device, self.resolved_dtype, batch_size),
            seed=seed,
            device=self.resolved_device,
        )
        ctx.identities = identities if identities is not None else {}
        return ctx
