"""``evalkit explore``: the static site of the images behind the numbers — its pages exist,
every picture it names is on disk, its flip counts are the per-image files' own, what it
prints is escaped, and a 50,000-image pair stays paged and small."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalkit.cli import main
from evalkit.publish.explore import PAGE, outputs


def run_pair(cli_env) -> Path:
    """Two kNN setups on the embedded stand-in with their per-image outputs, under R."""
    for extra in ([], ["--model-arg", "dim=16"]):
        command = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded"]
        assert main([*command, "--save-predictions", "--out", "R", *extra]) == 0
    return cli_env / "R"


def stand_in_root(cli_env) -> Path:
    """The folder the stand-in's image ids are relative to (the session's data cache)."""
    import os

    (root,) = Path(os.environ["EVALKIT_CACHE"]).glob("embedded/shapes-*")
    return root


def flip_counts(results: Path) -> dict[str, int]:
    """Right → wrong and wrong → right from the two per-image files, A the better on the
    board (its rows' top-1; the second file on a tie, as the site's stable order keeps it)."""
    frames = [pd.read_parquet(p) for p in sorted((results / "predictions").glob("*.parquet"))]
    a, b = (frame.set_index("image")["correct"] for frame in frames)
    b = b.loc[a.index]
    return {"right-to-wrong": int((a & ~b).sum()), "wrong-to-right": int((~a & b).sum())}


def page_count(page: Path, key: str) -> int:
    return int(re.search(rf'id="{key}">(\d+)<', page.read_text())[1])


def image_sources(site: Path) -> list[tuple[Path, str]]:
    return [
        (page, src)
        for page in site.rglob("*.html")
        for src in re.findall(r'<img src="([^"]+)"', page.read_text())
    ]


def test_the_site_shows_two_stand_in_setups_flips_with_every_picture_on_disk(cli_env):
    results = run_pair(cli_env)
    site = cli_env / "site"
    command = ["explore", str(results), "--out", str(site)]
    assert main([*command, "--data-root", str(stand_in_root(cli_env))]) == 0
    index = (site / "index.html").read_text()
    assert "fake (random init)" in index and "fake [dim=16] (random init)" in index
    (pair,) = site.glob("*/0-vs-1/index.html")
    for name in ("classes.html", "right-to-wrong-all-p1.html", "wrong-to-right-all-p1.html"):
        assert (pair.parent / name).is_file()
    assert (pair.parent.parent / "setup-0.html").is_file()
    sources = image_sources(site)
    assert sources
    for page, src in sources:  # relative, resolving from the page that names it
        assert (page.parent / src).resolve().is_file(), (page, src)
    thumbs = list((site / "thumbs").glob("*.jpg"))
    assert len(thumbs) == len({src.rpartition("/")[2] for _, src in sources})  # one per image
    from PIL import Image

    assert all(max(Image.open(t).size) <= 128 for t in thumbs)
    # A and B: the board's order, best first (the two tie on the stand-in: the rows' order)
    labels = re.findall(r"<b>[AB]</b> = ([^;.]+)", pair.read_text())
    counts = flip_counts(results)
    if labels[0] != "fake (random init)":
        counts = {
            "right-to-wrong": counts["wrong-to-right"],
            "wrong-to-right": counts["right-to-wrong"],
        }
    for kind, expected in counts.items():
        assert page_count(pair, kind) == expected
        text = (pair.parent / f"{kind}-all-p1.html").read_text()
        shown = text.count('<figure class="card">')
        assert shown == min(expected, PAGE)
        a_mark, b_mark = ("ok", "bad") if kind == "right-to-wrong" else ("bad", "ok")
        assert text.count(f'<span class="{a_mark}">{"✓" if a_mark == "ok" else "✗"} A') == shown
        assert text.count(f'<span class="{b_mark}">{"✓" if b_mark == "ok" else "✗"} B') == shown
    assert "images have no readable file" not in index  # every image found under --data-root


def synthetic_pair(folder: Path, images: int, classes: list[str], seed: int = 0) -> dict:
    """Two classification setups' rows and per-image files on ``images`` made-up images
    (no image files: the site shows placeholders); returns the flip counts."""
    rng = np.random.default_rng(seed)
    label = rng.integers(len(classes), size=images)
    right = [rng.uniform(size=images) < share for share in (0.8, 0.75)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictions").mkdir(exist_ok=True)
    for number, (backbone, correct) in enumerate(zip(("net<a>&b", "plain"), right, strict=True)):
        prediction = np.where(correct, label, (label + 1 + number) % len(classes))
        frame = {
            "image": [f"val/{i:06d}.JPEG" for i in range(images)],
            "label": label,
            "label_name": [classes[i] for i in label],
            "prediction": prediction,
            "prediction_name": [classes[i] for i in prediction],
            "top5_probabilities": [[p] for p in rng.uniform(0.2, 1.0, size=images)],
            "correct": correct,
        }
        key = f"{number:016x}"
        row = {"task": "imagenet-linear", "backbone": backbone, "metric": "top1", "seed": 0}
        row |= {"value": 100 * correct.mean(), "higher_is_better": True, "run_key": key}
        with open(folder / "imagenet-linear.jsonl", "a") as rows:
            rows.write(json.dumps(row) + "\n")
        name = f"imagenet-linear--{backbone}--s0--{key}.parquet"
        pd.DataFrame(frame).to_parquet(folder / "predictions" / name)
    a, b = sorted(right, key=lambda correct: -correct.mean())  # A: the board's better
    return {"right-to-wrong": int((a & ~b).sum()), "wrong-to-right": int((~a & b).sum())}


def test_labels_and_classes_are_escaped_and_missing_images_are_placeholders(tmp_path):
    counts = synthetic_pair(tmp_path / "R", 200, ["<b>cat</b>", 'a "dog" & co'])
    site = tmp_path / "site"
    assert main(["explore", str(tmp_path / "R"), "--out", str(site)]) == 0
    pages = [p.read_text() for p in site.rglob("*.html")]
    assert not any("<b>cat</b>" in text or "net<a>" in text for text in pages)
    assert any("&lt;b&gt;cat&lt;/b&gt;" in text for text in pages)
    assert any("net&lt;a&gt;&amp;b" in text for text in pages)
    (pair,) = site.glob("*/0-vs-1/index.html")
    assert {kind: page_count(pair, kind) for kind in counts} == counts
    assert "image file not found" in (pair.parent / "right-to-wrong-all-p1.html").read_text()
    assert "have no readable file" in (site / "index.html").read_text()
    assert not image_sources(site)  # no file found: no <img> pointing nowhere


def test_a_50k_image_pair_is_paged_and_small_on_disk(tmp_path):
    """50,000 images of 1,000 classes, about 25% churn: every page holds at most ``PAGE``
    images, the pages add up to what docs/results.md states (no thumbnails here: placeholders;
    each found image adds one JPEG of about 4 KB)."""
    classes = [f"class {i:04d}" for i in range(1000)]
    counts = synthetic_pair(tmp_path / "R", 50_000, classes)
    site = tmp_path / "site"
    assert (
        main(["explore", str(tmp_path / "R"), "--out", str(site), "--task", "imagenet-linear"]) == 0
    )
    (pair,) = site.glob("*/0-vs-1/index.html")
    assert {kind: page_count(pair, kind) for kind in counts} == counts
    pages = list(site.rglob("*.html"))
    paged = [p for p in pages if re.search(r"-p\d+\.html$", p.name)]
    assert max(p.read_text().count('<figure class="card">') for p in paged) == PAGE
    for kind, count in counts.items():
        assert len(list(pair.parent.glob(f"{kind}-all-p*.html"))) == -(-count // PAGE)
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    largest = max(p.stat().st_size for p in pages)
    print(
        f"50k pair: {len(pages)} pages, {total / 1e6:.1f} MB, largest page {largest / 1e3:.0f} kB"
    )
    assert total < 40e6 and largest < 250e3


def family_frames():
    """A few-shot file (each draw right or wrong) and a model-vs-human one (one stimulus in
    two sets)."""
    few = pd.DataFrame(
        {
            "image": ["a.png", "b.png"],
            "label": [0, 1],
            "label_name": ["cat", "dog"],
            "correct_by_seed": [[True, True, False], [False, False, True]],
            "correct_share": [2 / 3, 1 / 3],
        }
    )
    human = pd.DataFrame(
        {
            "image": ["x.png", "x.png"],
            "set": ["edge", "sketch"],
            "category": ["cat", "dog"],
            "decision": ["cat", "cat"],
            "correct": [True, False],
        }
    )
    return few, human


def test_few_shot_and_model_vs_human_files_read_as_classification_does(tmp_path):
    """Few-shot: right when more than half the draws were; model-vs-human: the decision is the
    answer, keyed by set where a stimulus is in two."""
    few, human = family_frames()
    few.to_parquet(tmp_path / "few.parquet")
    human.to_parquet(tmp_path / "human.parquet")
    few = outputs(tmp_path / "few.parquet")
    assert few["right"].tolist() == [True, False]
    assert few["guess"].tolist() == ["2/3 draws right", "1/3 draws right"]
    human = outputs(tmp_path / "human.parquet")
    assert human.index.tolist() == ["edge:x.png", "sketch:x.png"]  # one stimulus, two sets
    assert human["predicted"].tolist() == ["cat", "cat"] and human["right"].tolist() == [
        True,
        False,
    ]


CHECK = """
  const found = {images: 0, broken: [], cut: []};
  for (const img of document.images) {
    found.images += 1;
    if (!img.complete || img.naturalWidth === 0) found.broken.push(img.getAttribute("src"));
  }
  for (const el of document.querySelectorAll(".card, .card *, td, h1, p")) {
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).display !== "inline")
      found.cut.push(el.textContent.slice(0, 60));
  }
  return found;
