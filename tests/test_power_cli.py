"""``evalkit power`` and ``compare --paired --detect`` on real small runs (kNN on the embedded
stand-in, 384 test images): the printed MDE, images and seeds needed are the formulas of
docs/results.md computed here by hand from the per-image files, and a gate too blind to see
the drop it is asked about fails."""

from __future__ import annotations

import math
import re

import pandas as pd
from scipy.special import ndtri, stdtrit

from evalkit.cli import main

IMAGES = 384


def run(*args) -> int:
    return main(["run", "--backbone", "fake", "--data", "embedded", "--quiet", *args])


def two_setups(out: str, *seeds: str) -> None:
    both = ("--task", "imagenet-knn", "--save-predictions", "--out", out, *seeds)
    assert run(*both) == 0
    assert run(*both, "--model-arg", "dim=16") == 0


def said(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main([*map(str, args)])
    return code, capsys.readouterr().out


def number(out: str, before: str) -> float:
    return float(re.search(re.escape(before) + r" ([\d,.]+)", out).group(1).replace(",", ""))


def correct(folder, dim16: bool) -> pd.Series:
    """One setup's per-image right or wrong (seed 0), by image; its file found by the run
    key of its rows (the dim=16 setup's rows name that option)."""
    rows = pd.read_json(folder / "imagenet-knn.jsonl", lines=True)
    rows = rows[(rows["seed"] == 0) & (rows["metric"] == "top1/k=20")]
    mine = rows[rows["backbone_options"].astype(str).str.contains("16") == dim16]
    (key,) = set(mine["run_key"])
    (path,) = (folder / "predictions").glob(f"imagenet-knn--fake--s0--{key}.parquet")
    return pd.read_parquet(path).set_index("image")["correct"]


def test_power_prints_the_mde_and_the_images_needed_by_the_formula(cli_env, capsys):
    """One seed a side: McNemar's MDE (z₀.₉₇₅ + z₀.₈)·√(ψ/n) at the observed discordant
    rate, and n = (z + z)²·max(ψ, D)/D² images for D = 3 points; the lever is images."""
    two_setups("F")
    a, b = correct(cli_env / "F", False), correct(cli_env / "F", True)
    b = b.loc[a.index]
    psi = float((a != b).mean())
    k = ndtri(0.975) + ndtri(0.8)
    code, out = said(capsys, "power", "F", "--task", "imagenet-knn", "--detect", 3)
    assert code == 0, out
    assert number(out, "MDE:") == round(100 * k * math.sqrt(psi / IMAGES), 2)
    assert number(out, "to detect 3 points:") == math.ceil(k * k * max(psi, 0.03) / 0.03**2)
    assert "cheapest lever: more images" in out
    named = ("--a", "fake [dim=16] (random init)", "--b", "fake (random init)")
    code, out = said(capsys, "power", "F", "--task", "imagenet-knn", *named)
    assert code == 0 and "fake [dim=16] (random init) − fake (random init)" in out
    code, _ = said(capsys, "power", "F", "--task", "imagenet-knn", "--a", "fake", "--b", "x")
    assert code == 2  # "fake" names two setups here: refused, never guessed


def test_power_with_seeds_prints_the_seed_spread_and_the_seeds_needed(cli_env, capsys):
    """Three seeds a side: the seed-level MDE (t₀.₉₇₅ + t₀.₈)·√((s_a² + s_b²)/3) with 4
    degrees of freedom, and the fewest seeds a side whose MDE reaches D."""
    two_setups("S", "--seed", "0", "--seed", "1", "--seed", "2")
    rows = pd.read_json(cli_env / "S" / "imagenet-knn.jsonl", lines=True)
    rows = rows[rows["metric"] == "top1/k=20"]
    small = rows["backbone_options"].astype(str).str.contains("16")
    spreads = [rows[small == side]["value"].std(ddof=1) for side in (False, True)]
    variance = sum(s * s for s in spreads)

    def seed_mde(k: int) -> float:
        return (stdtrit(2 * k - 2, 0.975) + stdtrit(2 * k - 2, 0.8)) * math.sqrt(variance / k)

    code, out = said(capsys, "power", "S", "--task", "imagenet-knn", "--detect", 2)
    assert code == 0, out
    assert number(out, "seed-level MDE") == round(seed_mde(3), 2)
    needed = next(k for k in range(2, 10_000) if seed_mde(k) <= 2)
    assert number(out, "to detect 2 points across seeds:") == needed
    assert "cheapest lever: more " in out


def test_a_gate_blind_to_the_drop_it_is_asked_about_fails(cli_env, capsys):
    """A folder against itself on 384 images: nothing flipped, so each accuracy's MDE is
    taken at the churn of unrelated mistakes, ψ = 2p(1 − p), at Holm's level for 4 tested
    metrics (0.05/4): about 9-11 points. --detect 3 fails naming the blind metric; --detect
    30 passes; the blind spot is printed either way."""
    two_setups("F")
    code, out = said(capsys, "compare", "F", "F", "--paired", "--detect", 3)
    assert code == 1, out
    assert "cannot see a 3-point drop on 384 images: its MDE is" in out
    top1 = correct(cli_env / "F", False).mean()
    psi = round(2 * top1 * (1 - top1) * IMAGES) / IMAGES
    k = ndtri(1 - 0.05 / 8) + ndtri(0.8)
    expected = 100 * k * math.sqrt(psi / IMAGES)
    line = next(x for x in out.splitlines() if "top1/k=20, fake (random init)" in x)
    assert f"its MDE is {expected:.1f}" in line
    code, out = said(capsys, "compare", "F", "F", "--paired", "--detect", 30)
    assert code == 0, out
    assert "blind spot: of 4 tested metric(s)" in out and "cannot see" not in out
    code, _ = said(capsys, "compare", "F", "F", "--detect", 3)
    assert code == 2  # --detect sizes a paired test: without --paired it is refused
