"""The fairness evaluation: demographic parity and the post-processed thresholds against
fairlearn on the same inputs, hand-computed hulls, the CelebA release layout (read and refused
in one line), and ``celeba-fairness-*`` end to end on the embedded stand-in."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalkit.cli.errors import declared_tables
from evalkit.errors import EvalkitError
from evalkit.heads.fairness import (
    expected_accuracy,
    fit_parity,
    parity_gap,
    tradeoff_hull,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abc")), min_size=2, max_size=60))
def test_parity_gap_is_fairlearns_demographic_parity_difference(pairs):
    from fairlearn.metrics import demographic_parity_difference

    predicted = np.array([int(p) for p, _ in pairs])
    groups = np.array([g for _, g in pairs])
    expected = demographic_parity_difference(predicted, predicted, sensitive_features=groups)
    assert parity_gap(predicted, groups) == pytest.approx(expected, abs=1e-12)


def test_tradeoff_hull_by_hand():
    """Scores .9 .8 .8 .3 with labels 1 0 1 0: selecting nothing, the top one, the top three
    (a tie is one cut) or all four gives accuracy 2/4, 3/4, 3/4, 2/4; (1/4, 3/4) and (3/4, 3/4)
    are on the hull, the rest of the chord between them is reached at random."""
    hull = tradeoff_hull(np.array([0.9, 0.8, 0.8, 0.3]), np.array([1, 0, 1, 0]))
    assert hull.rates.tolist() == [0.0, 0.25, 0.75, 1.0]
    assert hull.accuracy.tolist() == [0.5, 0.75, 0.75, 0.5]
    assert hull.thresholds.tolist()[1:] == [0.9, 0.8, 0.3]
    probability = hull.positive_probability(np.array([0.9, 0.8, 0.3]), 0.5)
    assert probability.tolist() == [1.0, 0.5, 0.0]  # half-way between the top one and three
    assert expected_accuracy([1.0, 0.5, 0.5, 0.0], [1, 0, 1, 0])["all"] == 0.75


class Passthrough:
    """A fitted scikit-learn classifier whose P(positive) is the one feature: fairlearn
    post-processes exactly the scores evalkit does."""

    def __new__(cls):
        from sklearn.base import BaseEstimator, ClassifierMixin

        class Scores(ClassifierMixin, BaseEstimator):
            fitted_ = True
            classes_ = np.array([0, 1])

            def fit(self, x, y):
                return self

            def predict_proba(self, x):
                return np.c_[1 - np.asarray(x)[:, 0], np.asarray(x)[:, 0]]

            def predict(self, x):
                return (np.asarray(x)[:, 0] > 0.5).astype(int)

        return Scores()


def scored_groups(seed: int, n: int = 400):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, 2, n)
    labels = (rng.random(n) < np.where(groups == 1, 0.7, 0.3)).astype(int)
    scores = np.clip(0.5 * labels + 0.3 * groups + rng.normal(0, 0.3, n), 0, 1).round(2)
    return scores, labels, groups


def fairlearns_thresholds(scores, labels, groups, level: float):
    """fairlearn's ThresholdOptimizer fitted to demographic parity at ``level`` on the
    scores (passed through as the estimator's probabilities)."""
    from fairlearn.postprocessing import ThresholdOptimizer

    theirs = ThresholdOptimizer(
        estimator=Passthrough(),
        constraints="demographic_parity",
        objective="accuracy_score",
        prefit=True,
        predict_method="predict_proba",
        tol=level or None,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.fit(scores[:, None], labels, sensitive_features=groups)
    return theirs


@pytest.mark.parametrize("level", [0.0, 0.02, 0.1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parity_thresholds_are_fairlearns_threshold_optimizer(seed, level):
    """The same scores, labels and subgroups: the same optimum (accuracy, to rounding) and the
    same probability of a positive prediction for every image."""
    scores, labels, groups = scored_groups(seed)
    theirs = fairlearns_thresholds(scores, labels, groups, level)
    their_positive = theirs._pmf_predict(scores[:, None], sensitive_features=groups)[:, 1]
    rule = fit_parity(scores, labels, groups, level)
    ours = rule.positive_probability(scores, groups)
    assert rule.objective == pytest.approx(theirs._y_best, abs=1e-12)
    assert np.abs(ours - their_positive).max() < 1e-9
    assert parity_gap(ours, groups) <= level + 1e-9
    unconstrained = expected_accuracy((scores > 0.5).astype(float), labels)["all"]
    assert expected_accuracy(ours, labels)["all"] <= max(unconstrained, rule.objective) + 1e-12


@pytest.mark.parametrize("level", [0.0, 0.05])
def test_on_unseen_scores_thresholds_sit_where_fairlearn_puts_them(level):
    """Scores that fall between two fitted ones (test images) are selected as fairlearn's
    ThresholdOptimizer selects them: the same probability for every unseen image."""
    scores, labels, groups = scored_groups(4)
    theirs = fairlearns_thresholds(scores, labels, groups, level)
    rule = fit_parity(scores, labels, groups, level)
    for offset in (0.003, 0.007):  # between two fitted scores (0.01 apart), either side of mid
        unseen = np.clip(scores + offset, 0, 1)
        their_positive = theirs._pmf_predict(unseen[:, None], sensitive_features=groups)[:, 1]
        ours = rule.positive_probability(unseen, groups)
        assert np.abs(ours - their_positive).max() < 1e-9, offset


def test_a_looser_level_never_loses_accuracy():
    scores, labels, groups = scored_groups(3)
    objectives = [fit_parity(scores, labels, groups, lv).objective for lv in (0, 0.05, 0.2, 1)]
    assert objectives == sorted(objectives)
    own_best = sum(  # ε = 1 is no constraint: each subgroup at its own best threshold
        (groups == g).mean()
        * max(
            expected_accuracy((scores[groups == g] >= t).astype(float), labels[groups == g])["all"]
            for t in np.unique(scores)
        )
        for g in (0, 1)
    )
    assert objectives[-1] == pytest.approx(own_best, abs=1e-3)  # to the grid's step


def test_a_subgroup_with_one_label_is_refused():
    with pytest.raises(ValueError, match="subgroup 1 has one label only"):
        fit_parity(np.array([0.1, 0.9, 0.5]), np.array([0, 1, 1]), np.array([0, 0, 1]), 0.0)


# --- CelebA's release layout -------------------------------------------------------------


def write_release(root: Path, rows=None, partitions=None, count=None) -> Path:
    """A four-image CelebA release: the two list files and the aligned images."""
    from PIL import Image

    from evalkit.data.celeba import ATTRIBUTE_NAMES

    root.mkdir(parents=True, exist_ok=True)
    (root / "img_align_celeba").mkdir(exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(1, 5)]
    for name in names:
        Image.new("RGB", (178, 218), (90, 120, 150)).save(root / "img_align_celeba" / name)
    values = lambda male, smiling: " ".join(  # noqa: E731
        {"Male": male, "Smiling": smiling}.get(a, "-1").rjust(2) for a in ATTRIBUTE_NAMES
    )
    rows = rows or [
        f"{names[0]} {values('1', '1')}",
        f"{names[1]} {values('-1', '1')}",
        f"{names[2]} {values('1', '-1')}",
        f"{names[3]} {values('-1', '-1')}",
    ]
    header = [str(count if count is not None else len(rows)), " ".join(ATTRIBUTE_NAMES)]
    (root / "list_attr_celeba.txt").write_text("\n".join(header + rows) + "\n")
    partitions = partitions or [f"{n} {p}" for n, p in zip(names, (0, 0, 1, 2), strict=True)]
    (root / "list_eval_partition.txt").write_text("\n".join(partitions) + "\n")
    return root


def test_celeba_release_layout_is_read(tmp_path):
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset

    write_release(tmp_path / "celeba")
    config = DataConfig(source="folder", root=tmp_path)
    train = open_dataset("celeba", "train", config, target="Smiling", group="Male")
    assert train.images == ["000001.jpg", "000002.jpg"]
    assert train.targets.tolist() == [1, 1] and train.groups.tolist() == [1, 0]
    test = open_dataset("celeba", "test", config)
    assert len(test) == 1 and test.targets.tolist() == [0] and test[0][0].size == (178, 218)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"count": 7}, r"line 1 says 7 images but 4 are listed"),
        ({"rows": ["000001.jpg 1 -1"]}, r"list_attr_celeba.txt:3: expected '<image>' and 40"),
        (
            {"partitions": ["000001.jpg 3"]},
            r"list_eval_partition.txt:1: expected '<image> 0\|1\|2'",
        ),
        ({"partitions": ["000001.jpg 0"]}, r"lists no partition for 000002.jpg \(3 images\)"),
    ],
)
def test_a_malformed_celeba_release_is_refused_in_one_line(tmp_path, damage, message):
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset

    write_release(tmp_path / "celeba", **damage)
    with pytest.raises(EvalkitError, match=message) as caught:
        open_dataset("celeba", "train", DataConfig(source="folder", root=tmp_path))
    assert "\n" not in str(caught.value)


