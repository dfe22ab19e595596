"""Rows files: a job's rows land together or not at all, and a line that is not a row is one
warning naming its file and line in every reader (table, compare, card, the rerun's skip
check), never a traceback."""

from __future__ import annotations

import errno
import json
import os

import pytest

from evalkit.cli import main

KNN = [
    "run",
    "--task",
    "imagenet-knn",
    "--backbone",
    "fake",
    "--data",
    "embedded",
    "--quiet",
    "--set",
    "ks=1,3",
]


def _lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "imagenet-knn.jsonl").read_text().splitlines()]


def test_a_full_disk_at_a_jobs_rows_leaves_none_and_the_rerun_writes_each_once(
    cli_env, monkeypatch, capsys
):
    """The disk fills as the job's rows are synced: no row of the job stays behind, so the
    rerun writes every metric of the seed exactly once."""
    real = os.fsync

    def full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", full)
        assert main([*KNN, "--out", "out"]) == 2
    assert "no space left" in capsys.readouterr().err
    assert not (cli_env / "out" / "imagenet-knn.jsonl").read_text()
    assert main([*KNN, "--out", "out"]) == 0
    metrics = [row["metric"] for row in _lines(cli_env / "out")]
    assert sorted(metrics) == ["top1/k=1", "top1/k=3", "top5/k=1", "top5/k=3"]


BAD_LINES = {
    "[1, 2, 3]": "a JSON list",
    '{"task": "imagenet-knn", "backbone": "fake", "metric": "top1/k=1", "value": "12"}': "value",
    '{"metric": "top1/k=1", "value": 1.0}': "no task",
    '{"task": "imagenet-knn", "backb': "not JSON",
}


@pytest.mark.parametrize("bad", list(BAD_LINES))
def test_every_reader_skips_a_malformed_line_with_one_warning(bad, cli_env, capsys):
    assert main([*KNN, "--out", "out"]) == 0
    rows_file = cli_env / "out" / "imagenet-knn.jsonl"
    good = rows_file.read_text().splitlines()
    rows_file.write_text("\n".join([good[0], bad, *good[1:]]) + "\n")
    capsys.readouterr()
    for command in (
        ["table", "out"],
        ["compare", "out", "out"],
        KNN + ["--out", "out"],
        ["card", "out", "--model-id", "org/fake", "--out", "card-out"],
    ):
        assert main(command) == 0, command
        err = capsys.readouterr().err
        assert f"imagenet-knn.jsonl:2 is not a result row ({BAD_LINES[bad]}" in err, (command, err)
        assert "Traceback" not in err
    assert len(rows_file.read_text().splitlines()) == len(good) + 1  # the rerun skipped


def test_a_job_is_its_own_inputs_whatever_seeds_share_its_command(cli_env, capsys):
    """Random weights come from the job's own seed: seed 1 alone and seed 1 beside seed 0 are
    the same backbone with the same numbers, and the table never merges two weights ids of one
    seed (rows such as an older evalkit wrote are labelled apart)."""
    assert main([*KNN, "--seed", "1", "--out", "alone"]) == 0
    assert main([*KNN, "--seed", "0", "--seed", "1", "--out", "both"]) == 0
    alone = {r["metric"]: r for r in _lines(cli_env / "alone")}
    both = {r["metric"]: r for r in _lines(cli_env / "both") if r["seed"] == 1}
    for metric, row in alone.items():
        assert (both[metric]["weights_id"], both[metric]["value"]) == (
            row["weights_id"],
            row["value"],
        )
    seed0 = next(
        r for r in _lines(cli_env / "both") if r["seed"] == 0 and r["metric"] == "top1/k=1"
    )
    assert seed0["weights_id"] != alone["top1/k=1"]["weights_id"]

    from evalkit.core.tables import aggregate

    # seed 1 again, with seed 0's weights (as the first-seed rule wrote it): not merged
    foreign = {**alone["top1/k=1"], "weights_id": seed0["weights_id"], "value": 99.0}
    records = [r for r in aggregate([alone["top1/k=1"], seed0, foreign])]
    assert len({r["backbone"] for r in records}) == len(records) == 2
    assert sorted(r["mean"] for r in records) == sorted(
        [alone["top1/k=1"]["value"], (seed0["value"] + 99.0) / 2]
    )


def test_rows_of_two_seed_rules_are_two_runs_labelled_apart():
    """A row drawn under seed rule 1 (it records none) and one drawn now are not two seeds of
    one run: the table keeps them apart and labels the older rule's."""
    from evalkit.core.labels import repeat_labels
    from evalkit.core.tables import aggregate
    from evalkit.seeds import SEED_RULE

    row = {"task": "imagenet-knn", "backbone": "fake", "metric": "top1", "random_init": True}
    row |= {"config_hash": "c", "higher_is_better": True, "n": 384, "stderr": 1.0}
    rows = [row | {"value": 21.9, "seed": 1}, row | {"value": 23.7, "seed": 0}]
    rows[1]["seed_rule"] = SEED_RULE
    labels = repeat_labels(rows)
    records = aggregate(rows, labels)
    assert sorted(r["mean"] for r in records) == [21.9, 23.7]
    assert sorted(labels.values()) == ["fake (random init)", "fake (random init) [seed rule 1]"]
