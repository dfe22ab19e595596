"""How effect-table rows end (agrees, disagrees, or no effect larger than ±X, each with its MDE)
and ``reproduce --resolve``'s sequential rule, proved by simulation: under optional stopping
the rule decides a row with no effect at most 5% of the time, its margins hold, and the two
careless versions — 5% at every look, a normal quantile for a spread over two seeds — fail the
same check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evalkit.cli import main
from evalkit.reproduction import resolve as sequential
from evalkit.reproduction.resolve import (
    decided,
    detectable,
    look_level,
    resolution_text,
    resolve,
)

REPLICATES = 3000
# the looks at 2, 4, 8, 16, 32 and 64 seeds fit: 62 seconds of new seeds at one second each
BUDGET, MOST_SEEDS = 62, 64


def simulated_row(effect: float, item_error: float, seed_spread: float, rng):
    """A row measured with n seeds as ``reproduce`` measures one: the same test items every
    seed (one item error), each seed's own draw, the standard error from the item error and
    the seeds' spread (``over_seeds``); one second per seed."""
    items = rng.normal(0.0, item_error)
    draws = rng.normal(0.0, seed_spread, MOST_SEEDS)

    def measure(seeds: int):
        values = effect + items + draws[:seeds]
        spread = values.std(ddof=1) if seeds > 1 else 0.0
        return float(values.mean()), math.hypot(item_error, spread / math.sqrt(seeds)), seeds

    return measure


def error_rates(effect, item_error, seed_spread, seed=0):
    """Over replicates: how often the rule decides the wrong way (or at all, with no effect),
    and how often the true effect lies beyond the margin the rule ends with."""
    rng = np.random.default_rng(seed)
    wrong = beyond = 0
    for _ in range(REPLICATES):
        run, verdict = resolve(simulated_row(effect, item_error, seed_spread, rng), 2, BUDGET, 1)
        if verdict is not None and (effect == 0 or verdict is not (effect > 0)):
            wrong += 1
        low, high = run.last.interval
        beyond += not low <= effect <= high
    return wrong / REPLICATES, beyond / REPLICATES


# 2.5 Monte-Carlo standard errors above 5% at 3,000 replicates
CEILING = 0.05 + 2.5 * math.sqrt(0.05 * 0.95 / REPLICATES)


@pytest.mark.parametrize(
    "item_error, seed_spread", [(0.0, 1.0), (1.0, 1.0), (1.0, 3.0), (1.0, 0.1)]
)
def test_a_row_with_no_effect_is_decided_at_most_five_percent_of_the_time(item_error, seed_spread):
    wrong, beyond = error_rates(0.0, item_error, seed_spread)
    assert wrong <= CEILING and beyond <= CEILING


def test_margins_and_directions_hold_when_there_is_an_effect():
    wrong, beyond = error_rates(0.4, 1.0, 1.0, seed=1)
    assert wrong <= CEILING / 2 and beyond <= CEILING


def test_a_large_effect_is_decided_and_agrees():
    rng = np.random.default_rng(2)
    verdicts = [resolve(simulated_row(4.0, 0.5, 1.0, rng), 2, BUDGET, 1)[1] for _ in range(200)]
    assert verdicts.count(True) >= 190


def test_five_percent_at_every_look_fails_the_same_check(monkeypatch):
    monkeypatch.setattr(sequential, "look_level", lambda look, level=0.05: level)
    assert error_rates(0.0, 0.0, 1.0)[0] > CEILING


def test_a_normal_quantile_for_two_seeds_fails_the_same_check(monkeypatch):
    from scipy.special import ndtri

    monkeypatch.setattr(sequential, "quantile", lambda level, seeds: float(ndtri(1 - level / 2)))
    assert error_rates(0.0, 0.0, 1.0)[0] > CEILING


def test_a_row_whose_paper_effect_is_negative_agrees_below_zero():
    assert decided((-3.0, -1.0), -1) is True and decided((1.0, 3.0), -1) is False
    assert decided((1.0, 3.0), 1) is True and decided((-1.0, 3.0), -1) is None


def test_the_levels_sum_to_five_percent_over_any_number_of_looks():
    assert look_level(1) == 0.025 and look_level(2) == pytest.approx(0.05 / 6)
    assert sum(look_level(k) for k in range(1, 100_001)) == pytest.approx(0.05, rel=1e-4)


def test_the_stated_mde_is_detected_eighty_percent_of_the_time():
    """A true effect equal to the stated MDE of a 95% interval (standard error 1) leaves zero
    out of the interval in about 80% of samples; half of it in far fewer."""
    rng = np.random.default_rng(3)
    stated = detectable((-1.959963984540054, 1.959963984540054))
    assert stated == pytest.approx(1.959963984540054 + 0.8416212335729143)
    for true, low, high in ((stated, 0.785, 0.815), (stated / 2, 0.25, 0.33)):
        found = np.mean(np.abs(rng.normal(true, 1.0, 20_000)) > 1.959963984540054)
        assert low <= found <= high


def record(agrees, interval, note=""):
    return {"agrees": agrees, "interval": interval, "note": note}


def test_every_row_ends_as_agrees_disagrees_or_a_margin_with_its_mde():
    assert resolution_text(record(None, [-3.08, 9.85])) == (
        "no effect larger than ±9.85; would detect ≥ 9.24 80% of the time"
    )
    assert resolution_text(record(True, [5.41, 25.1])).startswith("agrees with the paper; ")
    assert resolution_text(record(False, [-14.1, -1.0])).startswith("disagrees with the paper")
    assert resolution_text(record(True, None)) == "agrees with the paper, no noise estimate"
    assert resolution_text(record(None, None)) == "undecided: no uncertainty measured"


