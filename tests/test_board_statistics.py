"""A leaderboard whose every order is one the data supports: bootstrap-tested pairs can be
significant at any zoo size, what is tested is what is ranked (seeds as clusters), tiers
follow the verdicts, and the overall order carries its own uncertainty (rank intervals,
P(first), Friedman's test over the tasks). Zoos are built here as files, as runs write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from evalkit.publish.leaderboard import leaderboard
from evalkit.significance import bootstrap_p, paired_bootstrap


def write_cell(folder: Path, task: str, backbone: str, per_image: dict, seed: int = 0):
    """One cell as a run writes it: a row (the mean of the per-image metric) and its
    per-image outputs under ``predictions/``."""
    metric = next(k for k in per_image if k != "image")
    key = f"{abs(hash((task, backbone, seed))):016x}"[:16]
    row = {
        "task": task,
        "backbone": backbone,
        "metric": metric,
        "value": float(np.mean(per_image[metric])) * (100 if metric == "top1" else 1),
        "higher_is_better": metric != "mse",
        "seed": seed,
        "run_key": key,
        "dataset": {"name": "synthetic", "own": True, "stand_in": False},
    }
    if metric == "top1":
        per_image = {"image": per_image["image"], "correct": per_image["top1"]}
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{task}.jsonl", "a") as rows:
        rows.write(json.dumps(row) + "\n")
    slug = f"{task}--{backbone}--s{seed}--{key}".replace("/", "_")
    (folder / "predictions").mkdir(exist_ok=True)
    pd.DataFrame(per_image).to_parquet(folder / "predictions" / f"{slug}.parquet")


def test_a_clear_gap_is_significant_after_holm_in_a_20_backbone_zoo(tmp_path):
    """190 pairs: the bootstrap's counted p (at least 2/2001) times Holm's family would be
    0.19; the tail of the resamples' spread has no such floor."""
    rng = np.random.default_rng(0)
    images = [f"{i}.png" for i in range(300)]
    base = rng.gamma(2.0, 5.0, size=300)
    for b in range(20):
        noise = rng.normal(0, 0.5, size=300)
        shift = -10.0 if b == 0 else rng.normal(0, 0.05)  # backbone-00 errs 10 points less
        write_cell(tmp_path, "depth", f"b{b:02d}", {"image": images, "mse": base + shift + noise})
    (task,) = leaderboard([tmp_path])["tasks"]
    assert task["cells"][0]["backbone"] == "b00" and task["cells"][0]["tier"] == 1
    best = [p for p in task["pairs"] if "b00" in (p["a"], p["b"])]
    assert len(best) == 19 and all(p["significant"] for p in best), best[0]
    assert all(p["verdict"].startswith("b00 > ") for p in best)
    assert all(c["tier"] > 1 for c in task["cells"][1:])


def test_the_spreads_tail_is_used_only_where_the_count_is_too_thin():
    """The tail is Student's t on images − 1 degrees of freedom of the spread's z rescaled by
    √((n − 1)/n) (it was the normal's, whose p ≤ 0.01 came twice as often as it should at
    30 images: tests/test_significance_calibration.py)."""
    rng = np.random.default_rng(1)
    a = rng.normal(0, 1, size=(400, 1))
    b = a + rng.normal(0.05, 1, size=(400, 1))  # a small difference: many far-side resamples
    close = paired_bootstrap(a, b, lambda x: float(x.mean()))
    assert "far-side count" in close.test and 0.05 < close.p <= 1
    far = paired_bootstrap(a, a + 3.0, lambda x: float(x.mean()))
    assert "t tail" in far.test and far.p < 1e-12
    spread = np.std([1.2, 0.8, 1.1, 0.9], ddof=1)
    p, how = bootstrap_p(1.0, np.array([1.2, 0.8, 1.1, 0.9]), 30)
    assert how.startswith("t tail")
    assert p == pytest.approx(2 * stats.t.sf(1.0 / spread * np.sqrt(29 / 30), df=29))
    assert bootstrap_p(1.0, np.array([1.2, 0.8]), 1) == (1.0, "one image: nothing to resample")


def test_what_is_tested_is_what_is_ranked_when_cells_have_seeds(tmp_path):
    """A's first seed beats B's first seed by far, but B's mean over seeds is higher: B ranks
    first, and no verdict may say A beats B (today's first-seed test did, at p < 1e-4)."""
    rng = np.random.default_rng(2)
    images = [f"{i}.png" for i in range(384)]
    draws = {
        ("A", 0): 0.80,
        ("A", 1): 0.40,
        ("B", 0): 0.55,
        ("B", 1): 0.75,
    }
    for (name, seed), share in draws.items():
        right = rng.uniform(size=384) < share
        write_cell(tmp_path, "imagenet-linear", name, {"image": images, "top1": right}, seed=seed)
    (task,) = leaderboard([tmp_path])["tasks"]
    ranked = [c["backbone"] for c in task["cells"]]
    assert ranked == ["B", "A"]
    (pair,) = task["pairs"]
    assert "2 and 2 seeds per image" in pair["test"]
    assert not pair["verdict"].startswith("A > B")
    assert all(c["seeds"] == 2 and c["seed_sd"] > 10 for c in task["cells"])