def test_an_unknown_attribute_or_split_is_refused(tmp_path):
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset

    write_release(tmp_path / "celeba")
    config = DataConfig(source="folder", root=tmp_path)
    with pytest.raises(EvalkitError, match="no attribute 'Smile'.*Smiling"):
        open_dataset("celeba", "train", config, target="Smile")
    with pytest.raises(EvalkitError, match="no split 'val': choose train, valid, test"):
        open_dataset("celeba", "val", config)
    (tmp_path / "celeba" / "list_attr_celeba.txt").unlink()
    with pytest.raises(EvalkitError, match="missing .*list_attr_celeba.txt"):
        open_dataset("celeba", "train", config)


def test_the_stand_in_plants_a_known_correlation(ctx):
    from evalkit.data.resolve import open_dataset

    train = open_dataset("celeba", "train", ctx.data, target="Smiling", group="Male")
    smiling_male = train.targets[train.groups == 1].mean()
    smiling_female = train.targets[train.groups == 0].mean()
    assert smiling_male > 0.55 > 0.45 > smiling_female  # planted 0.7 against 0.3
    assert len(train) == 320


# --- the task end to end -------------------------------------------------------------------


def test_celeba_fairness_meets_each_level_where_it_was_fitted(ctx, tmp_path, monkeypatch):
    import pandas as pd

    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task
    from evalkit.heads import fairness

    fitted = []
    original = fairness.ParityRule.positive_probability

    def watched(rule, scores, groups):
        fitted.append((rule, scores, groups))
        return original(rule, scores, groups)

    monkeypatch.setattr(fairness.ParityRule, "positive_probability", watched)
    ctx.artifacts = tmp_path / "pictures"
    ctx.predictions = tmp_path / "predictions.parquet"
    task = resolve_task("celeba-fairness-smiling", ["levels=0,0.05,0.2", "debiaser=labelled"])
    rows = {m.metric: m for m in task.run(load_backbone("fake"), ctx)}
    assert set(rows) == set(task.metrics())
    assert rows["parity_gap"].value > 0.3  # the planted correlation, learnt
    assert rows["parity_gap@0"].value < rows["parity_gap"].value / 3
    for level in (0.0, 0.05, 0.2):
        rates = rows[f"accuracy@{level:g}"].extra["selection_rates_by_level"][f"{level:g}"]
        assert max(rates.values()) - min(rates.values()) <= level + 1e-9  # met on valid
    assert Path(rows["accuracy"].extra["picture"]).stat().st_size > 0
    assert rows["accuracy/female"].n == 160 and len(fitted) == 3
    saved = pd.read_parquet(ctx.predictions)  # the rows are the means of the per-image outputs
    for metric in ("accuracy", "accuracy@0", "accuracy@0.2"):
        assert saved[metric].mean() == pytest.approx(rows[metric].value, abs=1e-12)
    from fairlearn.metrics import MetricFrame

    for metric in ("accuracy", "accuracy@0", "accuracy@0.2"):  # each point with its interval
        row = rows[metric]
        assert row.stderr == pytest.approx(saved[metric].std(ddof=1) / len(saved) ** 0.5)
        low, high = row.extra["interval95"]
        assert low < row.value < high
    for metric in ("accuracy@0.2",):  # fairlearn's bootstrap takes 10 s a point
        row = rows[metric]
        frame = MetricFrame(
            metrics=lambda truth, right: float(np.mean(right)),
            y_true=saved["target"],
            y_pred=saved[metric],
            sensitive_features=saved["group"],
            n_boot=1000,
            ci_quantiles=[0.025, 0.975],
            random_state=0,
        )
        theirs = [float(v) for v in frame.overall_ci]
        assert row.extra["interval95"] == pytest.approx(theirs, abs=0.012)  # Monte Carlo
    tables = dict(
        declared_tables("celeba-fairness-smiling")(saved, 3)
    )  # evalkit errors reads these outputs too
    worst = tables["images of lowest expected accuracy"]
    assert list(worst["accuracy"]) == sorted(saved["accuracy"])[:3]
    assert len(tables["subgroups of lowest expected accuracy"]) == 3


