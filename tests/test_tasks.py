import dataclasses

import pytest
import torch

from evalkit import get_task
from evalkit.core.runner import run_task
from evalkit.errors import EvalkitError
from evalkit.protocols.classification import stratified_holdout
from evalkit.tasks.fewshot import kshot_indices, shot_seeds


def test_linear_probe_learns_and_is_deterministic(fake, ctx, tmp_path):
    task = get_task("imagenet-linear")
    first, skipped = run_task(task, fake, ctx, out_dir=tmp_path / "a")
    assert not skipped
    values = {r["metric"]: r["value"] for r in first}
    assert values["top1"] > 3 * 100 / 24  # well above chance on 24 classes
    assert values["top5"] >= values["top1"]
    again, _ = run_task(task, fake, ctx, out_dir=tmp_path / "b")
    assert [r["value"] for r in again] == [r["value"] for r in first]
    extra = first[0]["extra"]
    assert len(extra["holdout_top1_by_l2"]) == len(task.l2_grid) and extra["pool"] == "cls"


def test_rerun_skips_and_rerun_recomputes(fake, ctx, tmp_path):
    task = get_task("imagenet-5shot", ["seeds=2"])
    rows, skipped = run_task(task, fake, ctx, out_dir=tmp_path)
    assert not skipped and len(rows) == 1
    rows2, skipped2 = run_task(task, fake, ctx, out_dir=tmp_path)
    assert skipped2 and rows2[0]["value"] == rows[0]["value"]
    rows3, skipped3 = run_task(task, fake, ctx, out_dir=tmp_path, rerun=True)
    assert not skipped3 and rows3[0]["value"] == rows[0]["value"]
    lines = (tmp_path / "imagenet-5shot.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the rerun's rows replace the job's old ones


def test_fewshot_row_has_mean_and_std_over_seeds(fake, ctx, tmp_path):
    [row], _ = run_task(get_task("imagenet-1shot"), fake, ctx, out_dir=tmp_path)
    per_seed = row["extra"]["per_seed"]
    assert len(per_seed) == 3 and row["seeds"] == shot_seeds(0, 3)  # each draw's own seed
    assert row["value"] == pytest.approx(sum(per_seed) / 3)
    assert row["std"] == pytest.approx(torch.tensor(per_seed).std().item())
    assert row["stderr"] is None  # a spread over seeds is not a standard error


def test_fewshot_jobs_of_two_seeds_share_no_shot_draw(fake, ctx, tmp_path, monkeypatch):
    """Jobs of seeds 0 and 1 are independent experiments: no draw of shots of one is a draw
    of the other (each draw is named by its job's seed and its index, not seed + index)."""
    import evalkit.tasks.fewshot as fewshot

    drawn = []

    def recorded(*args, **kwargs):
        drawn[-1].append(kshot_indices(*args, **kwargs))
        return drawn[-1][-1]

    monkeypatch.setattr(fewshot, "kshot_indices", recorded)
    rows = {}
    for seed in (0, 1):
        drawn.append([])
        ctx.seed = seed
        [rows[seed]], _ = run_task(
            get_task("imagenet-5shot"), fake, ctx, out_dir=tmp_path / f"s{seed}"
        )
    assert len(drawn[0]) == len(drawn[1]) == 3
    assert not any(torch.equal(a, b) for a in drawn[0] for b in drawn[1])
    assert not set(rows[0]["seeds"]) & set(rows[1]["seeds"])  # nor do their rows say so
    assert rows[0]["seeds"] != [0, 1, 2] and rows[0]["seed"] == 0


def test_row_provenance(fake, ctx, tmp_path):
    [row, _], _ = run_task(get_task("imagenet-linear"), fake, ctx, out_dir=tmp_path)
    for key in ("task_version", "weights_id", "config_hash", "data_id", "higher_is_better", "n"):
        assert key in row
    prov = row["provenance"]
    for key in (
        "torch",
        "timm",
        "evalkit",
        "device",
        "dtype",
        "wall_s",
        "images_per_s",
        "peak_mem_mb",
    ):
        assert key in prov
    assert set(row["data_id"]) == {"train", "val"}


def test_set_overrides_are_typed_and_validated():
    task = get_task("imagenet-linear", ["layers=-1,-2", "holdout=0.1", "pool=mean", "max_iter=5"])
    assert task.layers == (-1, -2) and task.holdout == 0.1 and task.max_iter == 5
    with pytest.raises(EvalkitError, match="no setting 'l2'.*l2_grid"):
        get_task("imagenet-linear", ["l2=1"])
    with pytest.raises(EvalkitError, match="expected a value of type int"):
        get_task("imagenet-linear", ["max_iter=many"])
    with pytest.raises(EvalkitError, match="key=value"):
        get_task("imagenet-linear", ["max_iter"])


def test_concat_of_last_layers_widens_features(fake, ctx, tmp_path):
    task = dataclasses.replace(get_task("imagenet-linear"), layers=(-1, -2), max_iter=20)
    rows, _ = run_task(task, fake, ctx, out_dir=tmp_path)
    assert list(rows[0]["config"]["layers"]) == [-1, -2]
    assert rows[0]["extra"]["n_train"] == 24 * 40


def test_kshot_and_holdout_indices_are_seeded_and_per_class():
    labels = torch.arange(5).repeat_interleave(10)
    picks = kshot_indices(labels, 3, seed=7)
    assert torch.equal(picks, kshot_indices(labels, 3, seed=7))
    assert not torch.equal(picks, kshot_indices(labels, 3, seed=8))
    assert torch.bincount(labels[picks]).tolist() == [3] * 5
    fit, held = stratified_holdout(labels, 0.2, seed=0)
    assert torch.bincount(labels[held]).tolist() == [2] * 5
    assert sorted(torch.cat([fit, held]).tolist()) == list(range(50))
