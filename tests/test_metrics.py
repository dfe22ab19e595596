import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from evalkit.heads.linear import Standardizer, fit_logistic, logistic_path, ridge_fewshot_accuracy
from evalkit.heads.logistic import loss_and_grad
from evalkit.metrics import confusion_matrix, topk_accuracy
from evalkit.protocols.calibration import expected_calibration_error

BIG_VISION_BIAS = 100.0  # big_vision's few-shot probe appends this constant feature


def test_topk_accuracy_hand_computed():
    logits = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    labels = torch.tensor([1, 1, 0, 2])
    # top-1 hits: row 0 only -> 25%; top-2 hits: rows 0, 1 -> 50%; top-3: all.
    assert topk_accuracy(logits, labels, 1) == pytest.approx(25.0)
    assert topk_accuracy(logits, labels, 2) == pytest.approx(50.0)
    assert topk_accuracy(logits, labels, 5) == pytest.approx(100.0)  # k clipped to C


def _blobs(n=600, d=20, c=4, seed=0, spread=1.5):
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(c, d, generator=gen) * spread
    y = torch.randint(0, c, (n,), generator=gen)
    return means[y] + torch.randn(n, d, generator=gen), y


def test_logistic_matches_sklearn():
    from sklearn.linear_model import LogisticRegression

    x, y = _blobs()
    x = x.double()
    l2 = 1e-2
    ours = fit_logistic(x, y, num_classes=4, l2=l2, max_iter=500, tol=1e-9)
    # sklearn minimises C·Σ loss + ½|W|²: the same optimum when C = 1 / (l2 · n).
    ref = LogisticRegression(C=1 / (l2 * len(y)), tol=1e-10, max_iter=5000).fit(
        x.numpy(), y.numpy()
    )
    ours_p = torch.softmax(ours.logits(x), 1).numpy()
    np.testing.assert_allclose(ours_p, ref.predict_proba(x.numpy()), atol=2e-4)


def test_logistic_path_is_strongest_first_and_converges_like_cold_start():
    x, y = _blobs(seed=1)
    path = logistic_path(x.double(), y, num_classes=4, l2_values=[1e-3, 1e-1, 1e-2], max_iter=300)
    assert [l2 for l2, _ in path] == [1e-1, 1e-2, 1e-3]
    cold = fit_logistic(x.double(), y, num_classes=4, l2=1e-3, max_iter=300)
    # Warm-started and cold fits reach the same objective (to the solver's tolerance).
    warm_loss = loss_and_grad(path[-1][1], x.double(), y, 1e-3).item()
    cold_loss = loss_and_grad(cold, x.double(), y, 1e-3).item()
    assert warm_loss == pytest.approx(cold_loss, abs=1e-4)


def test_fits_say_whether_they_converged():
    x, y = _blobs(seed=4)
    capped = fit_logistic(x.double(), y, num_classes=4, l2=1e-4, max_iter=3)
    assert capped.fit.iterations <= 3 and not capped.fit.converged  # stopped by a cap
    full = fit_logistic(x.double(), y, num_classes=4, l2=1e-2, max_iter=500, tol=1e-7)
    assert full.fit.converged and full.fit.iterations < 500 and full.fit.grad_max < 1e-5


def test_linear_probe_rows_record_every_fit(fake, ctx, tmp_path):
    from evalkit import get_task
    from evalkit.core.runner import run_task

    task = get_task("imagenet-linear", ["max_iter=2", "l2_grid=1e-2,1e-4"])
    [row, _], _ = run_task(task, fake, ctx, out_dir=tmp_path)
    fits = row["extra"]["path_fit_by_l2"]
    assert set(fits) == {"0.01", "0.0001"}
    assert all(f["iterations"] <= 2 and not f["converged"] for f in fits.values())
    assert row["extra"]["refit"]["converged"]  # the chosen L2 is refitted to convergence