"""


@pytest.mark.slow
def test_the_site_loads_its_images_in_a_real_browser(cli_env):
    """Headless Chromium opens the index and a pair's flips: every image loaded (naturalWidth
    above 0), no text cut off its box."""
    from browser import chromium, measured

    chromium()
    results = run_pair(cli_env)
    site = cli_env / "site"
    command = ["explore", str(results), "--out", str(site)]
    assert main([*command, "--data-root", str(stand_in_root(cli_env))]) == 0
    (pair,) = site.glob("*/0-vs-1/index.html")
    for page in (site / "index.html", pair.parent / "right-to-wrong-all-p1.html"):
        check = measured(page, CHECK, cli_env / "profile")
        assert check["broken"] == [] and check["cut"] == [], check
        if page.name != "index.html":
            assert check["images"] > 0


def test_the_stand_ins_images_are_found_without_a_data_root(cli_env):
    """Image ids are relative to the data set's root; the site finds the stand-in where this
    machine keeps it (its cache), so a run's images show with no option given."""
    results = run_pair(cli_env)
    site = cli_env / "site"
    assert main(["explore", str(results), "--out", str(site)]) == 0
    (flips,) = site.glob("*/0-vs-1/right-to-wrong-all-p1.html")
    text = flips.read_text()
    assert "<img" in text and "image file not found" not in text


def test_the_leaderboard_page_links_the_images_behind_its_pairs(cli_env):
    results = run_pair(cli_env)
    page = cli_env / "board" / "board.html"
    argv = ["leaderboard", str(results), "--output", str(page), "--explore", "board/images"]
    assert main(argv) == 0
    text = page.read_text()
    assert '<a href="images/index.html">The images behind the pairs</a>' in text
    assert (page.parent / "images" / "index.html").exists()
