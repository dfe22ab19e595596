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
from evalkit.core.results import predictions_file, rows_file
from evalkit.publish.explore_cue_conflict import CUES
from evalkit.publish.explore_outputs import outputs
from evalkit.publish.explore_pages import PAGE


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
    """Right → wrong and wrong → right from the two per-image files, A plain ``fake`` (the
    setup without options), B ``fake [dim=16]``: each file found by its rows' run key, not by
    its name's place in a listing (the key is a hash)."""
    import json

    rows = [json.loads(line) for line in (results / "imagenet-knn.jsonl").open()]
    keys = {r["run_key"]: bool(r.get("backbone_options")) for r in rows}
    files = sorted(
        (results / "predictions").glob("*.parquet"),
        key=lambda p: keys[p.stem.rpartition("--")[2]],
    )
    a, b = (pd.read_parquet(p).set_index("image")["correct"] for p in files)
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


def one_board(folder: Path, task: str, metric: str, higher: bool, files: dict) -> None:
    """Rows of ``task`` (one per backbone of ``files``, valued by its frame's ``value``
    attribute) and each backbone's per-image file, as ``--save-predictions`` lays them out."""
    (folder / "predictions").mkdir(parents=True, exist_ok=True)
    for number, (backbone, (value, frame)) in enumerate(files.items()):
        key = f"{number + 1:016x}"
        row = {"task": task, "backbone": backbone, "metric": metric, "seed": 0, "value": value}
        row |= {"higher_is_better": higher, "run_key": key}
        with open(rows_file(folder, task), "a") as rows:
            rows.write(json.dumps(row) + "\n")
        frame.to_parquet(predictions_file(folder, task, backbone, 0, key))


def image_files(root: Path, ids) -> Path:
    """A small PNG under ``root`` for each id (the site's thumbnails are made from them)."""
    from PIL import Image

    for number, image in enumerate(ids):
        (root / image).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (number * 20 % 256, 90, 160)).save(root / image)
    return root


def shown_ids(text: str) -> list[str]:
    """The image ids of a page's thumbnails (their alt text), in page order."""
    return re.findall(r'<img src="[^"]+" width="\d+" height="\d+" alt="([^"]+)">', text)


def calibration_frame() -> pd.DataFrame:
    """Eight images in 5 confidence bins: (0.8, 1] holds two mistakes (0.97 before 0.86) and
    two right; (0.4, 0.6] one mistake of three; (0.2, 0.4] one mistake alone."""
    confidence = [0.86, 0.99, 0.97, 0.90, 0.55, 0.50, 0.45, 0.30]
    correct = [False, True, False, True, False, True, True, False]
    return pd.DataFrame(
        {
            "image": [f"val/c{i}/{i}.png" for i in range(8)],
            "label": list(range(8)),
            "label_name": [f"class {i}" for i in range(8)],
            "prediction": [i if right else 7 - i for i, right in enumerate(correct)],
            "prediction_name": [
                f"class {i if right else 7 - i}" for i, right in enumerate(correct)
            ],
            "correct": correct,
            "confidence": confidence,
            "confidence_ts": confidence,
            "bins": [5] * 8,
        }
    )


def test_the_calibration_page_shows_each_confidence_bins_surest_mistakes(tmp_path):
    """Per bin its accuracy against its mean confidence, then its mistakes surest first, each a
    thumbnail with its true and answered class; the ECE the bins make is the task's."""
    frame = calibration_frame()
    one_board(tmp_path / "R", "imagenet-ece", "ece", False, {"net": (0.3, frame)})
    root = image_files(tmp_path / "data", frame["image"])
    site = tmp_path / "site"
    assert main(["explore", str(tmp_path / "R"), "--out", str(site), "--data-root", str(root)]) == 0
    assert "calibration-0.html" in (site / "index.html").read_text()
    (page,) = site.glob("*/calibration-0.html")
    text = page.read_text()
    accuracy = dict(re.findall(r'id="accuracy-(\d)">([^<]+)<', text))
    assert accuracy == {"4": "50.0%", "2": "66.7%", "1": "0.0%"}
    assert "accuracy 50.0% vs confidence 93.0% (over-confident by 43.0 points)" in text
    sections = text.split('<h2 id="bin-')[1:]
    assert [s[0] for s in sections] == ["4", "2", "1"]  # surest bin first
    assert [shown_ids(s) for s in sections] == [
        ["val/c2/2.png", "val/c0/0.png"],  # 0.97 before 0.86; the right ones not shown
        ["val/c4/4.png"],
        ["val/c7/7.png"],
    ]
    assert "✗ class 5 (0.97)" in sections[0] and "<b>true:</b> class 2" in sections[0]
    assert text.count("<img ") == 4 and "image file not found" not in text
    ece = (4 * abs(0.5 - 0.93) + 3 * abs(2 / 3 - 0.5) + 0.3) / 8
    assert f'<b id="ece">{ece:.4f}</b>' in text