def test_ridge_fewshot_matches_numpy_closed_form():
    x, y = _blobs(n=40, d=8, c=4, seed=2, spread=0.8)
    xt, yt = _blobs(n=200, d=8, c=4, seed=3, spread=0.8)
    l2 = 3.0
    mean, std = x.double().mean(0).numpy(), x.double().std(0, unbiased=False).numpy() + 1e-5

    def design(a):
        return np.hstack([(a.double().numpy() - mean) / std, np.full((len(a), 1), BIG_VISION_BIAS)])

    targets = 2 * np.eye(4)[y.numpy()] - 1
    a = design(x)
    w = np.linalg.solve(a.T @ a + l2 * np.eye(a.shape[1]), a.T @ targets)
    expected = ((design(xt) @ w).argmax(1) == yt.numpy()).mean()
    assert ridge_fewshot_accuracy(x, y, xt, yt, num_classes=4, l2=l2) == pytest.approx(expected)


def test_ridge_dual_branch_equals_primal():
    # n < d takes the dual (n×n) system; it must give the same predictions as the primal.
    x, y = _blobs(n=12, d=30, c=3, seed=4)
    xt, yt = _blobs(n=100, d=30, c=3, seed=4)
    dual = ridge_fewshot_accuracy(x, y, xt, yt, num_classes=3, l2=5.0)
    mean, std = x.double().mean(0), x.double().std(0, unbiased=False) + 1e-5
    a = torch.nn.functional.pad((x.double() - mean) / std, (0, 1), value=BIG_VISION_BIAS)
    t = 2.0 * torch.nn.functional.one_hot(y, 3).double() - 1
    w = torch.linalg.solve(a.T @ a + 5.0 * torch.eye(a.shape[1], dtype=a.dtype), a.T @ t)
    at = torch.nn.functional.pad((xt.double() - mean) / std, (0, 1), value=BIG_VISION_BIAS)
    assert dual == pytest.approx(((at @ w).argmax(1) == yt).double().mean().item())


