"""A zoo of backbones on a suite in one command, and a leaderboard that knows its noise: suites
expand where tasks go, a zoo keeps going past a failed cell and resumes without redoing
finished ones, and the leaderboard's ranks, p-values and intervals equal independent
computations (scipy) on the same per-image outputs; ``compare --paired`` lets a one-image flip
pass and catches a 5-point regression."""

from __future__ import annotations

import html.parser
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from evalkit.cli import main
from evalkit.core.catalog import resolve_task
from evalkit.core.results import FAILED
from evalkit.core.runner import run
from evalkit.core.spec import RunSpec
from evalkit.core.suites import BUILT_IN, expand
from evalkit.errors import EvalkitError
from evalkit.publish.leaderboard import leaderboard
from evalkit.significance import binomial_two_sided, holm, mcnemar, paired_bootstrap

QUICK = ("imagenet-knn", "imagenet-5shot", "imagenet-linear")
ZOO = """
[[backbone]]
name = "fake"

[[backbone]]
name = "fake"
model_args = { dim = 16 }

[[backbone]]
name = "vit22b/test"
"""


def test_suites_expand_where_tasks_go_and_users_add_their_own(tmp_path, monkeypatch):
    assert expand(["suite:classification"]) == next(
        s.tasks for s in BUILT_IN if s.name == "classification"
    )
    assert {s.name for s in BUILT_IN} >= {"paper", "classification", "dense", "robustness"}
    for suite in BUILT_IN:  # every entry names a real task with real settings
        for task in suite.tasks:
            resolve_task(task)
    mine = tmp_path / "suites.toml"
    mine.write_text('[suites.mine]\nabout = "two"\ntasks = ["imagenet-knn", "suite:nope"]\n')
    monkeypatch.setenv("EVALKIT_SUITES", str(mine))
    assert expand(["suite:mine"]) == ("imagenet-knn", "suite:nope")  # no nesting: names only
    with pytest.raises(EvalkitError, match="unknown suite 'mien': did you mean 'mine'"):
        expand(["suite:mien"])
    mine.write_text("[suites.broken]\ntasks = 3\n")
    with pytest.raises(EvalkitError, match="suite 'broken' needs tasks"):
        expand(["suite:broken"])


def test_a_task_takes_its_settings_in_brackets():
    task = resolve_task("imagenet-linear[eval_split=imagenet-r,max_iter=7]")
    assert (task.name, task.eval_split, task.max_iter) == ("imagenet-linear", "imagenet-r", 7)
    assert resolve_task("imagenet-knn[ks=10;20]").ks == (10, 20)
    with pytest.raises(EvalkitError, match=r"expected task\[key=value,...\]"):
        resolve_task("imagenet-linear[eval_split=imagenet-r")
    with pytest.raises(EvalkitError, match="has no setting 'nope'"):
        resolve_task("imagenet-linear[nope=1]")


def test_ls_suites_lists_them_with_their_tasks(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["ls", "suites"]) == 0
    out = capsys.readouterr().out
    assert "suite:robustness" in out and "imagenet-linear[eval_split=imagenet-r]" in out
    assert "[suites.<name>]" in out


def zoo(cli_env, *extra) -> int:
    (cli_env / "zoo.toml").write_text(ZOO)
    argv = ["run", "--zoo", "zoo.toml", "--data", "embedded", "--out", "runs", "--random-init"]
    return main([*argv, *(a for task in QUICK for a in ("--task", task)), *extra])


def test_a_zoo_runs_in_one_command_and_resumes_without_redoing_cells(cli_env, capsys):
    assert zoo(cli_env) == 0
    out = capsys.readouterr().out
    assert "[9/9] imagenet-linear × vit22b/test (random init) (seed 0): done" in out
    assert len(list((cli_env / "runs" / "predictions").glob("*.parquet"))) == 9  # per image
    assert zoo(cli_env) == 0
    assert capsys.readouterr().out.count("skipped (rows on disk)") == 9