def test_the_overall_order_carries_its_uncertainty(tmp_path):
    """Five setups on six tasks with no real order: Friedman's p (scipy's on the same ranks)
    says so; rank intervals and P(first) are there for every complete setup."""
    rng = np.random.default_rng(3)
    images = [f"{i}.png" for i in range(50)]
    for t in range(6):
        for b in range(5):
            values = rng.normal(5.0, 1.0, size=50)
            write_cell(tmp_path, f"task{t}", f"b{b}", {"image": images, "mse": values})
    board = leaderboard([tmp_path])
    ranks = np.array(
        [
            [c["rank"] for c in sorted(t["cells"], key=lambda c: c["backbone"])]
            for t in board["tasks"]
        ]
    )
    expected = stats.friedmanchisquare(*ranks.T)
    assert board["friedman"]["p"] == pytest.approx(expected.pvalue)
    assert board["friedman"]["tasks"] == 6 and board["friedman"]["setups"] == 5
    assert sum(e["p_first"] for e in board["overall"]) == pytest.approx(1.0, abs=1e-3)
    for entry in board["overall"]:
        low, high = entry["rank_interval"]
        assert 1 <= low <= high <= 5
        assert 0 <= entry["p_first"] < 0.9  # no setup is surely first when there is no order


def test_the_board_prints_tiers_intervals_and_friedman(tmp_path, capsys):
    from evalkit.cli import main

    rng = np.random.default_rng(4)
    images = [f"{i}.png" for i in range(40)]
    for t in range(3):
        for b in range(3):
            write_cell(
                tmp_path, f"task{t}", f"b{b}", {"image": images, "mse": rng.normal(b, 1, 40)}
            )
    assert main(["leaderboard", str(tmp_path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| mean rank | tier | rank interval | P(first) |" in out and "| rank | tier |" in out
    assert main(["leaderboard", str(tmp_path)]) == 0
    assert "Friedman over 3 tasks and 3 setups" in " ".join(capsys.readouterr().out.split())


def test_snapshots_keep_a_boards_history_with_an_index(tmp_path):
    from evalkit.cli import main

    rng = np.random.default_rng(5)
    images = [f"{i}.png" for i in range(40)]
    for b in range(3):
        write_cell(tmp_path / "R", "task0", f"b{b}", {"image": images, "mse": rng.normal(b, 1, 40)})
    kept = tmp_path / "history"
    for _ in range(2):
        assert (
            main(
                [
                    "leaderboard",
                    str(tmp_path / "R"),
                    "--snapshot",
                    str(kept),
                    "--format",
                    "json",
                    "--output",
                    str(tmp_path / "b.json"),
                ]
            )
            == 0
        )
    dated = sorted(p for p in kept.iterdir() if p.is_dir())
    assert len(dated) == 2 and all((p / "leaderboard.html").exists() for p in dated)
    index = (kept / "index.html").read_text()
    assert all(f'href="{p.name}/leaderboard.html"' in index for p in dated)
    assert "first overall: b0" in index


@pytest.mark.slow
def test_the_leaderboard_renders_in_a_real_browser(tmp_path):
    """Headless Chromium (``apt-get install chromium``) draws the page and the snapshot index:
    not blank, the ranks figure drawn, no console error."""
    import subprocess

    from browser import chromium, flags
    from PIL import Image

    from evalkit.cli import main

    browser = chromium()
    rng = np.random.default_rng(6)
    images = [f"{i}.png" for i in range(40)]
    for t in range(2):
        for b in range(3):
            write_cell(
                tmp_path / "R", f"task{t}", f"b{b}", {"image": images, "mse": rng.normal(b, 1, 40)}
            )
    assert main(["leaderboard", str(tmp_path / "R"), "--snapshot", str(tmp_path / "S")]) == 0
    (dated,) = [p for p in (tmp_path / "S").iterdir() if p.is_dir()]
    for page in (dated / "leaderboard.html", tmp_path / "S" / "index.html"):
        shot = tmp_path / f"{page.stem}.png"
        extra = ["--enable-logging=stderr", "--v=0", "--window-size=1000,1400"]
        argv = flags(tmp_path / "profile", *extra, f"--screenshot={shot}", page.as_uri())
        done = subprocess.run([browser, *argv], capture_output=True, text=True, timeout=120)
        assert shot.exists(), done.stderr[-2000:]
        console = [x for x in done.stderr.splitlines() if "CONSOLE" in x or "Uncaught" in x]
        assert not console, console
        pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
        assert len(np.unique(pixels, axis=0)) > 20  # not blank
        if page.name == "leaderboard.html":  # the ranks figure's mean-rank dots (#246)
            assert (np.abs(pixels.astype(int) - (34, 68, 102)).sum(axis=1) < 30).sum() > 50


def test_cells_carry_what_a_third_party_needs_to_redo_a_test(tmp_path):
    import hashlib

    rng = np.random.default_rng(7)
    images = [f"{i}.png" for i in range(50)]
    for b in range(2):
        write_cell(
            tmp_path,
            "imagenet-linear",
            f"b{b}",
            {"image": images, "top1": rng.uniform(size=50) < 0.6},
        )
    (task,) = leaderboard([tmp_path])["tasks"]
    for cell in task["cells"]:
        (path,) = (tmp_path / "predictions").glob(f"imagenet-linear--{cell['backbone']}--*.parquet")
        assert cell["outputs"] == [hashlib.sha256(path.read_bytes()).hexdigest()]
        assert cell["right"] == int(pd.read_parquet(path)["correct"].sum())
        assert cell["right"] == round(cell["value"] * 50 / 100)


def test_a_board_of_cells_measured_differently_is_refused_unless_asked(tmp_path, capsys):
    from evalkit.cli import main
    from evalkit.errors import EvalkitError

    images = [f"{i}.png" for i in range(30)]
    for b in range(2):
        write_cell(tmp_path, "depth", f"b{b}", {"image": images, "mse": np.arange(30.0) + b})
    rows = tmp_path / "depth.jsonl"
    lines = [json.loads(x) for x in rows.read_text().splitlines()]
    lines[1]["task_version"] = 2  # b1 was measured by another version of the task
    rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(EvalkitError, match="measured with different task_version"):
        leaderboard([tmp_path])
    assert main(["leaderboard", str(tmp_path)]) == 2
    assert "--allow-mixed" in capsys.readouterr().err
    (task,) = leaderboard([tmp_path], mixed=True)["tasks"]
    assert task["fingerprint"] == "mixed"
    lines[1]["task_version"] = lines[0].get("task_version")
    rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
    board = leaderboard([tmp_path])
    assert len(board["tasks"][0]["fingerprint"]) == 12 and len(board["suite"]) == 12


def test_a_task_plugin_declares_its_own_paired_test(tmp_path, monkeypatch):
    """A plugin task with a metric of its own ("median error", recomputed from a per-image
    column the default rule does not know) gets a paired test from its own declaration,
    nothing in evalkit.publish touched."""
    from dataclasses import dataclass

    from evalkit.core import catalog
    from evalkit.core.task import Task
    from evalkit.significance import PerImageTest

    @dataclass(frozen=True)
    class Toy(Task):
        name: str = "toy-median"

        def paired_test(self, metric, columns):
            if metric == "median_error" and "error" in columns:
                return PerImageTest(
                    lambda f: f[["error"]].to_numpy(float), lambda p: float(np.median(p[:, 0]))
                )
            return None

    monkeypatch.setattr(
        catalog, "resolve_task", lambda name, *_: Toy() if name == "toy-median" else None
    )
    images = [f"{i}.png" for i in range(200)]
    rng = np.random.default_rng(8)
    for b, shift in enumerate((0.0, 3.0)):
        errors = rng.gamma(2.0, 1.0, 200) + shift
        write_cell(tmp_path, "toy-median", f"b{b}", {"image": images, "error": errors})
    rows = tmp_path / "toy-median.jsonl"
    lines = [
        json.loads(x) | {"metric": "median_error", "higher_is_better": False}
        for x in rows.read_text().splitlines()
    ]
    rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (task,) = leaderboard([tmp_path])["tasks"]
    (pair,) = task["pairs"]
    assert pair["significant"] and "bootstrap" in pair["test"], pair["verdict"]


def test_a_boards_shared_resamples_give_each_pairs_own_bootstrap(tmp_path, monkeypatch):
    """Scoring every cell once on shared draws is only faster: each pair's p-value and
    interval are the bits its own bootstrap gives on the same seed."""
    import evalkit.publish.board_pairs as board_module

    rng = np.random.default_rng(9)
    images = [f"{i}.png" for i in range(120)]
    for b in range(5):
        write_cell(
            tmp_path, "depth", f"b{b}", {"image": images, "mse": rng.gamma(2.0, 1.0, 120) + 0.2 * b}
        )
    shared = leaderboard([tmp_path], seed=4)["tasks"][0]["pairs"]
    monkeypatch.setattr(board_module, "shared_resamples", lambda *_: None)
    alone = leaderboard([tmp_path], seed=4)["tasks"][0]["pairs"]
    assert [(p["p"], p["interval"]) for p in shared] == [(p["p"], p["interval"]) for p in alone]


def test_across_tasks_wilcoxon_holm_cliques_tiers_and_the_cd_diagram(tmp_path, capsys):
    """Four setups on eight tasks; b0 is best on every task, the others interchange. The
    pairs are scipy's Wilcoxon signed-rank test on per-task ranks, Holm-corrected; b0 stands
    alone, the rest form one clique and one tier; the HTML page draws the diagram, a PNG
    beside it."""
    from evalkit.cli import main
    from evalkit.significance import holm

    rng = np.random.default_rng(10)
    images = [f"{i}.png" for i in range(30)]
    for t in range(8):
        shuffle = rng.permutation(3) + 1
        for b in range(4):
            level = 0.0 if b == 0 else float(shuffle[b - 1])
            values = level + rng.normal(0, 0.01, 30)
            write_cell(tmp_path / "R", f"task{t}", f"b{b}", {"image": images, "mse": values})
    board = leaderboard([tmp_path / "R"])
    across = board["across_tasks"]
    names = ["b0", "b1", "b2", "b3"]
    ranks = np.array(
        [
            [next(c["rank"] for c in t["cells"] if c["backbone"] == n) for n in names]
            for t in board["tasks"]
        ]
    )
    column = {name: i for i, name in enumerate(names)}
    expected = [
        stats.wilcoxon(
            ranks[:, column[p["a"]]], ranks[:, column[p["b"]]], zero_method="zsplit"
        ).pvalue
        for p in across["pairs"]
    ]
    assert len(expected) == 6
    assert [p["p"] for p in across["pairs"]] == pytest.approx(expected)
    assert [p["p_holm"] for p in across["pairs"]] == pytest.approx(holm(expected))
    assert all(p["significant"] for p in across["pairs"] if p["a"] == "b0")
    assert across["cliques"] == [sorted(names[1:], key=across["mean_ranks"].get)]
    assert {e["backbone"]: e["tier"] for e in board["overall"]} == {
        "b0": 1,
        "b1": 2,
        "b2": 2,
        "b3": 2,
    }
    page = tmp_path / "board.html"
    assert (
        main(["leaderboard", str(tmp_path / "R"), "--format", "html", "--output", str(page)]) == 0
    )
    assert "critical-difference diagram" in page.read_text()
    assert (tmp_path / "board.cd.png").stat().st_size > 1000


def sums_cases(seed: int, images: int) -> dict:
    """Per-image parts of the four metrics that declare ``Sums``, and their tests."""
    from evalkit.protocols.paired_tests import accuracy_sums, ood_accuracy_test, shape_bias_test
    from evalkit.significance import ece_of, ece_sums, miou_of, miou_sums

    rng = np.random.default_rng(seed)
    overlap = rng.integers(0, 50, (images, 6)).astype(float) * (rng.uniform(size=(images, 6)) < 0.6)
    miou = np.hstack([overlap, overlap + rng.integers(0, 30, (images, 6))])
    confidence = rng.uniform(0.05, 1.0, images)
    ece = np.column_stack([confidence, rng.uniform(size=images) < confidence, np.full(images, 15)])
    cue = (rng.uniform(size=(images, 2)) < 0.4).astype(float)
    sets = rng.integers(0, 3, images)
    groups = np.where(
        rng.uniform(size=images) < 0.1, -1, sets * 10_000 + rng.integers(0, 4, images)
    )
    ood = np.column_stack([rng.uniform(size=images) < 0.6, groups, sets]).astype(float)
    return {
        "miou": (miou, miou_of, miou_sums),
        "ece": (ece, lambda p: ece_of(p[:, :2], 15), ece_sums),
        "shape bias": (cue, shape_bias_test().statistic, shape_bias_test().sums),
        "ood accuracy": (ood, ood_accuracy_test({}).statistic, accuracy_sums),
    }


@pytest.mark.parametrize("name", ["miou", "ece", "shape bias", "ood accuracy"])
def test_a_metric_of_sums_on_resample_counts_is_the_metric_on_the_resample(name):
    """What ``Sums`` computes from one product of counts is, on every resample, the metric the
    row computes from the resampled images themselves (to the order of the additions)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from evalkit.significance import resample_counts

    @settings(max_examples=25, deadline=None)
    @given(st.integers(0, 2**32 - 1), st.integers(5, 60))
    def check(seed, images):
        parts, statistic, sums = sums_cases(seed, images)[name]
        draws = np.random.default_rng(seed + 1).integers(0, images, size=(8, images))
        rows, of_sums = sums(parts)
        fast = of_sums(resample_counts(draws, images) @ rows, images)
        slow = np.array([statistic(parts[draw]) for draw in draws])
        assert np.allclose(fast, slow, rtol=1e-12, atol=1e-12, equal_nan=True)
        plain = of_sums(rows.sum(axis=0, keepdims=True), images)
        assert np.allclose(plain, [statistic(parts)], rtol=1e-12, atol=1e-12, equal_nan=True)

    check()


def test_resample_counts_count_each_draw():
    from evalkit.significance import resample_counts

    draws = np.array([[0, 0, 2, 3], [1, 1, 1, 1]])
    assert resample_counts(draws, 4).tolist() == [[2, 0, 1, 1], [0, 4, 0, 0]]


def write_segmentation_cell(folder: Path, backbone: str, parts: np.ndarray):
    """An ADE20k cell as a run writes it: its mIoU row, and per-image intersections and
    unions (one list per image) under ``predictions/``."""
    from evalkit.significance import miou_of

    classes, key = parts.shape[1] // 2, f"{backbone:0>16}"
    row = {"task": "ade20k-1/16", "backbone": backbone, "metric": "miou", "seed": 0}
    row |= {"value": miou_of(parts), "higher_is_better": True, "run_key": key}
    row["dataset"] = {"name": "ade20k", "own": True, "stand_in": False}
    (folder / "predictions").mkdir(parents=True, exist_ok=True)
    with open(folder / "ade20k-1_16.jsonl", "a") as rows:
        rows.write(json.dumps(row) + "\n")
    frame = pd.DataFrame({"image": [f"{i}.png" for i in range(len(parts))]})
    frame["intersection"] = list(parts[:, :classes])
    frame["union"] = list(parts[:, classes:])
    frame.to_parquet(folder / "predictions" / f"ade20k-1_16--{backbone}--s0--{key}.parquet")


def test_an_miou_board_is_bootstrapped_on_shared_counts_with_the_loops_verdicts(
    tmp_path, monkeypatch
):
    """mIoU is a metric of sums: a board scores each cell once on the shared draws (each
    pair's own bootstrap gives the same bits), and its p-values and verdicts are the ones the
    resample-by-resample loop gives on the same draws."""
    import evalkit.publish.board_pairs as board_module
    from evalkit.significance import miou_of, paired_bootstrap

    rng = np.random.default_rng(5)
    truth = rng.integers(1, 40, (150, 8)).astype(float)
    cells = []
    for b in range(4):
        hit = np.minimum(truth, rng.binomial(truth.astype(int), 0.5 + 0.08 * b))
        cells.append(np.hstack([hit, 2 * truth - hit]))
        write_segmentation_cell(tmp_path, f"b{b}", cells[-1])
    shared = leaderboard([tmp_path], seed=3)["tasks"][0]["pairs"]
    assert all("bootstrap" in pair["test"] for pair in shared)
    monkeypatch.setattr(board_module, "shared_resamples", lambda *_: None)
    alone = leaderboard([tmp_path], seed=3)["tasks"][0]["pairs"]
    assert [(p["p"], p["interval"]) for p in shared] == [(p["p"], p["interval"]) for p in alone]
    by_name = {f"b{b}": parts for b, parts in enumerate(cells)}
    for pair in shared:
        loop = paired_bootstrap(by_name[pair["a"]], by_name[pair["b"]], miou_of, seed=3)
        assert pair["p"] == loop.p
        assert np.allclose(pair["interval"], loop.interval, rtol=1e-9)
    assert sum(pair["significant"] for pair in shared) >= 3


def test_a_boards_mcnemar_at_once_is_each_pairs_own(tmp_path, monkeypatch):
    """All pairs' discordant counts from one product of the correctness matrix: every pair's
    counts, p-value, difference and interval are those of its own ``mcnemar``."""
    import evalkit.publish.board_pairs as board_module

    rng = np.random.default_rng(2)
    images = [f"{i}.png" for i in range(400)]
    for b in range(6):
        right = rng.uniform(size=400) < 0.5 + 0.05 * b
        write_cell(tmp_path, "imagenet-linear", f"b{b}", {"image": images, "top1": right})
    together = leaderboard([tmp_path])["tasks"][0]["pairs"]
    assert all("exact McNemar" in pair["test"] for pair in together)
    monkeypatch.setattr(board_module, "board_tests", lambda *_: None)
    alone = leaderboard([tmp_path])["tasks"][0]["pairs"]
    assert together == alone
    assert sum(pair["significant"] for pair in together) >= 5


def test_signed_rank_p_values_are_scipys_wilcoxon_bit_for_bit():
    """All pairs' Wilcoxon p-values at once (every sign of the differences enumerated) are
    ``scipy.stats.wilcoxon(zero_method="zsplit")``'s, exactly: with and without ties and
    zeros, whole and fractional differences, 2 to 8 tasks (and 14, scipy's own path)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from evalkit.significance import signed_rank_p

    @settings(max_examples=40, deadline=None)
    @given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.sampled_from(["ranks", "real"]))
    def check(seed, tasks, kind):
        rng = np.random.default_rng(seed)
        if kind == "ranks":
            x, y = (rng.integers(1, 6, (5, tasks)).astype(float) for _ in range(2))
            y[0] = x[0] + rng.choice([-1.5, 0.0, 0.5], tasks)
        else:
            x, y = rng.normal(size=(5, tasks)), rng.normal(size=(5, tasks))
        x, y = x[~np.all(x == y, axis=1)], y[~np.all(x == y, axis=1)]
        theirs = [
            stats.wilcoxon(a, b, zero_method="zsplit").pvalue for a, b in zip(x, y, strict=True)
        ]
        assert signed_rank_p(x, y).tolist() == theirs

    check()
    x, y = np.arange(28.0).reshape(2, 14), np.arange(28.0).reshape(2, 14)[:, ::-1]
    theirs = [stats.wilcoxon(a, b, zero_method="zsplit").pvalue for a, b in zip(x, y, strict=True)]
    assert signed_rank_p(x, y).tolist() == theirs


def test_tiers_are_monotone_in_rank():
    """Rank 5 not separated from the leader, ranks 2–4 separated from it: a tier is a run down
    the ranks, so rank 5 is never in a better tier than ranks 2–4."""
    from evalkit.publish.board_ranks import tiers_of

    order = ["r1", "r2", "r3", "r4", "r5"]
    apart = {frozenset(("r1", n)) for n in ("r2", "r3", "r4")}
    tiers = tiers_of(order, apart)
    assert [tiers[n] for n in order] == [1, 2, 2, 2, 2]
    ranks = [tiers[n] for n in order]
    assert ranks == sorted(ranks)


def test_few_tasks_say_they_cannot_separate_any_two_setups(tmp_path):
    """With 3 tasks the signed-rank test's smallest p is 2/2³ = 0.25: the board says no two
    setups can be separated, even when one beats another on every task, and how many tasks
    it would take; with 10 tasks it can."""
    from evalkit.publish.board_ranks import separable

    assert separable("wilcoxon-holm", 3, 4, 0.05)["separable"] is False
    assert "at least 8" in separable("wilcoxon-holm", 3, 4, 0.05)["note"]  # 2^-7 ≤ 0.05/6
    assert separable("wilcoxon-holm", 7, 4, 0.05)["separable"] is False
    assert separable("wilcoxon-holm", 9, 4, 0.05)["separable"] is True
    assert separable("wilcoxon-holm", 6, 2, 0.05)["separable"] is True  # 2^-5 ≤ 0.05
    assert separable("nemenyi", 2, 3, 0.05)["separable"] is False
    rng = np.random.default_rng(3)
    images = [f"{i}.png" for i in range(30)]
    for t in range(3):
        for b in range(3):
            values = b + rng.normal(0, 0.01, 30)  # b0 best on every task by far
            write_cell(tmp_path / "R", f"task{t}", f"b{b}", {"image": images, "mse": values})
    across = leaderboard([tmp_path / "R"])["across_tasks"]
    assert across["separable"] is False and "3 tasks cannot separate" in across["note"]


@pytest.mark.parametrize("seed", range(5))
def test_nemenyi_p_values_are_scikit_posthocs(seed):
    """Nemenyi's p of every pair from the same per-task ranks as scikit-posthocs'
    ``posthoc_nemenyi_friedman`` (Demšar's test after Friedman)."""
    sp = pytest.importorskip("scikit_posthocs")
    from evalkit.publish.board_ranks import nemenyi_p

    rng = np.random.default_rng(seed)
    tasks, setups = int(rng.integers(4, 20)), int(rng.integers(3, 8))
    values = rng.normal(size=(tasks, setups)) - 1.5 * (np.arange(setups) == 0)  # one leads
    table = np.apply_along_axis(stats.rankdata, 1, values)
    i, j = np.triu_indices(setups, k=1)
    reference = sp.posthoc_nemenyi_friedman(table).to_numpy()
    assert nemenyi_p(table, i, j) == pytest.approx(reference[i, j], rel=1e-6, abs=1e-9)


def test_nemenyi_separates_the_setup_last_on_every_task(tmp_path):
    """Twelve tasks, four setups; b3 last on every task, the others interchange: Nemenyi puts
    b3 in a tier of its own (as autorank does), below the others."""
    rng = np.random.default_rng(5)
    images = [f"{i}.png" for i in range(30)]
    for t in range(12):
        shuffle = rng.permutation(3)
        for b in range(4):
            level = 5.0 if b == 3 else float(shuffle[b])
            values = level + rng.normal(0, 0.01, 30)
            write_cell(tmp_path / "R", f"task{t}", f"b{b}", {"image": images, "mse": values})
    board = leaderboard([tmp_path / "R"], cd="nemenyi")
    across = board["across_tasks"]
    assert across["test"].startswith("Nemenyi")
    tiers = {e["backbone"]: e["tier"] for e in board["overall"]}
    assert tiers["b3"] > max(tiers[b] for b in ("b0", "b1", "b2"))


def _simulated_board(rng, setups: int, images: int, shifts, resamples: int = 200):
    """One task's board of ``setups`` with per-image right or wrong (accuracy 0.7 + shift),
    its images resampled as the leaderboard does: (rank draws, observed ranks)."""
    from evalkit.publish.board_ranks import rank_draws
    from evalkit.publish.board_reading import Board

    correct = rng.random((setups, images)) < 0.7 + np.asarray(shifts)[:, None]
    draws = rng.integers(0, images, size=(resamples, images))
    names = [f"s{i}" for i in range(setups)]
    resampled = {name: correct[i][draws].mean(axis=1) for i, name in enumerate(names)}
    observed = stats.rankdata(-correct.mean(axis=1))
    board = Board("t", "top1", True, resampled=resampled)
    return rank_draws(board, names, observed), observed


def _order_uncertainty(tasks: int, setups: int, images: int, shifts, boards: int = 100):
    """Per simulated suite: the leader's P(first), whether it is a clear leader (rank
    interval [1, 1] or P(first) ≥ 0.95), and the share of setups whose interval covers its
    true rank."""
    from evalkit.publish.board_ranks import _places, rank_uncertainty

    rng = np.random.default_rng(0)
    truth = _places(-np.asarray(shifts, dtype=float))
    found = []
    for number in range(boards):
        suite = [_simulated_board(rng, setups, images, shifts) for _ in range(tasks)]
        spread = rank_uncertainty([draws for draws, _ in suite], number)
        leader = int(np.argmin(np.mean([observed for _, observed in suite], axis=0)))
        first = spread[leader]["p_first"]
        clear = spread[leader]["rank_interval"] == [1.0, 1.0] or first >= 0.95
        covered = np.mean(
            [
                low <= truth[i] <= high
                for i, (low, high) in enumerate(s["rank_interval"] for s in spread.values())
            ]
        )
        found.append((first, clear, covered))
    return np.array(found, dtype=float)


@pytest.mark.parametrize("tasks", [2, 6])
def test_on_null_boards_the_order_claims_no_leader(tasks):
    """Five exchangeable setups (the same accuracy, 200 images per task): with the images'
    own noise resampled beside the tasks', a clear leader appears on at most 5% of 100
    boards, and the observed leader's P(first) averages at most 0.5 (truth 1/5; the winner
    of a noisy board keeps an edge in its own bootstrap). Resampling the tasks alone, as
    before, gave a clear leader on 15% of 2-task boards and P(first) 0.69 on average."""
    found = _order_uncertainty(tasks, 5, 200, np.zeros(5))
    assert found[:, 1].mean() <= 0.05
    assert found[:, 0].mean() <= 0.5


def test_rank_intervals_cover_a_known_order():
    """Four setups 3 points apart in accuracy, six tasks of 400 images: each 95% rank
    interval holds the setup's true rank on at least 95% of 60 suites, and the best setup is
    still found to lead clearly on a fair share of them (the intervals are not vacuous)."""
    found = _order_uncertainty(6, 4, 400, np.array([0.0, 0.03, 0.06, 0.09]), boards=60)
    assert found[:, 2].mean() >= 0.95
    assert found[:, 1].mean() >= 0.2


LONG_NAMES = [
    "timm/vit_base_patch16_224.augreg_in21k",
    "timm/vit_small_patch16_224.augreg_in21k",
    "open_clip/ViT-B-32:laion2b_s34b_b79k",
    "timm/convnext_tiny.fb_in22k",
    "timm/resnet50.a1_in1k",
    "vit22b/ti [qk_norm=false] (random init)",
]
MEASURE = """
  const cut = [];
  for (const svg of document.querySelectorAll("svg")) {
    const width = svg.width.baseVal.value;
    for (const text of svg.querySelectorAll("text")) {
      const box = text.getBBox();
      if (box.x < 0 || box.x + box.width > width) cut.push(text.textContent);
    }
  }
  return cut;
"""


@pytest.mark.slow
def test_no_label_of_the_boards_figures_is_cut_in_a_browser(tmp_path):
    """Long setup names in the ranks figure and the critical-difference diagram, measured by
    headless Chromium (each SVG text's box inside its figure); the diagram draws each clique
    as its own bar and says what a bar means."""
    from browser import chromium, measured

    from evalkit.cli import main

    chromium()
    rng = np.random.default_rng(1)
    images = [f"{i}.png" for i in range(50)]
    for t in range(10):
        shuffle = rng.permutation(3)
        for b, name in enumerate(LONG_NAMES):
            level = 0.4 * b if b < 3 else 3.0 + shuffle[b - 3]
            values = level + rng.normal(0, 0.3, 50)
            write_cell(tmp_path / "R", f"task{t}", name, {"image": images, "mse": values})
    page = tmp_path / "board.html"
    assert main(["leaderboard", str(tmp_path / "R"), "--output", str(page)]) == 0
    text = page.read_text()
    assert "A bar joins setups that no test across the tasks" in text
    assert text.count('stroke="#c52"') == len(
        leaderboard([tmp_path / "R"])["across_tasks"]["cliques"]
    )
    assert measured(page, MEASURE, tmp_path / "profile") == []


folder_names = st.lists(st.sampled_from(["a", "b", "n01", "val", "x y"]), min_size=0, max_size=3)


@given(
    prefix=folder_names,
    files=st.lists(
        st.tuples(folder_names.map(tuple), st.sampled_from(["1.png", "2.JPEG", "c.png"])),
        min_size=2,
        max_size=8,
        unique=True,
    ),
    absolute=st.booleans(),
)
def test_relative_ids_are_relpath_from_the_common_folder(prefix, files, absolute):
    """Image ids cut by slicing equal os.path.relpath from os.path.commonpath, on absolute
    and relative ids alike (relative ids with no folder in common are kept)."""
    import os

    from evalkit.publish.board_reading import relative_ids

    root = ("/" if absolute else "") + "/".join(prefix)
    ids = [os.path.join(root, *folders, name) for folders, name in files]
    common = os.path.commonpath(ids)
    expected = [os.path.relpath(i, common) for i in ids] if common else ids
    assert relative_ids(ids) == expected


@given(
    absolute=st.lists(st.sampled_from(["/d/a/1.png", "/d/b/2.png", "/e/c.png"]), min_size=1),
    relative=st.lists(st.sampled_from(["d/a/1.png", "a/2.png", "./c.png"]), min_size=1),
)
def test_ids_mixing_absolute_and_relative_paths_are_kept_as_they_are(absolute, relative):
    """A file naming some images by absolute path and some by relative path has no folder
    all ids share: its ids are kept, in any order of the two kinds."""
    from evalkit.publish.board_reading import absolute_count, relative_ids

    for ids in (absolute + relative, relative + absolute):
        assert absolute_count(ids) == len(absolute)
        assert relative_ids(ids) == ids


def test_the_count_is_read_from_exactly_far_enough_far_side_resamples():
    """The far side's count is read from ``FAR_ENOUGH`` resamples on (the switch sits at
    exactly that many), the spread's t tail one resample below it."""
    from evalkit.significance import FAR_ENOUGH

    differences = np.r_[-np.ones(FAR_ENOUGH), np.ones(2000 - FAR_ENOUGH)]
    assert bootstrap_p(1.0, differences, 30)[1] == "far-side count, on t"
    assert bootstrap_p(1.0, differences[1:], 30)[1].startswith("t tail")


def test_a_metric_of_sums_over_seeds_is_the_seeds_mean_of_the_metric_on_each_resample():
    """With seeds, each shared resample's metric of sums is every seed's metric on that
    resample, then their mean (as the observed value is): not the metric of the seeds'
    averaged sums, which differs for a ratio such as mIoU."""
    from evalkit.significance import resample_counts, resampled_metric

    images = 40
    cases = [sums_cases(seed, images)["miou"] for seed in (1, 2)]
    draws = np.random.default_rng(3).integers(0, images, (8, images))
    draws = np.vstack([np.arange(images), draws])  # the first: every image once
    fast = resampled_metric(
        [sums(parts) for parts, _, sums in cases], resample_counts(draws, images)
    )
    slow = [np.mean([statistic(parts[d]) for parts, statistic, _ in cases]) for d in draws]
    assert np.allclose(fast, slow, rtol=1e-12, atol=1e-12)


def test_a_board_of_cells_read_from_other_data_files_is_refused(tmp_path):
    """Cells of one task whose data files differ (another ``data_files`` identity) are not
    ranked together; each data's board has its own fingerprint."""
    from evalkit.errors import EvalkitError

    images = [f"{i}.png" for i in range(30)]
    for b in range(2):
        write_cell(tmp_path, "depth", f"b{b}", {"image": images, "mse": np.arange(30.0) + b})
    rows = tmp_path / "depth.jsonl"
    lines = [json.loads(x) for x in rows.read_text().splitlines()]
    prints = []
    for files in (["aaaa", "aaaa"], ["aaaa", "bbbb"], ["bbbb", "bbbb"]):
        for line, identity in zip(lines, files, strict=True):
            line["data_files"] = {"synthetic": identity}
        rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
        if files[0] != files[1]:
            with pytest.raises(EvalkitError, match="measured with different data_files"):
                leaderboard([tmp_path])
        else:
            prints.append(leaderboard([tmp_path])["tasks"][0]["fingerprint"])
    assert prints[0] != prints[1]


def test_pairs_tied_on_every_task_count_in_holms_family(tmp_path):
    """Three setups tied on every one of seven tasks, a fourth last on each: the tied pairs'
    p is 1 and they stay in Holm's family of six, so the fourth's three pairs (p = 2/2^7
    each) are adjusted ×6, not ×3, and none is significant at 0.05."""
    from evalkit.significance import holm

    images = [f"{i}.png" for i in range(30)]
    for t in range(7):
        for b in range(4):
            values = np.arange(30.0) + (5.0 if b == 3 else 0.0)
            write_cell(tmp_path, f"task{t}", f"b{b}", {"image": images, "mse": values})
    pairs = leaderboard([tmp_path])["across_tasks"]["pairs"]
    raw = [p["p"] for p in pairs]
    assert sorted(raw) == pytest.approx([1 / 64] * 3 + [1.0] * 3)
    assert [p["p_holm"] for p in pairs] == pytest.approx(holm(raw))
    assert not any(p["significant"] for p in pairs)


def test_paired_compare_corrects_every_tested_metric_as_one_family(tmp_path):
    """Two tasks, each with six images NEW gets wrong and BASE right (McNemar's p = 2/2^6):
    Holm over the two tested metrics doubles each p past 0.05, so neither fails the gate;
    each metric corrected alone would fail both."""
    from evalkit.core.gate import compare
    from evalkit.publish.board_pairs import paired_compare
    from evalkit.publish.board_reading import folder_rows

    images = [f"{i}.png" for i in range(30)]
    right = np.ones(30)
    for task in ("imagenet-linear", "imagenet-knn"):  # top-1 of right or wrong: McNemar
        write_cell(tmp_path / "base", task, "b", {"image": images, "top1": right})
        flipped = np.r_[np.zeros(6), np.ones(24)]
        write_cell(tmp_path / "new", task, "b", {"image": images, "top1": flipped})
    base, new = folder_rows([tmp_path / "base"]), folder_rows([tmp_path / "new"])
    judged = paired_compare(compare(base, new, tolerance=0.0), base, new, level=0.05)
    assert [r["p"] for r in judged] == pytest.approx([1 / 32, 1 / 32])
    assert [r["p_holm"] for r in judged] == pytest.approx([1 / 16, 1 / 16])
    assert [r["status"] for r in judged] == ["ok", "ok"]
    assert [r["tolerance_status"] for r in judged] == ["regression", "regression"]


def test_a_leaderboard_resamples_each_boards_images_for_its_overall_order(tmp_path):
    """Three setups one image apart on each of two tasks of 400 images (the same one leads
    both): resampling the tasks alone would call it surely first ([1, 1], P(first) 1); the
    board's own image resamples show that one image decides nothing."""
    rng = np.random.default_rng(8)
    images = [f"{i}.png" for i in range(400)]
    for task in ("imagenet-linear", "zeroshot-imagenet"):  # tasks that test right-or-wrong
        right = rng.uniform(size=400) < 0.6
        wrong = np.flatnonzero(~right)[:2]
        for b in range(3):
            mine = right.copy()
            mine[wrong[: 2 - b]] = True  # b0 two images ahead, b1 one, b2 none
            write_cell(tmp_path, task, f"b{b}", {"image": images, "top1": mine})
    overall = {e["backbone"]: e for e in leaderboard([tmp_path])["overall"]}
    assert overall["b0"]["mean_rank"] == 1.0
    assert overall["b0"]["p_first"] < 0.95 and overall["b0"]["rank_interval"] != [1.0, 1.0]


def test_cells_naming_the_same_images_share_one_list_of_ids(tmp_path):
    """A zoo's boards hold one list of image ids, not one per setup (50,000 ids × 20 setups
    were most of the leaderboard's memory beyond the peer's), and the outputs are unchanged."""
    from benchmarks.bench_leaderboard import write_zoo
    from evalkit.publish.board_pairs import read_outputs
    from evalkit.publish.board_reading import _boards, folder_rows, per_image

    write_zoo(tmp_path / "zoo", backbones=3, images=40)
    for board in _boards(folder_rows([tmp_path / "zoo"])):
        outputs = read_outputs(board)
        ids = [outputs[id(cell)][0] for cell in board.cells]
        assert all(i is ids[0] for i in ids), board.task
        for cell in board.cells:
            alone = per_image(cell)
            assert alone[0] == outputs[id(cell)][0]
            assert all(a.equals(b) for a, b in zip(alone[1], outputs[id(cell)][1], strict=True))


def test_a_board_that_stops_aligning_midway_reads_its_frames_again(tmp_path):
    """The board releases each cell's frames as it aligns them where every pair will be tested
    at once; a cell further on with a NaN image stops the alignment, and each pair is then
    tested on its own from the frames read again: the pairs with that cell say why, the
    others have their p-values."""
    rng = np.random.default_rng(12)
    images = [f"{i}.png" for i in range(80)]
    import pandas as pd

    for b in range(4):
        write_cell(tmp_path, "depth", f"b{b}", {"image": images, "mse": rng.gamma(2.0, 1.0, 80)})
    (outputs,) = (tmp_path / "predictions").glob("*--b3--*.parquet")
    frame = pd.read_parquet(outputs)
    frame.loc[5, "mse"] = np.nan  # the row's mean stays a number: only the image is NaN
    frame.to_parquet(outputs)
    pairs = leaderboard([tmp_path])["tasks"][0]["pairs"]
    with_nan = [p for p in pairs if "b3" in (p["a"], p["b"])]
    assert len(with_nan) == 3 and all("1 NaN images" in str(p.get("why", p)) for p in with_nan)
    assert all(p.get("p") is not None for p in pairs if p not in with_nan)


@pytest.mark.parametrize("kind", ["right or wrong", "seeds averaged", "fractions"])
def test_a_boards_resamples_of_whole_numbers_from_counts_are_the_gathered_means(kind):
    """A board's resampled means of whole numbers (a right-or-wrong ×100) come from one
    product of each resample's counts with every cell's values: the same bits as gathering
    each cell's values and averaging them. Values that are not whole (three seeds averaged
    into thirds, fractions) are gathered as before."""
    import evalkit.publish.board_pairs as board_module
    from evalkit.significance import right_or_wrong

    rng = np.random.default_rng(13)
    seeds = 3 if kind == "seeds averaged" else 1  # thirds of 100: not whole
    scale = 100.0 if kind != "fractions" else 37.3
    cells = {
        key: [scale * (rng.random((997, 1)) < 0.6 + 0.05 * key) for _ in range(seeds)]
        for key in range(5)
    }
    test = right_or_wrong(lambda frame: frame)
    fast = board_module._resampled_cells(cells, test, 997, seed=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(board_module, "whole_numbers", lambda values, count: None)
        gathered = board_module._resampled_cells(cells, test, 997, seed=3)
    assert fast[0] == gathered[0]
    for key in cells:
        assert np.array_equal(fast[1][key], gathered[1][key])
    values = {key: np.mean([p[:, 0] for p in parts], axis=0) for key, parts in cells.items()}
    expected_whole = kind == "right or wrong"
    assert (board_module.whole_numbers(values, 997) is not None) == expected_whole


def test_whole_numbers_are_summed_by_counts_only_below_float64s_exact_range():
    """A resample's sum of whole numbers is exact in float64 while the largest value times
    the images stays below 2^53; beyond it the values are gathered."""
    from evalkit.publish.board_pairs import whole_numbers

    images = 1000
    within = {0: np.full(images, 2.0**40), 1: np.zeros(images)}
    beyond = {0: np.full(images, 2.0**44), 1: np.zeros(images)}
    assert whole_numbers(within, images) is not None
    assert whole_numbers(beyond, images) is None