def test_standardizer_zero_mean_unit_std():
    x, _ = _blobs()
    z = Standardizer.fit(x)(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(x.shape[1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(x.shape[1]), atol=1e-3, rtol=0)


# --- calibration ---------------------------------------------------------------------------

CALIBRATION_PROBS = torch.tensor(
    [[0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [1.0, 0.0, 0.0], [0.4, 0.35, 0.25]], dtype=torch.float64
)
CALIBRATION_LABELS = torch.tensor([1, 1, 0, 0])


def test_ece_by_hand_with_a_confidence_of_one_and_empty_bins():
    from evalkit.protocols.calibration import expected_calibration_error, reliability

    # confidences 0.7 (right), 0.6 (wrong), 1.0 (right), 0.4 (right): one per bin
    ece = expected_calibration_error(CALIBRATION_PROBS, CALIBRATION_LABELS)
    assert ece == pytest.approx((0.3 + 0.6 + 0.0 + 0.6) / 4)
    bins = reliability(CALIBRATION_PROBS, CALIBRATION_LABELS)
    assert bins.counts[14] == 1 and bins.accuracy[14] == 1.0  # 1.0 lands in the last bin
    assert sum(bins.counts) == 4 and bins.counts.count(0) == 11
    assert all(math.isnan(a) for a, n in zip(bins.accuracy, bins.counts, strict=True) if n == 0)


def test_ece_bins_are_closed_on_the_right():
    """A confidence on an edge belongs to the bin it closes: (0.2, 0.4] holds 0.4, not 0.2."""
    from evalkit.protocols.calibration import reliability

    # 0.4 and 0.6 are edges of 5 bins (and 0.6 · 5 rounds up to 3.0000000000000004)
    probs = torch.tensor([[0.4, 0.3, 0.3], [0.6, 0.2, 0.2]], dtype=torch.float64)
    bins = reliability(probs, torch.tensor([0, 1]), bins=5)
    assert bins.counts == [0, 1, 1, 0, 0]  # 0.4 → (0.2, 0.4], 0.6 → (0.4, 0.6]
    assert bins.edges == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert bins.accuracy[1] == 1.0 and bins.accuracy[2] == 0.0


def test_equal_mass_ece_by_hand():
    from evalkit.protocols.calibration import expected_calibration_error

    # 2 bins of 2: {0.4 right, 0.6 wrong} → |0.5 − 0.5|; {0.7, 1.0 both right} → |1 − 0.85|
    ece = expected_calibration_error(CALIBRATION_PROBS, CALIBRATION_LABELS, bins=2, scheme="mass")
    assert ece == pytest.approx(0.5 * 0.0 + 0.5 * 0.15)


def test_brier_and_nll_by_hand():
    from evalkit.protocols.calibration import brier_score, negative_log_likelihood

    assert brier_score(CALIBRATION_PROBS, CALIBRATION_LABELS) == pytest.approx(
        (0.14 + 0.86 + 0.0 + 0.545) / 4
    )
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    nll = negative_log_likelihood(logits, torch.tensor([1, 0]))
    assert nll == pytest.approx((-math.log(0.75) - math.log(0.5)) / 2)


def test_fitted_temperature_minimises_the_nll():
    from evalkit.protocols.calibration import fit_temperature, negative_log_likelihood

    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(4000, 5, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits / 2.0, dim=1), 1, generator=generator)[:, 0]
    fitted = fit_temperature(logits, labels)
    grid = torch.linspace(1.0, 3.0, 401)
    best = min(grid.tolist(), key=lambda t: negative_log_likelihood(logits / t, labels))
    assert fitted == pytest.approx(best, abs=0.01)
    assert fitted == pytest.approx(2.0, abs=0.15)  # the temperature the labels were drawn at


def reference_ece(confidences: list[float], correct: list[bool], bins: int) -> float:
    """ECE by its definition, one item at a time, bins found with exact fractions: an item
    belongs to the first bin whose upper edge b/bins is at least its confidence."""
    from fractions import Fraction

    members: dict[int, list[int]] = {}
    for i, c in enumerate(confidences):
        b = next(b for b in range(1, bins + 1) if Fraction(c) <= Fraction(b, bins))
        members.setdefault(b, []).append(i)
    total = 0.0
    for items in members.values():
        accuracy = sum(correct[i] for i in items) / len(items)
        confidence = sum(confidences[i] for i in items) / len(items)
        total += len(items) / len(confidences) * abs(accuracy - confidence)
    return total


@given(
    st.lists(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3), min_size=1, max_size=60),
    st.lists(st.integers(0, 2), min_size=60, max_size=60),
    st.sampled_from([2, 5, 15]),
)
def test_ece_equals_its_definition_item_by_item(rows, labels, bins):
    from evalkit.protocols.calibration import expected_calibration_error

    probs = torch.tensor(rows, dtype=torch.float64) + 1e-9
    probs = probs / probs.sum(dim=1, keepdim=True)
    labels = torch.tensor(labels[: len(rows)])
    confidence, predicted = probs.max(dim=1)
    expected = reference_ece(confidence.tolist(), (predicted == labels).tolist(), bins)
    assert expected_calibration_error(probs, labels, bins) == pytest.approx(expected, abs=1e-12)


def test_ece_averages_the_items_that_share_a_bin():
    from evalkit.protocols.calibration import expected_calibration_error

    # 0.74 right and 0.78 wrong share (0.7333, 0.8]: accuracy 0.5, confidence 0.76
    probs = torch.tensor([[0.74, 0.26], [0.78, 0.22], [0.95, 0.05]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 0])
    expected = 2 / 3 * abs(0.5 - 0.76) + 1 / 3 * abs(1.0 - 0.95)
    assert expected_calibration_error(probs, labels) == pytest.approx(expected)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_ece_is_zero_for_a_perfectly_calibrated_sample(repeats):
    from evalkit.protocols.calibration import expected_calibration_error

    rows, labels = [], []
    for right, copies in zip(range(5, 11), repeats, strict=False):  # confidence right / 10
        for _ in range(copies):
            rows += [[right / 10, 1 - right / 10]] * 10
            labels += [0] * right + [1] * (10 - right)
    probs = torch.tensor(rows, dtype=torch.float64)
    assert expected_calibration_error(probs, torch.tensor(labels)) == pytest.approx(0.0, abs=1e-12)


def test_choose_l2_takes_the_strongest_within_one_hold_out_image():
    from evalkit.protocols.classification import choose_l2

    path = [(1.0, "a"), (0.1, "b"), (0.01, "c")]  # strongest first, as the path is fitted
    assert choose_l2(path, {1.0: 10, 0.1: 12, 0.01: 11}) == (0.1, "b")  # two images behind
    assert choose_l2(path, {1.0: 11, 0.1: 12, 0.01: 12}) == (1.0, "a")  # one image behind
    assert choose_l2(path, {1.0: 5, 0.1: 5, 0.01: 5}) == (1.0, "a")
    assert choose_l2(path, {1.0: 3, 0.1: 5, 0.01: 6}) == (0.1, "b")


def test_every_probe_fit_is_pinned_to_its_optimum():
    """Float64 fits run to the gradient tolerance, the path's too, and say so."""
    from evalkit.heads.linear import logistic_path
    from evalkit.heads.logistic import TOL

    x, y = _blobs(n=300, d=20, c=4, seed=2)
    path = logistic_path(Standardizer.fit(x)(x), y, num_classes=4, l2_values=(1e-1, 1e-3, 1e-5))
    for _, model in path:
        assert model.weight.dtype == torch.float64
        assert model.fit.converged and model.fit.grad_max <= TOL


def _exact_grad_max(model, x, y, l2: float) -> float:
    """The objective's largest gradient entry, recomputed in fp64 from scratch."""
    from evalkit.heads.logistic import LinearModel

    exact = LinearModel(model.weight.clone(), model.bias.clone())
    loss_and_grad(exact, x.double(), y, l2)
    return max(exact.weight.grad.abs().max().item(), exact.bias.grad.abs().max().item())


@pytest.mark.parametrize("bf16_passes", [True, False])
def test_bf16_difference_passes_reach_the_fp32_optimum(monkeypatch, bf16_passes):
    """fp32 rows where bf16 is fast (forced here, on any CPU) fit with bf16 products of the
    differences since the last exact point; the path ends at the optimum the fp32 passes
    reach, judged on gradients recomputed in fp64, and says how many bf16 passes it made."""
    from evalkit import device
    from evalkit.heads import linear

    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: True)
    monkeypatch.setattr(linear, "LOW_PRECISION_PASSES", bf16_passes)
    x, y = _blobs(n=3000, d=48, c=10, seed=5, spread=0.4)
    x = Standardizer.fit(x)(x)
    l2_values = (1e-2, 1e-3, 1e-4, 1e-5)
    path = logistic_path(x, y, num_classes=10, l2_values=l2_values)
    monkeypatch.setattr(linear, "LOW_PRECISION_PASSES", False)
    reference = logistic_path(x, y, num_classes=10, l2_values=l2_values)
    for (l2, model), (_, fp32) in zip(path, reference, strict=True):
        assert model.fit.converged
        assert (model.fit.low_precision_passes > 0) == bf16_passes
        assert _exact_grad_max(model, x, y, l2) <= 1.01 * min(linear.TOL, 1e-2 * l2)
        # two fits to the same tolerance: the same optimum to within tolerance / l2
        assert (model.weight - fp32.weight).abs().max() < 50 * min(linear.TOL, 1e-2 * l2) / l2
        assert torch.equal(model.logits(x).argmax(1), fp32.logits(x).argmax(1))


