"""Every effect-table judge, with values on each side of its threshold and inside its noise
band: a scaling row agrees or disagrees only when its 95% interval leaves out zero; row 8's
paper effect is negative and its judge can say no; the seeds' spread widens the interval."""

from __future__ import annotations

import math

import pytest

from evalkit.reproduction.reproduce import over_seeds
from evalkit.reproduction.rows import LARGE, SMALL, rows

JUDGES = {r.number: r.judge for r in rows()}


def pair(metric: str, small: float, large: float, stderr: float | None = 1.0) -> dict:
    noise = {} if stderr is None else {f"{metric}/stderr": stderr}
    return {SMALL: {metric: small, **noise}, LARGE: {metric: large, **noise}}


def test_row_1_needs_the_logits_ten_times_larger_without_qk_norm():
    def values(without, with_qk):
        return {
            "ablation": {
                "max_attention_logit/no_qk_norm/lr=0.001": 5.0,
                "max_attention_logit/qk_norm/lr=0.001": 5.0,
                "max_attention_logit/no_qk_norm/lr=0.3": without,
                "max_attention_logit/qk_norm/lr=0.3": with_qk,
            }
        }

    assert JUDGES[1](values(1000.0, 100.0)).agrees is True  # exactly 10×: at the threshold
    assert JUDGES[1](values(990.0, 100.0)).agrees is False
    assert JUDGES[1](values(5.0, 0.0)).effect == math.inf


def test_row_2_holds_when_no_size_trains_better_with_a_lowered_lr():
    assert JUDGES[2]({"ablation": {"gain/test": 0.0, "gain/ti": 0.02}}).agrees is True
    outcome = JUDGES[2]({"ablation": {"gain/test": 0.01, "gain/ti": -0.001}})
    assert outcome.agrees is False and outcome.effect == -0.001


@pytest.mark.parametrize("row", [3, 4])
def test_efficiency_rows_judge_beyond_two_standard_errors(row):
    first, second = ("without", "with") if row == 3 else ("parallel", "sequential")

    def verdict(speedup, stderr):
        values = {
            "ablation": {
                f"final_loss/{first}": 1.5,
                f"final_loss/{second}": 1.5,
                "speedup": speedup,
                "speedup/stderr": stderr,
            }
        }
        return JUDGES[row](values)

    assert verdict(1.10, 0.02).agrees is True
    assert verdict(1.03, 0.02).agrees is None and verdict(0.97, 0.02).agrees is None
    assert verdict(0.90, 0.02).agrees is False
    low, high = verdict(1.10, 0.02).interval
    assert low == pytest.approx(0.06) and high == pytest.approx(0.14)


@pytest.mark.parametrize("row, metric", [(5, "top1"), (6, "top1"), (7, "miou"), (10, "top1")])
def test_scaling_rows_agree_only_beyond_their_interval(row, metric):
    judge = JUDGES[row]
    # stderr 1 each: the difference's is √2, the interval ± z₀.₉₇₅·√2 = ± 2.77
    assert judge(pair(metric, 30.0, 33.0)).agrees is True
    assert judge(pair(metric, 30.0, 32.5)).agrees is None
    assert judge(pair(metric, 30.0, 27.5)).agrees is None
    assert judge(pair(metric, 30.0, 27.0)).agrees is False
    outcome = judge(pair(metric, 30.0, 33.0))
    z = 1.959963984540054
    assert outcome.interval == pytest.approx((3 - z * math.sqrt(2), 3 + z * math.sqrt(2)))
    assert outcome.relative_to == 30.0
    unmeasured = judge(pair(metric, 30.0, 40.0, stderr=None))
    assert unmeasured.agrees is None and unmeasured.note == "no uncertainty measured"


