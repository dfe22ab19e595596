"""``--log``: a real ``evalkit run`` (LiT on the embedded stand-in, which trains) sends its rows,
its training curve and its predictions to W&B (offline), MLflow (a local file store) and
TensorBoard (event files), and each is read back with that library's own reader; a tracker that
fails is one warning line and the rows still land; bad ``--log`` values are one-line errors."""

from __future__ import annotations

import glob
import struct

import pytest

from evalkit.core.results import load_rows

STEPS = 3
ARGS = [
    "run",
    "--task",
    "lit-imagenet",
    "--backbone",
    "fake",
    "--data",
    "embedded",
    "--quiet",
    "--set",
    f"steps={STEPS}",
    "--set",
    "batch_size=32",
    "--save-predictions",
]


@pytest.fixture(scope="module")
def logged(tmp_path_factory, data_cache):
    """One run with all three trackers and a fourth that cannot write its folder."""
    from evalkit.cli import main

    root = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVALKIT_CACHE", str(data_cache))
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in
        patch.setenv("WANDB_SILENT", "true")
        patch.chdir(root)
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(
                [
                    *ARGS,
                    "--out",
                    "rows",
                    f"--log=wandb:mode=offline,dir={root}",
                    f"--log=mlflow:uri=file://{root}/mlruns,experiment=probe",
                    f"--log=tensorboard:dir={root}/tb",
                    "--log=tensorboard:dir=/proc/none",
                ]
            )
    assert code == 0
    rows = {r["metric"]: r for r in load_rows([root / "rows"])}
    return root, rows, err.getvalue()


def test_a_failing_tracker_is_one_warning_and_the_rows_still_land(logged):
    _, rows, err = logged
    assert set(rows) == {"top1", "top5"}
    failures = [line for line in err.splitlines() if "--log tensorboard" in line]
    assert len(failures) == 1 and "/proc/none" in failures[0] and "rows are written" in failures[0]


def test_tensorboard_event_files_hold_the_rows_and_the_curve(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, rows, _ = logged
    (folder,) = glob.glob(f"{root}/tb/lit-imagenet--fake--s0--*")
    events = EventAccumulator(folder)
    events.Reload()
    assert [e.value for e in events.Scalars("top1")] == [pytest.approx(rows["top1"]["value"])]
    assert len(events.Scalars("train/loss")) == STEPS
    assert "config/task/text_summary" in events.Tags()["tensors"]


def test_mlflow_holds_the_rows_the_curve_the_settings_and_the_predictions(logged):
    from mlflow.tracking import MlflowClient

    root, rows, _ = logged
    client = MlflowClient(f"file://{root}/mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("probe").experiment_id])
    assert run.info.run_name.startswith("lit-imagenet/fake/s0/")  # then the request's key
    params = run.data.params  # the setup: options, weights, random init, stand-in data
    assert params["backbone_options"] == "{}" and params["weights_id"].startswith("random-init")
    assert (params["random_init"], params["stand_in"], params["dataset"]) == (
        "True",
        "True",
        "imagenet+captions",
    )
    assert run.data.metrics["top1"] == pytest.approx(rows["top1"]["value"])
    assert run.data.metrics["stderr/top5"] == pytest.approx(rows["top5"]["stderr"])
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == STEPS
    assert run.data.params["task"] == "lit-imagenet" and run.data.params["settings.steps"] == "3"
    assert run.data.params["provenance.device"] == "cpu"
    (folder,) = client.list_artifacts(run.info.run_id)
    (parquet,) = client.list_artifacts(run.info.run_id, folder.path)
    assert parquet.path.endswith(".parquet")


def wandb_records(path: str) -> list:
    """The records of a W&B run file, read with W&B's own protobuf definitions: the file is
    a LevelDB-style log — a 7-byte header (":W&B", magic, version), then records in 32 KiB
    blocks, each with a 7-byte header (CRC, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, records = open(path, "rb").read(), 7, b"", []  # noqa: SIM115
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        room = 32768 - position % 32768
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_holds_the_rows_the_curve_the_config_and_the_predictions(logged):
    import json

    root, rows, _ = logged
    (path,) = glob.glob(f"{root}/wandb/offline-run-*/run-*.wandb")
    records = wandb_records(path)
    history = [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert sum("train/loss" in h for h in history) == STEPS
    assert [h["top1"] for h in history if "top1" in h] == [pytest.approx(rows["top1"]["value"])]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name.startswith("lit-imagenet/fake/s0/")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["task"] == "lit-imagenet" and config["settings"]["steps"] == 3
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [a.type for a in artifacts] == ["predictions"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("neptune", "unknown tracker 'neptune'"),
        ("wandb:colour=red", "'colour=red' is not an option"),
        ("mlflow:uri", "expected key=value"),
    ],
)
def test_bad_log_values_are_one_line_errors(value, says):
    from evalkit.core.spec import RunSpec
    from evalkit.errors import EvalkitError

    with pytest.raises(EvalkitError, match=says):
        RunSpec(tasks="imagenet-linear", backbones="fake", log=value)


def test_sweep_passes_log_to_every_job(tmp_path, capsys):
    from evalkit.cli import main

    args = [
        "sweep",
        "--task",
        "imagenet-linear",
        "--backbone",
        "fake",
        "--dry-run",
        "--out",
        str(tmp_path),
        "--log",
        "mlflow:experiment=sweep",
    ]
    assert main(args) == 0
    assert "--log mlflow:experiment=sweep" in capsys.readouterr().out
    assert main([*args[:-1], "mlflow:colour=red"]) == 2


@pytest.mark.long
def test_a_dense_run_sends_its_picture_grid(tmp_path, data_cache, monkeypatch):
    from mlflow.tracking import MlflowClient

    from evalkit.cli import main

    monkeypatch.setenv("EVALKIT_CACHE", str(data_cache))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    uri = f"file://{tmp_path}/mlruns"
    args = [
        "run",
        "--task",
        "ade20k-1/16",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--quiet",
        "--set",
        "steps=2",
        "--out",
        "rows",
        f"--log=mlflow:uri={uri}",
    ]
    assert main(args) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("evalkit").experiment_id])
    (pictures,) = [a for a in client.list_artifacts(run.info.run_id) if a.path == "pictures"]
    assert [
        a.path.endswith(".png") for a in client.list_artifacts(run.info.run_id, "pictures")
    ] == [True]
    assert "train/loss" in run.data.metrics and "miou" in run.data.metrics