def test_a_killed_zoo_redoes_only_what_it_had_not_finished(cli_env, monkeypatch, capsys):
    from evalkit.tasks.linear_probe import LinearProbe

    real = LinearProbe.run

    def killed(self, backbone, ctx):
        if backbone.info.name == "vit22b/test":
            raise KeyboardInterrupt  # the zoo is killed during its last cell
        yield from real(self, backbone, ctx)

    monkeypatch.setattr(LinearProbe, "run", killed)
    assert zoo(cli_env) == 130  # interrupted: what finished is kept
    monkeypatch.setattr(LinearProbe, "run", real)
    capsys.readouterr()
    assert zoo(cli_env) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.endswith(": done") for line in lines] == [False] * 8 + [True]


def test_a_failed_cell_is_recorded_and_the_zoo_goes_on(cli_env, monkeypatch, capsys):
    from evalkit.tasks.knn import KNN

    def broken(self, backbone, ctx):
        raise RuntimeError("a bug in one cell")

    real = KNN.run
    monkeypatch.setattr(KNN, "run", broken)
    assert zoo(cli_env) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "3 of 9 cells failed" in out and "RuntimeError: a bug in one cell" in out
    failures = [json.loads(x) for x in (cli_env / "runs" / FAILED).read_text().splitlines()]
    assert {f["task"] for f in failures} == {"imagenet-knn"} and len(failures) == 3
    board = leaderboard([cli_env / "runs"])
    assert len(board["failed"]) == 3 and len(board["tasks"]) == 2
    monkeypatch.setattr(KNN, "run", real)  # the bug fixed: a rerun completes the three cells
    assert zoo(cli_env) == 0
    board = leaderboard([cli_env / "runs"])
    assert board["failed"] == [] and len(board["tasks"]) == 3


def test_zero_shot_is_not_applicable_to_a_backbone_without_a_text_tower(cli_env):
    spec = RunSpec.of(
        tasks=("imagenet-knn", "zeroshot-imagenet"), backbones=("fake",), data="embedded"
    )
    results = list(run(spec))
    assert [r.status for r in results] == ["done", "not applicable"]
    assert "no text tower" in results[1].note


def test_the_leaderboard_equals_independent_computations(cli_env):
    zoo(cli_env)
    board = leaderboard([cli_env / "runs"], seed=3)
    frames = predictions(cli_env / "runs")
    for task in board["tasks"]:
        sign = -1 if task["higher_is_better"] else 1
        values = [c["value"] for c in task["cells"]]
        assert [c["rank"] for c in task["cells"]] == list(stats.rankdata(np.multiply(sign, values)))
        raw = []
        for pair in task["pairs"]:
            a, b = (frames[(task["task"].split(" · ")[0], name)] for name in (pair["a"], pair["b"]))
            if "correct" in a:
                only_a = int((a["correct"] & ~b["correct"]).sum())
                only_b = int((~a["correct"] & b["correct"]).sum())
                if only_a + only_b:
                    expected = stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
                    assert pair["p"] == pytest.approx(expected, rel=1e-9)
            raw.append(pair["p"])
        assert [p["p_holm"] for p in task["pairs"]] == pytest.approx(holm_by_hand(raw))
    ranks = {e["backbone"]: e["mean_rank"] for e in board["overall"]}
    per_task = [{c["backbone"]: c["rank"] for c in t["cells"]} for t in board["tasks"]]
    for name, mean_rank in ranks.items():
        assert mean_rank == pytest.approx(np.mean([t[name] for t in per_task]), abs=1e-3)


def predictions(folder: Path) -> dict:
    """(task, backbone label) → the per-image outputs, read independently of evalkit."""
    rows = [json.loads(x) for f in folder.glob("*.jsonl") for x in f.read_text().splitlines()]
    frames = {}
    for row in rows:
        label = row["backbone"] + (" [dim=16]" if row["backbone_options"].get("dim") else "")
        label += " (random init)" if row["random_init"] else ""
        slug = f"{row['task']}--{row['backbone']}--s{row['seed']}--{row['run_key']}"
        frames[(row["task"], label)] = pd.read_parquet(
            folder / "predictions" / (slug.replace("/", "_") + ".parquet")
        )
    return frames