@pytest.mark.parametrize("l2", [1e-2, 1e-3, 1e-4])
def test_a_bf16_line_finds_the_fp32_lines_step_at_the_optimum(l2):
    """At a converged fit the loss and penalty parts of the line's slope nearly cancel, far
    below bf16's rounding of the line's logits: a bf16 line must still find the step the fp32
    line finds (a search on the loss part's raw value found none, or a tiny one, and the fit
    crawled)."""
    from evalkit.heads.kept_logits_fit import KeptLogitsFit
    from evalkit.heads.linear import MU_SCALE, Preconditioner
    from evalkit.heads.logistic import FeatureRows, LinearModel

    x, y = _blobs(n=3000, d=48, c=10, seed=5, spread=0.4)
    rows = FeatureRows.of(Standardizer.fit(x)(x), y)
    start = fit_logistic(rows, None, num_classes=10, l2=l2, keep_logits=True)
    forward = Preconditioner.of(rows).maps(MU_SCALE * l2 * 10)[0]
    steps = []
    for bf16 in (True, False):
        model = LinearModel(start.weight.clone(), start.bias.clone())
        fit = KeptLogitsFit(rows, model, l2, forward, low_precision=bf16)
        grad, _ = fit._exact_gradient()
        assert fit._step(grad)  # no curvature pairs yet: along −gradient in both
        steps.append((fit.last_step.norm() / grad.norm()).item())
    assert steps[0] == pytest.approx(steps[1], rel=0.2)


