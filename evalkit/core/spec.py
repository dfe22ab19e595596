"""The run's settings: ``RunSpec``, everything one command asks for (tasks, backbones, seeds,
options), checked when it is made, with the defaults it leaves to the runner (device, dtype,
cache folder) and the ``TaskContext`` it gives each job. ``RUN_SETTINGS`` are the ``--set``
keys that name how the whole run reads images; ``MAX_SEED`` the largest seed a run takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evalkit.backbones import BackboneOptions
from evalkit.cache.settings import STORAGE, ExtractSettings
from evalkit.core.suites import expand
from evalkit.core.task import TaskContext
from evalkit.data import DECODERS, PIXELS, DataConfig
from evalkit.device import check_device, default_device, default_dtype
from evalkit.errors import EvalkitError
from evalkit.storage.identity import cache_root
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