def holm_by_hand(p: list[float]) -> list[float]:
    order = np.argsort(p, kind="stable")
    adjusted, running = np.ones(len(p)), 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - step) * p[i]))
        adjusted[i] = running
    return list(adjusted)


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (1, 0), (3, 9), (40, 21), (500, 560)])
def test_exact_mcnemar_is_scipys_binomial_test(only_a, only_b):
    both = 50
    a = np.array([True] * only_a + [False] * only_b + [True] * both)
    b = np.array([False] * only_a + [True] * only_b + [True] * both)
    expected = stats.binomtest(only_a, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
    assert mcnemar(a, b).p == pytest.approx(expected, rel=1e-9)
    assert binomial_two_sided(2, 4) == 1.0  # the middle of a symmetric test


def test_the_paired_bootstrap_interval_is_scipys():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, size=(300, 1))
    b = a - 0.2 + rng.normal(0, 0.3, size=(300, 1))
    ours = paired_bootstrap(a, b, lambda x: float(x.mean()), resamples=4000)
    theirs = stats.bootstrap(
        (a[:, 0], b[:, 0]),
        lambda x, y: x.mean() - y.mean(),
        paired=True,
        n_resamples=4000,
        method="percentile",
        random_state=1,
    ).confidence_interval
    assert ours.interval == pytest.approx((theirs.low, theirs.high), abs=0.01)
    assert ours.p < 0.01 and ours.difference == pytest.approx(float(a.mean() - b.mean()))


def test_holm_matches_the_step_down_rule():
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx(holm_by_hand(p))
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def planted(cli_env, flips: int) -> tuple[Path, Path]:
    """A baseline (fake on imagenet-linear, with per-image outputs) and a copy whose first
    ``flips`` right images are made wrong, its top-1 lowered to match."""
    base = cli_env / "base"
    argv = ["run", "--task", "imagenet-linear", "--backbone", "fake", "--data", "embedded"]
    assert main([*argv, "--out", str(base), "--save-predictions", "--quiet"]) == 0
    new = cli_env / f"new{flips}"
    shutil.copytree(base, new)
    (parquet,) = (new / "predictions").glob("*.parquet")
    frame = pd.read_parquet(parquet)
    right = frame.index[frame["correct"]][:flips]
    frame.loc[right, "correct"] = False
    frame.to_parquet(parquet, index=False)
    rows_file = new / "imagenet-linear.jsonl"
    rows = [json.loads(x) for x in rows_file.read_text().splitlines()]
    for row in rows:
        if row["metric"] == "top1":
            row["value"] -= 100.0 * flips / len(frame)
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return base, new