def test_a_paths_fits_start_from_logits_moved_on_as_the_weights_are(monkeypatch):
    """Each fit of a path starts from its logits extrapolated from the last two fits' exact
    end logits, not recomputed: they must be X·W + b at the extrapolated start to fp32's
    rounding, and the path must reach the optima independent fits reach."""
    from evalkit.heads import kept_logits_fit

    x, y = _blobs(n=2500, d=24, c=6, seed=7, spread=0.5)
    x = Standardizer.fit(x)(x)
    starts, original = [], kept_logits_fit.KeptLogitsFit._exact_gradient

    def spy(fit, known=None):
        if known is not None:
            starts.append((known.values.clone(), fit.model.weight.float(), fit.model.bias.float()))
        return original(fit, known)

    monkeypatch.setattr(kept_logits_fit.KeptLogitsFit, "_exact_gradient", spy)
    l2_values = (1e-1, 1e-2, 1e-3, 1e-4)
    path = logistic_path(x, y, num_classes=6, l2_values=l2_values, keep_logits=True)
    assert len(starts) == 3  # the second fit starts from the first's end, the others extrapolate
    for values, weight, bias in starts:
        exact = x @ weight + bias
        assert (values - exact).abs().max() <= 1e-5 * exact.abs().max()
    for l2, model in path:
        alone = fit_logistic(x, y, num_classes=6, l2=l2, keep_logits=True)
        assert (model.weight - alone.weight).abs().max() < 50 * min(1e-6, 1e-2 * l2) / l2


@pytest.mark.parametrize("keep_logits", [True, False])
def test_a_path_reaches_the_same_optima_on_one_and_two_threads(keep_logits):
    """What holds on any kernel: every fit of the path converges, and since the objective is
    λ-strongly convex, two fits that both stop below the gradient tolerance hold weights
    within the tolerance's bound of each other whatever the order of their sums (a BLAS
    chooses that order by thread count and CPU, so it is not promised bitwise); the
    predictions agree."""
    x, y = _blobs(n=2000, d=768, c=10, seed=8, spread=0.3)
    x = Standardizer.fit(x)(x)
    runs, threads = [], torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            path = logistic_path(
                x, y, num_classes=10, l2_values=(1e-1, 1e-2, 1e-3, 1e-4), keep_logits=keep_logits
            )
            runs.append(path)
    finally:
        torch.set_num_threads(threads)
    for (l2, one), (_, two) in zip(*runs, strict=True):
        assert one.fit.converged and two.fit.converged
        bound = 50 * min(1e-6, 1e-2 * l2) / l2
        assert (one.weight - two.weight).abs().max() < bound
        assert torch.equal(one.logits(x).argmax(1), two.logits(x).argmax(1))


def test_row_dots_are_vecdot():
    from evalkit.heads.kept_logits_fit import _row_dots

    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(70, 13, generator=gen), torch.randn(70, 13, generator=gen)
    assert torch.allclose(_row_dots(a, b), torch.linalg.vecdot(a, b), rtol=1e-5, atol=1e-5)


def test_streamed_rows_never_get_a_bf16_copy(monkeypatch):
    """Rows read chunk by chunk (the probe's streamed mode) are not held twice in memory."""
    from evalkit import device
    from evalkit.heads.logistic import FeatureRows

    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: True)
    x, y = _blobs(n=400, d=12, c=3, seed=6)
    chunks = FeatureRows(lambda: [(x[:200], y[:200]), (x[200:], y[200:])], 400, 12)
    model = fit_logistic(chunks, None, num_classes=3, l2=1e-2, keep_logits=True)
    assert model.fit.converged and model.fit.low_precision_passes == 0 and not chunks.copies