def test_a_resolved_row_names_its_look_seeds_and_spent_level():
    row = record(None, [-2.0, 4.0])
    row["sequential"] = {
        "looks": [{"look": 3, "seeds": 8, "level": look_level(3)}],
        "stopped": "budget: 8 more seeds would need ~80 s",
    }
    text = resolution_text(row)
    assert "look 3 at 8 seeds, look level 0.0042" in text and "budget" in text


def test_reproduce_resolve_at_the_smoke_scale(cli_env, capsys, monkeypatch):
    """Row 10 (video: its heads depend on the seed) and row 5 (a seed-free probe) at the smoke
    scale, where both ladder sizes are one model: no effect, so the row is measured again
    until the budget ends, then ends at its margin; a later run of another row keeps them.
    Each run is counted as 1 s so that the budget buys a known number of looks: row 10 has
    two runs per seed, so 1 → 2 seeds costs 2 s, 2 → 4 seeds 4 s, and 4 → 8 would overspend 13."""
    from evalkit.reproduction.reproduce import Reproduction

    measured = Reproduction.measure

    def counted_as_one_second(job, run):
        values, _, pictures = measured(job, run)
        return values, 1.0, pictures

    monkeypatch.setattr(Reproduction, "measure", counted_as_one_second)
    args = ["reproduce", "--scale", "smoke", "--rows", "5,10", "--out", "paper", "--quiet"]
    assert main([*args, "--resolve", "13"]) == 0
    table_file = cli_env / "paper" / "effects-smoke"  # .json and .md
    summary = json.loads(table_file.with_suffix(".json").read_text())
    linear, video = summary["rows"]
    assert linear["note"].startswith("more seeds cannot change it") and "sequential" not in linear
    looks = video["sequential"]["looks"]
    assert [look["seeds"] for look in looks] == [1, 2, 4] and video["seeds"]["small"] == 4
    assert [look["level"] for look in looks] == [look_level(k) for k in (1, 2, 3)]
    assert video["agrees"] is None and video["sequential"]["stopped"].startswith("budget")
    assert video["interval"] == looks[-1]["interval"]
    assert summary["resolve_budget"] == 13 and summary["resolve_seconds"] == 6
    table = table_file.with_suffix(".md").read_text()
    assert "no effect larger than ±" in table and "within noise" not in table
    assert "look 3 at 4 seeds" in table
    assert main(["reproduce", "--scale", "smoke", "--rows", "3", "--out", "paper", "--quiet"]) == 0
    kept = json.loads(table_file.with_suffix(".json").read_text())["rows"]
    assert [r["row"] for r in kept] == [3, 5, 10] and kept[2]["sequential"]["looks"] == looks
    header = table_file.with_suffix(".md").read_text()
    assert (
        "Rows produced by `evalkit reproduce --scale smoke --rows 5,10 --resolve 13` (rows 5, "
        "10); `evalkit reproduce --scale smoke --rows 3` (rows 3)."
    ) in header
    assert "Rows measured again by `--resolve`: 10, 6 s of seeds." in header


def test_resolve_refuses_a_budget_that_is_not_seconds_and_the_paper_scale(cli_env, capsys):
    for budget in ("0", "an hour"):
        with pytest.raises(SystemExit) as stopped:
            main(["reproduce", "--scale", "smoke", "--resolve", budget])
        assert stopped.value.code == 2
    assert main(["reproduce", "--scale", "paper", "--dry-run", "--resolve", "60"]) == 2
    err = capsys.readouterr().err
    assert "expects seconds of compute (> 0), got '0'" in err and "scale paper" in err


def test_a_kept_row_drawn_under_another_seed_rule_says_so():
    """Records written before rows recorded their seed rule were drawn under rule 1: kept
    beside rows measured now, each says so; a row of this rule says nothing."""
    from evalkit.reproduction.reproduce import OTHER_RULE, label_other_rule
    from evalkit.seeds import SEED_RULE

    old, now = {"row": 3, "note": "timed"}, {"row": 4, "note": "", "seed_rule": SEED_RULE}
    for record in (old, now, old):  # labelled once, however often it is kept
        label_other_rule(record)
    assert old["note"] == "timed; " + OTHER_RULE.format(rule=1, now=SEED_RULE)
    assert now["note"] == ""


def test_a_kept_scaling_row_from_another_ladder_says_so():
    from evalkit.reproduction.reproduce import OTHER_LADDER, label_other_ladder
    from evalkit.reproduction.table import verdict_text

    now = {"ti": "aaaa", "s": "bbbb"}
    rows = {
        "same ladder": {"row": 5, "note": "", "ladder_id": dict(now)},
        "another ladder": {"row": 5, "note": "", "ladder_id": {"ti": "aaaa", "s": "cccc"}},
        "no ladder recorded": {"row": 6, "note": "within noise (95%: -1 to +2)"},
        "an ablation's own models": {"row": 3, "note": ""},
    }
    for record in rows.values():
        label_other_ladder(record, now)
    labelled = {name for name, r in rows.items() if OTHER_LADDER in r["note"]}
    assert labelled == {"another ladder", "no ladder recorded"}
    shown = verdict_text(rows["no ladder recorded"] | {"agrees": None, "interval": [-1.0, 2.0]})
    assert OTHER_LADDER in shown and "within noise" not in shown
