"""Results where users already look: ``--log wandb|mlflow|tensorboard[:key=value,...]`` sends
every job's rows to an experiment tracker, beside the rows evalkit writes itself.

One tracker run per job (task × backbone × seed), named ``task/backbone/s<seed>``: its config
is the job's task, backbone, seed and task settings, and, once the job ends, the rows'
provenance; each row's metric is logged under its metric name (``top1``, ``miou``, ...) with
its standard error as ``stderr/<metric>``; a task that trains (LiT, dense heads, fine-tuning, the
ablations) logs its curves under ``train/`` as it goes, on one step counter per job; the
pictures a job draws (reliability diagrams, dense prediction grids) and, with
``--save-predictions``, its Parquet predictions go up as artifacts. Each tracker is an
optional extra (``pip install 'evalkit[wandb]'``, ``[mlflow]``, ``[tensorboard]``).

A tracker never costs a result: any error it raises (no network, a bad key, a missing package)
is one warning line, that tracker is switched off for the rest of the run, and the rows land as
always. Nothing is sent anywhere unless ``--log`` asks; W&B honours ``mode=offline`` and MLflow
and TensorBoard write local files unless given a server.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError, install_hint, warn

OPTIONS = {
    "wandb": ("project", "entity", "mode", "dir", "group", "tags"),
    "mlflow": ("uri", "experiment"),
    "tensorboard": ("dir",),
}


@dataclass(frozen=True)
class LogTarget:
    """One ``--log`` value: a tracker and its options."""

    kind: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> LogTarget:
        kind, _, rest = text.partition(":")
        if kind not in OPTIONS:
            raise EvalkitError(
                f"--log {text}: unknown tracker {kind!r}; expected one of "
                f"{', '.join(OPTIONS)}, e.g. --log wandb:project=vit-evals,mode=offline"
            )
        options = []
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key not in OPTIONS[kind]:
                raise EvalkitError(
                    f"--log {text}: {item!r} is not an option of {kind}; expected key=value "
                    f"with key one of {', '.join(OPTIONS[kind])}"
                )
            options.append((key, value))
        return cls(kind, tuple(options))

    def option(self, key: str, default=None):
        return dict(self.options).get(key, default)


class Tracker:
    """What every tracker does for one job; subclasses talk to one library."""

    def __init__(self, target: LogTarget, out: Path):
        self.target, self.out = target, Path(out)

    def open(self, name: str, config: dict) -> None:
        raise NotImplementedError

    def metrics(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def config(self, values: dict) -> None:
        raise NotImplementedError

    def artifact(self, path: Path) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class WandbTracker(Tracker):
    def open(self, name, config):
        import wandb

        tags = self.target.option("tags")
        self.run = wandb.init(
            project=self.target.option("project", "evalkit"),
            entity=self.target.option("entity"),
            mode=self.target.option("mode"),
            group=self.target.option("group"),
            tags=tags.split("+") if tags else None,
            name=name,
            config=config,
            dir=self.target.option("dir", str(self.out)),
            reinit="create_new",
        )

    def metrics(self, values, step):
        self.run.log(values, step=step)

    def config(self, values):
        self.run.config.update(values, allow_val_change=True)

    def artifact(self, path):
        import wandb

        kind = "predictions" if Path(path).suffix == ".parquet" else "picture"
        artifact = wandb.Artifact(_artifact_name(path), type=kind)
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self):
        self.run.finish()


class MlflowTracker(Tracker):
    def open(self, name, config):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.target.option("uri"))
        experiment = self.target.option("experiment", "evalkit")
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        self.config(config)

    def metrics(self, values, step):
        for key, value in values.items():
            self.client.log_metric(self.run_id, _mlflow_key(key), value, step=step)

    def config(self, values):
        for key, value in _flat(values).items():
            self.client.log_param(self.run_id, key, value)

    def artifact(self, path):
        folder = "predictions" if Path(path).suffix == ".parquet" else "pictures"
        self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def close(self):
        self.client.set_terminated(self.run_id)


class TensorboardTracker(Tracker):
    def open(self, name, config):
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(self.target.option("dir", self.out / "tensorboard")) / name.replace("/", "--")
        self.writer = SummaryWriter(str(folder))
        self.config(config)

    def metrics(self, values, step):
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def config(self, values):
        for key, value in values.items():
            self.writer.add_text(f"config/{key}", f"`{json.dumps(value, default=str)}`")

    def artifact(self, path):
        self.writer.add_text("artifacts", str(Path(path).resolve()))

    def close(self):
        self.writer.close()


KINDS = {"wandb": WandbTracker, "mlflow": MlflowTracker, "tensorboard": TensorboardTracker}


class Guarded:
    """A tracker whose errors become one warning line and switch it off."""

    def __init__(self, tracker: Tracker):
        self.tracker, self.off = tracker, False

    def __getattr__(self, method: str):
        call = getattr(self.tracker, method)

        def guarded(*args, **kwargs):
            if self.off:
                return
            try:
                call(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - a tracker never costs a result
                self.off = True
                warn(_failure(self.tracker.target.kind, error))

        return guarded


def _failure(kind: str, error: Exception) -> str:
    if isinstance(error, ModuleNotFoundError):
        hint = install_hint(error.name) or f"pip install 'evalkit[{kind}]'"
        reason = f"{error.name} is not installed ({hint})"
    else:
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return f"--log {kind}: {reason}; the rows are written as always, {kind} is off for this run"


class JobLog:
    """The trackers of one job: ``curve`` during it, ``rows`` and ``artifact`` at its end."""

    def __init__(self, trackers: list[Guarded]):
        self.trackers, self.step = trackers, 0

    def curve(self, values: dict[str, float], step: int | None = None) -> None:
        logged = {
            f"train/{k}": float(v)
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if step is not None:
            logged["train/step"] = step
        for tracker in self.trackers:
            tracker.metrics(logged, self.step)
        self.step += 1

    def rows(self, rows: list[dict]) -> None:
        values = {}
        for row in rows:
            values[row["metric"]] = row["value"]
            if row.get("stderr") is not None:
                values[f"stderr/{row['metric']}"] = row["stderr"]
        for tracker in self.trackers:
            if rows:
                tracker.config({"provenance": rows[0].get("provenance", {})})
            tracker.metrics(values, self.step)

    def artifact(self, path: Path | None) -> None:
        if path is not None and Path(path).exists():
            for tracker in self.trackers:
                tracker.artifact(Path(path))

    def pictures(self, rows: list[dict]) -> None:
        """The pictures the rows point to (reliability diagrams, dense prediction grids)."""
        for picture in dict.fromkeys(r.get("extra", {}).get("picture") for r in rows):
            if picture:
                self.artifact(Path(picture))


_current: contextvars.ContextVar[JobLog | None] = contextvars.ContextVar("job_log", default=None)


@contextlib.contextmanager
def job(targets: tuple[LogTarget, ...], out: Path, name: str, config: dict) -> Iterator[JobLog]:
    """Open every target's run for one job; training loops reach it through ``curve``."""
    trackers = [Guarded(KINDS[t.kind](t, out)) for t in targets]
    for tracker in trackers:
        tracker.open(name, config)
    log = JobLog(trackers)
    token = _current.set(log)
    try:
        yield log
    finally:
        _current.reset(token)
        for tracker in trackers:
            tracker.close()


def curve(values: dict[str, float], step: int | None = None) -> None:
    """A training loop's values at one step, sent to the current job's trackers (if any)."""
    if (log := _current.get()) is not None:
        log.curve(values, step)


def _flat(values: dict, prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)[:500]  # MLflow's parameter length limit
    return flat


def _mlflow_key(key: str) -> str:
    """MLflow names allow letters, digits, '_', '-', '.', ' ' and '/' (``top1/k=20``)."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


def _artifact_name(path: Path) -> str:
    """W&B artifact names allow letters, digits, '-', '_' and '.'."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(path).stem)[:128]