def test_resident_rows_fitted_without_kept_logits_get_no_bf16_copy(monkeypatch):
    """The preconditioner takes its moments from the bf16 copies only where the fits use
    them: a path told not to keep logits (torch's L-BFGS, fp32 passes) makes none."""
    from evalkit import device
    from evalkit.heads.logistic import FeatureRows

    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: True)
    x, y = _blobs(n=400, d=12, c=3, seed=6)
    rows = FeatureRows.of(Standardizer.fit(x)(x), y)
    path = logistic_path(rows, None, num_classes=3, l2_values=(1e-2, 1e-3), keep_logits=False)
    assert all(model.fit.converged for _, model in path) and not rows.copies
    kept = logistic_path(rows, None, num_classes=3, l2_values=(1e-2, 1e-3), keep_logits=True)
    assert all(model.fit.low_precision_passes for _, model in kept) and rows.copies


def test_few_shot_bias_feature_escapes_the_regularisation():
    """big_vision's bias feature is a constant 100, so its weight is barely penalised: with a
    huge L2 the feature weights vanish while the bias still fits the class prior, and every
    test image goes to the majority class (a bias feature of 1 would be shrunk like the
    features, and the features would still decide)."""
    from evalkit.heads.linear import ridge_fewshot_accuracy

    gen = torch.Generator().manual_seed(0)
    y = torch.cat([torch.zeros(160, dtype=torch.long), torch.ones(40, dtype=torch.long)])
    x = (2.0 * y - 1).double()[:, None] + 0.1 * torch.randn(200, 1, generator=gen).double()
    yt = torch.tensor([0, 1] * 50)
    xt = (2.0 * yt - 1).double()[:, None]
    assert ridge_fewshot_accuracy(x, y, xt, yt, num_classes=2, l2=1e5) == 0.5
    assert ridge_fewshot_accuracy(x, y, xt, yt, num_classes=2, l2=1e-3) == 1.0


# --- uncertainty over the test items -----------------------------------------------------


def test_accuracy_and_mean_standard_errors_by_hand():
    from evalkit.metrics import accuracy_stderr, mean_stderr

    hits = torch.tensor([True] * 30 + [False] * 70)
    assert accuracy_stderr(hits) == pytest.approx(100 * math.sqrt(0.3 * 0.7 / 100))
    assert mean_stderr([1.0, 2.0, 3.0, 4.0]) == pytest.approx(statistics.stdev([1, 2, 3, 4]) / 2)


def test_bootstrap_statistics_are_the_metrics_themselves():
    """Resampled at the identity, the bootstrap statistics are mIoU and ECE as computed for
    the whole set; identical images have no spread; spread shrinks like 1/√n."""
    from evalkit.metrics import bootstrap_stderr, ece_bootstrap_stderr, miou_bootstrap_stderr

    rng = np.random.default_rng(0)
    pred, target = rng.integers(0, 4, (6, 20, 20)), rng.integers(0, 4, (6, 20, 20))
    confusions = [confusion_matrix(p, t, 4) for p, t in zip(pred, target, strict=True)]
    inter = np.stack([np.diag(c) for c in confusions])
    union = np.stack([c.sum(0) + c.sum(1) - np.diag(c) for c in confusions])
    same = np.repeat(inter[:1], 6, 0), np.repeat(union[:1], 6, 0)
    assert miou_bootstrap_stderr(*same) == pytest.approx(0.0, abs=1e-9)
    assert miou_bootstrap_stderr(inter, union) > 0
    probs = torch.softmax(torch.randn(400, 5, generator=torch.Generator().manual_seed(0)) * 2, 1)
    labels = torch.randint(0, 5, (400,), generator=torch.Generator().manual_seed(1))
    assert 0 < ece_bootstrap_stderr(probs, labels) < expected_calibration_error(probs, labels)
    values = np.random.default_rng(1).normal(size=4000)
    small = bootstrap_stderr(lambda rows: values[:1000][rows].mean(), 1000)
    large = bootstrap_stderr(lambda rows: values[rows].mean(), 4000)
    assert small / large == pytest.approx(2.0, rel=0.25)
    assert small == pytest.approx(values[:1000].std() / math.sqrt(1000), rel=0.2)