def test_fairness_numbers_do_not_depend_on_the_thread_count(ctx):
    import torch

    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    task, backbone = resolve_task("celeba-fairness-attractive"), load_backbone("fake")
    before = torch.get_num_threads()
    try:
        values = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            values.append({m.metric: m.value for m in task.run(backbone, ctx)})
    finally:
        torch.set_num_threads(before)
    assert values[0] == values[1]


def test_fine_tuning_is_not_a_fairness_protocol():
    """The fairness task has no fine-tuning setting to refuse: it inherits only what it
    honours, so every one of them is an unknown setting, and its listing shows none."""
    import dataclasses

    from evalkit.core.runner import resolve_task
    from evalkit.protocols.finetuning import FinetuneSettings

    task = resolve_task("celeba-fairness-attractive")
    names = {f.name for f in dataclasses.fields(task)}
    tuning = {f.name for f in dataclasses.fields(FinetuneSettings)} | {"finetune_resolution"}
    assert not names & tuning
    for name in sorted(tuning):
        with pytest.raises(EvalkitError, match=f"has no setting '{name}'"):
            resolve_task("celeba-fairness-attractive", [f"{name}=1"])


def test_the_leaderboard_draws_one_curve_per_backbone(cli_env, capsys):
    from evalkit.cli import main
    from evalkit.publish.leaderboard import leaderboard

    out = cli_env / "zoo"
    for backbone in ("fake", "vit22b/test"):
        args = ["run", "--task", "celeba-fairness-smiling", "--backbone", backbone]
        args += ["--data", "embedded", "--set", "levels=0,0.1", "--save-predictions"]
        assert main([*args, "--out", str(out)]) == 0
    curves = leaderboard([out])["curves"]
    ((task, lines),) = curves.items()
    assert task.startswith("celeba-fairness-smiling")
    assert set(lines) == {"fake (random init)", "vit22b/test (random init)"}
    assert all(list(by) == [0.0, 0.1] for by in lines.values())
    page = cli_env / "board.html"
    assert main(["leaderboard", str(out), "--format", "html", "--output", str(page)]) == 0
    assert page.read_text().count("<polyline") == 2
    assert page.read_text().count("<line") == 4  # each point's interval over test images
    pair = leaderboard([out])["tasks"][0]["pairs"][0]  # per-image outputs: a paired test
    assert "bootstrap" in pair["test"] and pair["p_holm"] is not None
    capsys.readouterr()
    assert main(["leaderboard", str(out), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    (line,) = [x for x in text.splitlines() if x.startswith("| fake (random init) | 0.")]
    assert line.count(" [0.") == 2  # both levels: value [low, high]


def authors_rto(scores, groups, level, gamma, seed=0):
    """The randomized threshold optimizer as its authors' code solves it (projected SGD on
    the dual, then full gradient descent), written here apart from evalkit: per subgroup,
    thresholds t = λ − μ on scores rescaled to [-1, 1]."""
    rng = np.random.default_rng(seed)
    y, rho, eps0 = 2 * scores - 1, scores.mean(), level / 2
    thresholds = {}
    for group in np.unique(groups):
        mine = y[groups == group]

        def gradient(batch, lam, mu):
            mean = np.mean(np.clip((batch - (lam - mu)) / gamma, 0, 1))
            return eps0 + rho - mean, eps0 - rho + mean

        def step(lam, mu, alpha, batch):
            g_lam, g_mu = gradient(batch, lam, mu)
            if eps0 > 1e-3:
                return max(0.0, lam - alpha * g_lam), max(0.0, mu - alpha * g_mu)
            return lam - alpha * g_lam, mu

        steps, size = 4000, 256
        alpha = gamma * np.sqrt(1.0 / (steps * size)) * size
        lam = mu = lam_avg = mu_avg = 0.0
        for _ in range(steps):
            lam, mu = step(lam, mu, alpha, mine[rng.integers(0, len(mine), size)])
            lam_avg, mu_avg = lam_avg + lam / steps, mu_avg + mu / steps
        lam, mu = lam_avg, mu_avg
        for _ in range(1000):
            lam, mu = step(lam, mu, 0.5, mine)
        thresholds[int(group)] = lam - mu
    return thresholds


@pytest.mark.parametrize("level", [0.0, 0.02, 0.1])
def test_rto_is_the_authors_algorithm_on_the_same_scores(level):
    from evalkit.heads.debias import fit_rto

    rng = np.random.default_rng(11)
    groups = rng.integers(0, 2, 3000)
    targets = (rng.uniform(size=3000) < np.where(groups == 1, 0.7, 0.3)).astype(int)
    scores = 1 / (1 + np.exp(-(2.0 * targets - 1 + rng.normal(0, 1.2, 3000) + 0.6 * groups)))
    gamma = 0.05
    ours = fit_rto(scores, groups, level, gamma)
    theirs = authors_rto(scores, groups, level, gamma)
    rescaled = 2 * scores - 1
    for group, threshold in theirs.items():
        mine = rescaled[groups == group]
        their_rate = np.clip((mine - threshold) / gamma, 0, 1).mean()
        assert ours.rates[group] == pytest.approx(their_rate, abs=0.01)  # selection rates
    spread = max(ours.rates.values()) - min(ours.rates.values())
    assert spread <= level + 1e-9 and all(
        abs(rate - scores.mean()) <= level / 2 + 1e-9 for rate in ours.rates.values()
    )  # the band, anchored at the mean score
    positive = ours.positive_probability(scores, groups)
    shift = np.array([theirs[int(g)] for g in groups])
    their_positive = np.clip((rescaled - shift) / gamma, 0, 1)
    accuracy = lambda p: float(np.mean(np.where(targets == 1, p, 1 - p)))  # noqa: E731
    assert accuracy(positive) == pytest.approx(accuracy(their_positive), abs=0.01)


def test_rto_needs_no_labels_and_leaves_scores_inside_the_band_alone():
    from evalkit.heads.debias import fit_rto

    scores = np.array([0.9, 0.2, 0.8, 0.3])
    groups = np.array([0, 0, 1, 1])
    rule = fit_rto(scores, groups, 1.0, 0.05)  # any rates are within a level of 1
    assert rule.thresholds == {0: 0.0, 1: 0.0}
    assert list(rule.positive_probability(scores, groups)) == [1.0, 0.0, 1.0, 0.0]


def test_rto_reaches_a_rate_only_a_threshold_below_minus_one_gives():
    """A subgroup whose every score is 0 (rescaled −1) is selected only by a threshold below
    −1: h = clip((−1 − t)/γ), so its rate r needs t = −1 − r·γ. The bisection's lower end is
    −1 − γ (everyone selected), so the subgroup still meets the band's edge."""
    from evalkit.heads.debias import fit_rto

    scores = np.r_[np.zeros(50), np.ones(50)]
    groups = np.r_[np.zeros(50, int), np.ones(50, int)]
    gamma = 0.2
    rule = fit_rto(scores, groups, 0.1, gamma)  # the band: 0.5 ± 0.05
    assert rule.rates[0] == pytest.approx(0.45, abs=1e-6)
    assert rule.thresholds[0] == pytest.approx(-1.0 - 0.45 * gamma, abs=1e-6)
    assert rule.rates[1] == pytest.approx(0.55, abs=1e-6)


def test_the_fairness_task_debiases_with_rto_by_default(ctx, tmp_path):
    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task

    task = resolve_task("celeba-fairness-smiling", ["levels=0,0.1"])
    assert task.debiaser == "rto"
    ctx.artifacts = tmp_path
    rows = {m.metric: m for m in task.run(load_backbone("fake"), ctx)}
    assert rows["accuracy@0"].extra["debiaser"].startswith("randomized threshold optimizer")
    for level in (0.0, 0.1):
        rates = rows[f"accuracy@{level:g}"].extra["selection_rates_by_level"][f"{level:g}"]
        assert max(rates.values()) - min(rates.values()) <= level + 1e-9
    assert rows["parity_gap@0"].value < rows["parity_gap"].value / 3