def test_row_8_can_say_no_the_paper_has_the_larger_model_behind():
    judge = JUDGES[8]
    assert judge(pair("miou", 30.0, 26.0)).agrees is True  # the larger behind, as the paper's
    said_no = judge(pair("miou", 30.0, 34.0))
    assert said_no.agrees is False and "ladder" in said_no.note
    assert judge(pair("miou", 30.0, 31.0)).agrees is None


def test_row_11_calibration_error_must_fall():
    judge = JUDGES[11]
    assert judge(pair("ece/mean", 0.20, 0.10, stderr=0.02)).agrees is True
    assert judge(pair("ece/mean", 0.20, 0.18, stderr=0.02)).agrees is None
    assert judge(pair("ece/mean", 0.10, 0.20, stderr=0.02)).agrees is False


def test_row_9_needs_both_heads_beyond_noise():
    def values(dpt, linear):
        out = {}
        for head, (small, large) in {"dpt": dpt, "linear": linear}.items():
            out[f"{SMALL}-{head}"] = {"mse": small, "mse/stderr": 0.5}
            out[f"{LARGE}-{head}"] = {"mse": large, "mse/stderr": 0.5}
        return out

    assert JUDGES[9](values((10, 7), (20, 15))).agrees is True
    within = JUDGES[9](values((10, 7), (20, 19.5)))
    assert within.agrees is None and within.effect == pytest.approx(0.5)
    assert JUDGES[9](values((10, 7), (20, 23))).agrees is False  # one head worse beyond noise
    assert JUDGES[9](values((10, 12), (20, 19.5))).agrees is False
    # the interval shown is the deciding head's: dpt against the paper, not linear's within noise
    against = JUDGES[9](values((10, 12), (20, 19.5)))
    assert against.effect == pytest.approx(-2) and against.interval[1] < 0
    # undecided: the widest undecided head's interval, so its margin bounds both heads
    mixed = JUDGES[9](values((10, 9.9), (20, 19.5)))
    assert mixed.agrees is None and mixed.effect == pytest.approx(0.5)


def test_a_spread_over_two_seeds_is_read_with_students_t():
    """Two seeds' spread has one degree of freedom: the 95% interval is ±12.7 se, not ±1.96."""
    one_seed = {
        SMALL: {"top1": 10.0, "top1/stderr": 2.0},
        LARGE: {"top1": 20.0, "top1/stderr": 2.0},
    }
    two_seeds = {m: v | {"top1/seeds": 2} for m, v in one_seed.items()}
    assert JUDGES[5](one_seed).agrees is True
    outcome = JUDGES[5](two_seeds)
    half = (outcome.interval[1] - outcome.interval[0]) / 2
    assert outcome.agrees is None and half == pytest.approx(12.706 * math.hypot(2, 2), rel=1e-3)
    assert outcome.stderr == pytest.approx(math.hypot(2, 2))


def test_row_12_distillation_gain_beyond_its_paired_error():
    def values(gain, stderr):
        return {
            "distill": {
                "top1/teacher": 40.0,
                "top1/distilled": 30.0 + gain,
                "top1/label_only": 30.0,
                "gain": gain,
                "gain/stderr": stderr,
            }
        }

    assert JUDGES[12](values(4.0, 1.0)).agrees is True
    assert JUDGES[12](values(1.5, 1.0)).agrees is None
    assert JUDGES[12](values(-4.0, 1.0)).agrees is False


def test_every_row_has_a_tested_judge():
    tested = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
    assert set(JUDGES) == tested


def test_seeds_add_their_spread_to_the_items_error():
    combined = over_seeds([{"top1": 10.0, "top1/stderr": 1.0}, {"top1": 12.0, "top1/stderr": 1.0}])
    # items: mean of the variances (1); seeds: variance 2 over 2 seeds (1): √2 in all
    assert combined["top1"] == 11.0 and combined["top1/stderr"] == pytest.approx(math.sqrt(2))
    assert over_seeds([{"top1": 10.0}]) == {"top1": 10.0}
    assert "top1/stderr" not in over_seeds([{"top1": 10.0}, {"top1": 12.0}])