def test_compare_paired_passes_a_one_image_flip_and_fails_a_real_regression(
    cli_env, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "250")
    base, one = planted(cli_env, 1)
    tight = ["--tolerance", "0.1"]
    assert main(["compare", str(base), str(one), *tight]) == 1  # the tolerance alone fails it
    assert main(["compare", str(base), str(one), *tight, "--paired"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tolerance: regression" in out
    _, five = planted(cli_env, 19)  # 19 of 384 images: 4.9 points
    assert main(["compare", str(base), str(five), "--paired", "--tolerance", "10"]) == 1
    capsys.readouterr()
    # a drop-in within ±2, not ±1: with one flip in 384 images, flips could be 1.2% of all
    # images, so Tango's interval reaches +1.16 (the zero-width Wald interval said ±1)
    assert main(["compare", str(base), str(one), "--equivalent", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "equivalent within ±2" in out and "every metric equivalent within ±2" in out
    assert main(["compare", str(base), str(one), "--equivalent", "1"]) == 1
    capsys.readouterr()
    assert main(["compare", str(base), str(five), "--equivalent", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "not shown equivalent" in out and "right→wrong" not in out
    assert main(["compare", str(base), str(five), "--paired", "--tolerance", "10"]) == 1
    assert "19 right→wrong, 0 wrong→right" in " ".join(capsys.readouterr().out.split())


def test_the_leaderboard_page_stands_alone(cli_env, capsys):
    zoo(cli_env)
    for fmt in ("markdown", "json", "html"):
        out = cli_env / f"board.{fmt}"
        assert main(["leaderboard", "runs", "--format", fmt, "--output", str(out)]) == 0
    page = (cli_env / "board.html").read_text()
    checker = _Page()
    checker.feed(page)
    assert checker.svg and not checker.fetched, checker.fetched  # nothing from the network
    assert checker.open == [], f"unclosed elements {checker.open}"
    record = json.loads((cli_env / "board.json").read_text())
    assert [e["backbone"] for e in record["overall"]][-1] == "vit22b/test (random init)"
    assert "no significant difference" in (cli_env / "board.markdown").read_text()


def test_one_leaderboard_call_writes_every_format_from_one_computation(
    cli_env, capsys, monkeypatch
):
    """Several ``--output`` files, each in the format of its suffix, from one computation of
    the board; each the same text as that format asked for alone. A suffix that names no
    format is refused before any work."""
    import evalkit.publish.leaderboard as board_module

    zoo(cli_env)
    for fmt, suffix in (("markdown", "md"), ("json", "json"), ("html", "html")):
        args = ["leaderboard", "runs", "--format", fmt, "--output", str(cli_env / f"one.{suffix}")]
        assert main(args) == 0
    computed, real = [], board_module.leaderboard
    monkeypatch.setattr(
        board_module, "leaderboard", lambda *a, **k: computed.append(1) or real(*a, **k)
    )
    many = [a for s in ("md", "json", "html") for a in ("--output", str(cli_env / f"all.{s}"))]
    assert main(["leaderboard", "runs", *many]) == 0 and len(computed) == 1
    for suffix in ("md", "json", "html"):
        alone, together = (cli_env / f"{n}.{suffix}" for n in ("one", "all"))
        if suffix == "md":
            assert alone.read_text() == together.read_text()
        else:  # the time of making is in the JSON and the page
            assert _without_dates(alone.read_text()) == _without_dates(together.read_text())
    capsys.readouterr()
    assert main(["leaderboard", "runs", *many, "--output", str(cli_env / "x.txt")]) == 2
    assert "expected one of .md" in capsys.readouterr().err and len(computed) == 1


def test_a_single_leaderboard_output_is_written_in_the_format_its_suffix_names(cli_env, capsys):
    """``--output one.json`` alone holds JSON, not the terminal default's Markdown; a suffix
    that names no format, or a ``--format`` that contradicts it, is refused in one line."""
    zoo(cli_env)
    one = {suffix: cli_env / f"one.{suffix}" for suffix in ("json", "md", "html")}
    for path in one.values():
        assert main(["leaderboard", "runs", "--output", str(path)]) == 0
    assert json.loads(one["json"].read_text())["overall"]
    assert one["md"].read_text().lstrip().startswith(("#", "|"))
    assert one["html"].read_text().lstrip().lower().startswith("<!doctype html")
    capsys.readouterr()
    for refused in (["--output", "x.txt"], ["--format", "json", "--output", "x.markdown"]):
        assert main(["leaderboard", "runs", *refused]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and refused[-1] in err, err
    assert main(["leaderboard", "runs", "--format", "json", "--output", "x.txt"]) == 0
    assert json.loads((cli_env / "x.txt").read_text())["overall"]


def _without_dates(text: str) -> str:
    import re

    return re.sub(r"\d{4}-\d\d-\d\dT?[\d:.+Z ]*", "DATE", text)


class _Page(html.parser.HTMLParser):
    """Counts what a browser would fetch (src, href, url()) and checks elements close."""

    VOID = {"meta", "br", "img", "link", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.fetched, self.open, self.svg = [], [], False

    def handle_starttag(self, tag, attrs):
        self.svg |= tag == "svg"
        self.fetched += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in self.VOID and tag not in ("circle",):
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in ("circle",):
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        if "url(" in data:
            self.fetched.append(data)


def _recomputed(task: str, metric: str, frame: pd.DataFrame) -> float:
    """A metric from the per-image outputs alone, computed here."""
    if metric == "miou":
        inter, union = (np.stack(frame[c]).sum(0) for c in ("intersection", "union"))
        return 100 * float((inter[union > 0] / union[union > 0]).mean())
    if metric == "ece":
        bins = int(frame["bins"][0])
        index = np.minimum(np.ceil(frame["confidence"] * bins).astype(int) - 1, bins - 1)
        gap = np.bincount(index.clip(0), frame["correct"] - frame["confidence"], minlength=bins)
        return float(np.abs(gap).sum() / len(frame))
    if "correct_share" in frame:
        return 100 * float(frame["correct_share"].mean())
    if metric in frame:
        return float(frame[metric].mean())
    return 100 * float(frame["correct"].mean())


@pytest.mark.parametrize(
    "task,metric,settings",
    [
        ("imagenet-linear", "top1", ("l2_grid=0.1,0.01",)),
        ("imagenet-knn", "top1/k=20", ()),
        ("imagenet-5shot", "top1", ()),
        ("imagenet-ece", "ece", ("l2_grid=0.1",)),
        ("ade20k-1/16", "miou", ("steps=1", "image_size=32")),
        # depth: tests/test_dense.py recomputes MSE from its per-image outputs
        ("kinetics400", "top1", ("steps=2",)),
    ],
)
def test_per_image_outputs_recompute_every_familys_metric(
    cli_env, monkeypatch, task, metric, settings
):
    monkeypatch.setenv("EVALKIT_EMBEDDED_SCENES", "24,6")  # a small scene set: ADE20k's
    spec = RunSpec.of(
        tasks=(task,),
        backbones=("fake",),
        data="embedded",
        out="runs",
        save_predictions=True,
        overrides=settings,
    )
    (result,) = list(run(spec))
    (row,) = [r for r in result.rows if r["metric"] == metric]
    slug = f"{row['task']}--fake--s0--{row['run_key']}".replace("/", "_")
    frame = pd.read_parquet(cli_env / "runs" / "predictions" / f"{slug}.parquet")
    assert _recomputed(task, metric, frame) == pytest.approx(row["value"], rel=1e-9, abs=1e-12)
    assert main(["errors", "runs", "--task", task]) == 0  # every family's outputs read back


def test_every_per_image_kind_gets_its_paired_test():
    from evalkit.publish.board_pairs import paired_on

    rng = np.random.default_rng(1)
    n = 60

    def frames(**columns):
        return [pd.DataFrame({k: v[i] for k, v in columns.items()}) for i in (0, 1)]

    union = rng.integers(1, 50, size=(2, n, 4))
    inter = np.minimum(union, rng.integers(0, 50, size=(2, n, 4)))
    a, b = frames(intersection=[list(x) for x in inter], union=[list(x) for x in union])
    seg = paired_on("miou", a, b, seed=0, task="ade20k-1/16")
    expected = [100 * (i.sum(0) / u.sum(0)).mean() for i, u in zip(inter, union, strict=True)]
    assert seg.difference == pytest.approx(expected[0] - expected[1]) and seg.interval
    confidence = rng.uniform(0, 1, size=(2, n))
    correct = rng.uniform(0, 1, size=(2, n)) < confidence
    a, b = frames(confidence=confidence, correct=correct, bins=np.full((2, n), 15))
    ece = paired_on("ece", a, b, seed=0, task="imagenet-ece")
    assert ece.test.startswith("paired bootstrap") and 0 < ece.p <= 1
    a, b = frames(mse=rng.uniform(0, 1, size=(2, n)))
    depth = paired_on("mse", a, b, seed=0, task="waymo-depth-dpt")
    assert depth.difference == pytest.approx(a["mse"].mean() - b["mse"].mean())
    assert paired_on("abs_rel", a, b, seed=0, task="waymo-depth-dpt") == (
        "no paired test of abs_rel from these per-image outputs (none declared, or no column of it)"
    )


def test_a_zoo_on_slurm_is_one_array_task_per_cell(cli_env, capsys):
    argv = ["sweep", "--task", "suite:classification", "--backbone", "fake"]
    argv += ["--backbone", "vit22b/test", "--executor", "slurm", "--dry-run"]
    assert main(argv) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --array=0-13" in script  # 7 tasks × 2 backbones
    assert script.count("-m evalkit run") == 14 and "--task imagenet-25shot" in script