def test_the_cue_conflict_page_says_which_cue_decided_each_stimulus(tmp_path):
    """Shape, texture or neither per stimulus whose two cues differ (one cat-on-cat stimulus
    left out, as the shape bias leaves it), with the shape bias they make."""
    frame = pd.DataFrame(
        {
            "image": [
                f"cue-conflict/{n}.png" for n in ("cat-dog", "cat-dog2", "dog-cat", "cat-cat")
            ]
            + ["edge/cat.png"],
            "set": ["cue-conflict"] * 4 + ["edge"],
            "condition": ["0"] * 5,
            "category": ["cat", "cat", "dog", "cat", "cat"],
            "texture": ["dog", "dog", "cat", "cat", ""],
            "decision": ["cat", "dog", "bird", "cat", "dog"],
            "correct": [True, False, False, True, False],
        }
    )
    one_board(tmp_path / "R", "shape-bias", "shape_bias", True, {"net": (0.5, frame)})
    root = image_files(tmp_path / "data", frame["image"])
    site = tmp_path / "site"
    assert main(["explore", str(tmp_path / "R"), "--out", str(site), "--data-root", str(root)]) == 0
    (page,) = site.glob("*/cue-0.html")
    text = page.read_text()
    assert {k: page_count(page, k) for k in ("shape", "texture", "neither")} == {
        "shape": 1,
        "texture": 1,
        "neither": 1,
    }
    assert '<b id="shape-bias">0.500</b>' in text
    pages = {cue: (page.parent / f"cue-0-{cue}-p1.html").read_text() for cue in CUES}
    assert shown_ids(pages["shape"]) == ["cue-conflict/cat-dog.png"]
    assert shown_ids(pages["texture"]) == ["cue-conflict/cat-dog2.png"]
    assert shown_ids(pages["neither"]) == ["cue-conflict/dog-cat.png"]
    assert "answered dog: decided by texture" in pages["texture"]
    assert all(p.count("<img ") == 1 for p in pages.values())


@pytest.mark.parametrize(
    ("task", "metric", "higher", "values", "order"),
    [
        ("ade20k-1/16", "miou", True, [50.0, 10.0, 30.0, 70.0], [1, 2, 0, 3]),
        ("waymo-depth-linear", "mse", False, [0.1, 0.5, 0.3, 0.2], [1, 2, 3, 0]),
    ],
)
def test_a_dense_setups_page_shows_its_worst_images_first(
    tmp_path, task, metric, higher, values, order
):
    """Segmentation: lowest per-image mIoU first; depth: highest per-image error first."""
    ids = [f"val/{i}.png" for i in range(4)]
    frame = pd.DataFrame({"image": ids, metric: values, "other": [0.0] * 4})
    one_board(tmp_path / "R", task, metric, higher, {"net": (float(np.mean(values)), frame)})
    root = image_files(tmp_path / "data", ids)
    site = tmp_path / "site"
    assert main(["explore", str(tmp_path / "R"), "--out", str(site), "--data-root", str(root)]) == 0
    (page,) = site.glob("*/worst-0-p1.html")
    text = page.read_text()
    assert shown_ids(text) == [ids[i] for i in order]
    assert f"<b>{metric}</b> {values[order[0]]:.4g}" in text
    assert text.count("<img ") == 4
    assert "worst-0-p1.html" in (site / "index.html").read_text()


@pytest.mark.slow
def test_the_calibration_cue_conflict_and_worst_image_pages_load_in_a_real_browser(cli_env):
    """Headless Chromium opens the stand-in's calibration page, its cue-conflict decisions and
    a segmentation setup's worst images: every image loaded, no text cut off its box."""
    from browser import chromium, measured

    chromium()
    for task in ("imagenet-ece", "shape-bias"):
        command = ["run", "--task", task, "--backbone", "fake", "--data", "embedded"]
        assert main([*command, "--save-predictions", "--out", "R", "--quiet"]) == 0
    ids = [f"val/ADE_val_{i:08d}.jpg" for i in range(70)]
    scores = pd.DataFrame({"image": ids, "miou": np.linspace(5.0, 75.0, 70)})
    one_board(cli_env / "R", "ade20k-1/16", "miou", True, {"a long setup name " * 4: (40, scores)})
    root = image_files(cli_env / "data", ids)
    site = cli_env / "site"
    assert main(["explore", "R", "--out", str(site), "--data-root", str(root)]) == 0
    pages = [
        *site.glob("imagenet-ece*/calibration-0.html"),
        *site.glob("shape-bias*/cue-0-texture-p1.html"),
        *site.glob("ade20k*/worst-0-p1.html"),
        site / "index.html",
    ]
    assert len(pages) == 4, pages
    for page in pages:
        check = measured(page, CHECK, cli_env / "profile")
        assert check["broken"] == [] and check["cut"] == [], (page, check)
        if page.name != "index.html":
            assert check["images"] > 0, page
