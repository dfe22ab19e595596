"""What a number belongs to, in every view: a setup (backbone, options, weights or random init)
has one label in the table, the leaderboard, compare, the card, the trackers and the zoo lines;
a task one setup lacks is missing in its own row; boards rank within one task and one dataset;
a gate refuses to compare nothing; the check before work covers every task of a command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.core.labels import setup_key, setup_labels
from evalkit.core.results import load_rows
from evalkit.core.runner import run
from evalkit.core.spec import RunSpec
from evalkit.core.tables import natural_order
from evalkit.errors import EvalkitError
from evalkit.publish.leaderboard import leaderboard

PLAIN, SMALL = "fake (random init)", "fake [img_size=64] (random init)"


@pytest.fixture(scope="module")
def two_setups(tmp_path_factory, data_cache):
    """The issue's first repro: plain ``fake`` ran the probe; ``fake [img_size=64]`` ran the
    probe and kNN, into one folder."""
    root = tmp_path_factory.mktemp("two-setups")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVALKIT_CACHE", str(data_cache))
        base = ["run", "--backbone", "fake", "--data", "embedded", "--out", str(root / "R")]
        assert main([*base, "--task", "imagenet-linear", "--quiet"]) == 0
        more = ["--task", "imagenet-linear", "--task", "imagenet-knn", "--quiet"]
        assert main([*base, *more, "--model-arg", "img_size=64"]) == 0
    return root / "R"


def values(folder: Path, task: str, metric: str) -> dict[str, float]:
    """Setup label → the value of ``task``'s ``metric``, read from the rows themselves."""
    rows = load_rows([folder])
    labels = setup_labels(rows)
    found = [r for r in rows if r["task"] == task and r["metric"] == metric]
    return {labels[setup_key(r)]: r["value"] for r in found}


def test_the_table_puts_each_setups_numbers_in_its_own_row(two_setups, capsys):
    assert main(["table", str(two_setups)]) == 0
    lines = {
        line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()
    }
    knn = values(two_setups, "imagenet-knn", "top1/k=20")
    assert list(knn) == [SMALL]
    cells = lines[PLAIN].split(" | ")
    assert cells[1:3] == ["–", "–"]  # plain fake never ran kNN
    assert f"{knn[SMALL]:.2f}" in lines[SMALL].split(" | ")[1]


def test_the_leaderboard_names_each_setup_once_with_what_it_lacks(two_setups):
    board = leaderboard([two_setups])
    overall = {e["backbone"]: e for e in board["overall"]}
    assert set(overall) == {PLAIN, SMALL}
    assert overall[SMALL]["missing"] == [] and overall[SMALL]["tasks"] == 2
    assert overall[PLAIN]["missing"] == ["imagenet-knn · imagenet (stand-in)"]
    assert overall[PLAIN]["mean_rank"] is None  # one task cannot rank overall
    knn = next(t for t in board["tasks"] if t["task"].startswith("imagenet-knn"))
    assert [c["backbone"] for c in knn["cells"]] == [SMALL]


def test_a_leaderboard_over_two_datasets_ranks_within_each(two_setups, data_cache, tmp_path):
    """The stand-in's own folder read as a folder of one's own is another dataset: its board
    stands apart, it is not labelled a stand-in, and each setup appears once overall."""
    out = tmp_path / "R"
    for row_file in two_setups.glob("*.jsonl"):
        (tmp_path / "R").mkdir(exist_ok=True)
        (out / row_file.name).write_text(row_file.read_text())
    from evalkit.data import DataConfig
    from evalkit.data.resolve import data_kind, dataset_root

    imagenet = dataset_root(data_kind("imagenet"), DataConfig(source="embedded", cache=data_cache))
    spec = RunSpec.of(
        tasks=("imagenet-linear",),
        backbones=("fake",),
        data="embedded",
        out=out,
        overrides=(f"dataset=folder:{imagenet}",),
        progress=False,
    )
    (result,) = list(run(spec))
    assert result.rows[0]["dataset"]["stand_in"] is False
    board = leaderboard([out])
    names = [t["task"] for t in board["tasks"]]
    assert names[0] == "imagenet-knn · imagenet (stand-in)" and len(names) == 3
    assert f"imagenet-linear · folder:{imagenet}" in names
    assert sorted(e["backbone"] for e in board["overall"]) == [PLAIN, SMALL]
    for task in board["tasks"]:
        labels = [c["backbone"] for c in task["cells"]]
        assert len(labels) == len(set(labels))


def test_compare_against_an_empty_baseline_fails(two_setups, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(empty), str(two_setups)]) == 2
    assert "holds no result rows" in capsys.readouterr().err
    assert main(["compare", str(empty), str(two_setups), "--paired"]) == 2
    assert main(["compare", str(empty), str(two_setups), "--allow-new"]) == 0
    other = tmp_path / "other.jsonl"  # rows that match nothing of the baseline
    rows = [json.loads(x) for x in (two_setups / "imagenet-knn.jsonl").read_text().splitlines()]
    other.write_text("".join(json.dumps(r | {"task": "imagenet-5shot"}) + "\n" for r in rows))
    assert main(["compare", str(two_setups / "imagenet-knn.jsonl"), str(other)]) == 2
    assert "no row of" in capsys.readouterr().err


def test_compare_names_each_setup(two_setups, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["compare", str(two_setups), str(two_setups)]) == 0
    out = capsys.readouterr().out  # not a terminal: laid out wide, no word broken
    assert PLAIN in out and SMALL in out and "image│net" not in out


def test_the_card_names_each_setup(two_setups, tmp_path):
    from evalkit.publish.card import card_rows, card_text

    with pytest.raises(EvalkitError, match="--backbone fake names 2 model setups"):
        card_rows(two_setups, "fake")  # a card is for one model
    for label in (PLAIN, SMALL):
        text = card_text(card_rows(two_setups, label), "org/fake")
        top1 = [x for x in text.splitlines() if "imagenet-linear" in x and "top1" in x]
        assert len(top1) == 1, text
    doubled = tmp_path / "doubled"
    doubled.mkdir()
    lines = (two_setups / "imagenet-knn.jsonl").read_text().splitlines()
    changed = [json.loads(x) | {"config_hash": "other", "run_key": "other"} for x in lines]
    (doubled / "knn.jsonl").write_text("\n".join([*lines, *map(json.dumps, changed)]) + "\n")
    with pytest.raises(EvalkitError, match="under different settings"):
        card_rows(doubled, "fake")


def val_only(tmp_path: Path, classes, monkeypatch):
    """An ImageNet folder with a val split only (one image a class), and a runner that fails
    the test if it builds a backbone (the data must be checked first)."""
    from PIL import Image

    import evalkit.core.runner as runner

    for name in classes:
        folder = tmp_path / "data" / "imagenet" / "val" / name
        folder.mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(folder / "0.png")

    def built(*_):
        raise AssertionError("a backbone was built before the data was checked")

    monkeypatch.setattr(runner, "load_backbone", built)


def test_the_check_before_work_covers_every_task_whatever_their_order(tmp_path, monkeypatch):
    """A folder with no train split fails a suite that ends with a zero-shot task (which reads
    val only) before any backbone is built; so do settings the data cannot serve."""
    val_only(tmp_path, ("a", "b"), monkeypatch)
    spec = RunSpec.of(
        tasks=("zeroshot-imagenet", "imagenet-knn"),
        backbones=("fake",),
        data_dir=tmp_path / "data",
        out=tmp_path / "R",
    )
    with pytest.raises(EvalkitError, match="imagenet/train"):
        list(run(spec))
    too_many = RunSpec.of(
        tasks=("imagenet-linear", "imagenet-knn[ks=100000]"),
        backbones=("fake",),
        data="embedded",
        out=tmp_path / "R",
    )
    with pytest.raises(EvalkitError, match="k can be at most"):
        list(run(too_many))


def test_the_check_before_work_reads_what_an_earlier_task_reads(tmp_path, monkeypatch):
    """A suite whose last task (zero-shot: val only) reads less than an earlier one (kNN:
    train and val) still has the earlier task's missing train split found before any
    backbone is built: the check reads every task's splits, not the last one's."""
    val_only(tmp_path, ("a",), monkeypatch)
    spec = RunSpec.of(
        tasks=("imagenet-knn", "zeroshot-imagenet"),
        backbones=("fake",),
        data_dir=tmp_path / "data",
        out=tmp_path / "R",
    )
    with pytest.raises(EvalkitError, match="imagenet/train"):
        list(run(spec))


def test_a_leaderboard_finds_per_image_outputs_however_deep(cli_env):
    zoo = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--backbone", "vit22b/test"]
    zoo += ["--random-init", "--data", "embedded", "--out", "all/day1/zoo", "--quiet"]
    assert main(zoo) == 0
    (task,) = leaderboard([cli_env / "all"])["tasks"]
    (pair,) = task["pairs"]
    assert "p_holm" in pair, pair["verdict"]


def test_zoo_lines_name_the_setup(cli_env, capsys):
    (cli_env / "zoo.toml").write_text(
        '[[backbone]]\nname = "fake"\n\n[[backbone]]\nname = "fake"\nmodel_args = { dim = 16 }\n'
    )
    argv = ["run", "--zoo", "zoo.toml", "--task", "imagenet-knn", "--data", "embedded"]
    assert main([*argv, "--quiet"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    assert "× fake (random init) (seed 0)" in lines[0]
    assert "× fake [dim=16] (random init) (seed 0)" in lines[1]


def test_the_closing_table_and_the_failed_cells_name_each_setup(dims_zoo, capsys, monkeypatch):
    from evalkit.tasks.knn import KNN

    argv = dims_zoo
    assert main([*argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("│ imagenet-knn")]
    assert sum("fake [dim=64] (random init)" in line for line in table) == 2  # top-1, top-5
    assert sum("fake [dim=128] (random init)" in line for line in table) == 2

    def broken(self, backbone, ctx):
        raise RuntimeError("a bug in one cell")

    monkeypatch.setattr(KNN, "run", broken)
    assert main([*argv, "--quiet", "--rerun"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "imagenet-knn × fake [dim=64] (random init) (seed 0): RuntimeError" in out
    assert "imagenet-knn × fake [dim=128] (random init) (seed 0): RuntimeError" in out


@pytest.mark.parametrize(
    "entry,says",
    [
        ('model_args = "img_size=64"', "model_args = 'img_size=64'; expected a table"),
        ("weights = 3", "weights = 3; expected a checkpoint path"),
        ('pretrained = "yes"', "pretrained = 'yes'; expected true or false"),
    ],
)
def test_a_malformed_zoo_value_is_one_line(cli_env, capsys, entry, says):
    (cli_env / "zoo.toml").write_text(f'[[backbone]]\nname = "fake"\n{entry}\n')
    assert main(["run", "--zoo", "zoo.toml", "--task", "imagenet-knn", "--data", "embedded"]) == 2
    err = capsys.readouterr().err
    assert says in " ".join(err.split()) and "Traceback" not in err


def test_plan_states_a_time_that_follows_from_its_ranks_and_rates(capsys):
    argv = ["plan", "--task", "imagenet-linear", "--backbone", "vit22b"]
    assert main([*argv, "--target", "8xA100-80GB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ranks: 8 on 1 host(s)" in out
    images = sum(int(n.replace(",", "")) for n in re.findall(r"(?:train|val) ([\d,]+)", out))
    rate = float(re.search(r"([\d,.]+) img/s over 8 data-parallel ranks", out)[1].replace(",", ""))
    hours, minutes = map(int, re.search(r"about (\d+) h (\d+) min", out).groups())
    assert hours + minutes / 60 == pytest.approx(images / rate / 3600, rel=0.02)


def test_rerun_replaces_a_jobs_rows(cli_env):
    argv = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded", "--quiet"]
    assert main(argv) == 0
    rows_file = cli_env / "results" / "runs" / "imagenet-knn.jsonl"
    first = rows_file.read_text().splitlines()
    assert main([*argv, "--rerun"]) == 0
    again = rows_file.read_text().splitlines()
    assert len(again) == len(first) == 2
    assert [json.loads(x)["value"] for x in again] == [json.loads(x)["value"] for x in first]


@pytest.mark.parametrize(
    "options,says",
    [
        ({"weights": "w.safetensors", "backbones": ("fake", "vit22b/test")}, "several backbones"),
        ({"weights": "w.safetensors", "pretrained": True}, "--pretrained and --weights"),
        ({"data_dir": Path("/data"), "data": "embedded"}, "--data-dir is not read"),
    ],
)
def test_options_that_cannot_hold_together_are_refused_up_front(options, says):
    spec = {"tasks": ("imagenet-knn",), "backbones": ("fake",)} | options
    with pytest.raises(EvalkitError, match=says):
        RunSpec.of(**spec)


def test_boards_and_columns_read_numbers_as_numbers():
    names = ["imagenet-25shot", "imagenet-10shot", "imagenet-1shot", "imagenet-5shot"]
    assert sorted(names, key=natural_order) == [
        "imagenet-1shot",
        "imagenet-5shot",
        "imagenet-10shot",
        "imagenet-25shot",
    ]


def test_the_ranks_figure_has_a_legend_and_an_axis_title(two_setups):
    from evalkit.publish.rendering import page

    html = page(leaderboard([two_setups]))
    assert "rank (1 is best)" in html and "mean rank (complete setups)" in html


def test_ls_tasks_has_no_empty_column(capsys):
    assert main(["ls", "tasks"]) == 0
    header = next(x for x in capsys.readouterr().out.splitlines() if "name" in x)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == ["name", "what"]


def test_the_seed_help_says_what_the_runner_does(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "from each run's own seed" in " ".join(capsys.readouterr().out.split())


def test_an_empty_leaderboard_answers_before_the_heavy_imports(tmp_path):
    code = (
        "import sys; from evalkit.cli import main; code = main(['leaderboard', sys.argv[1]]); "
        "print(code, 'evalkit.publish.leaderboard' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True)
    assert out.stdout.decode().split() == ["2", "False", "False"]
    assert b"no result rows" in out.stderr


def test_a_timm_backbones_feature_key_names_no_open_clip():
    from evalkit.cache.keys import FORMAT_VERSION
    from evalkit.storage.identity import library_versions

    assert set(library_versions("timm/vit_tiny_patch16_224")) == {"torch", "timm"}
    assert set(library_versions("vit22b/test")) == {"torch"}
    assert "open_clip_torch" in library_versions("open_clip/ViT-B-32")
    assert FORMAT_VERSION == 4  # entries keyed with every library are not read as these


def label_row(dataset: str, **settings) -> dict:
    """A kNN row of plain ``fake`` on ``dataset`` with ``settings`` changed from the defaults."""
    from evalkit.core.catalog import resolve_task
    from evalkit.storage.identity import spec_key

    config = json.loads(json.dumps(resolve_task("imagenet-knn").config(), default=list))
    config |= {"dataset": dataset.split(" ")[0], **settings}
    return {
        "task": "imagenet-knn",
        "backbone": "fake",
        "backbone_options": {},
        "random_init": True,
        "config": config,
        "config_hash": spec_key(config, length=16),
        "dataset": {"name": dataset.split(" ")[0], "stand_in": dataset.endswith("(stand-in)")},
        "metric": "top1/k=20",
        "value": 20.0,
        "seed": 0,
    }


def test_a_setups_default_run_has_one_label_whatever_its_siblings(tmp_path, capsys):
    """Plain fake on the stand-in and on a folder, and fake with pool=mean on the stand-in:
    the plain runs share one label (one table row holding both cells); the other is named by
    the setting it changed."""
    from evalkit.core.labels import repeat_labels

    rows = [
        label_row("imagenet (stand-in)"),
        label_row("folder:/data/own"),
        label_row("imagenet (stand-in)", pool="mean"),
    ]
    labels = sorted(repeat_labels(rows).values())
    assert labels == [PLAIN, PLAIN, "fake [pool=mean] (random init)"]
    alone = repeat_labels(rows[:2])  # without the sibling: the same labels
    assert sorted(alone.values()) == [PLAIN, PLAIN]
    old = {**rows[0], "config": {**rows[0]["config"], "old_setting": True}}  # since removed
    old["config_hash"] = "an-older-one"
    labels = list(repeat_labels([old, rows[0]]).values())
    assert len(set(labels)) == 2 and not any("old_setting" in label for label in labels)
    (tmp_path / "imagenet-knn.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["table", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fake")]
    plain = next(line for line in lines if line.startswith(f"| {PLAIN} |"))
    assert plain.count("20.00") == 2 and len(lines) == 2


def test_errors_heads_each_block_by_its_setup_and_takes_the_printed_label(dims_zoo, capsys):
    argv = dims_zoo
    assert main([*argv, "--quiet", "--save-predictions", "--out", "R"]) == 0
    capsys.readouterr()
    assert main(["errors", "R", "--task", "imagenet-knn", "--top", "1"]) == 0
    heads = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fake")]
    assert heads == [
        "fake [dim=64] (random init) on imagenet (stand-in), seed 0: 384 images",
        "fake [dim=128] (random init) on imagenet (stand-in), seed 0: 384 images",
    ]
    picked = ["errors", "R", "--task", "imagenet-knn", "--backbone", "fake [dim=64] (random init)"]
    assert main(picked) == 0
    heads = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fake")]
    assert heads == ["fake [dim=64] (random init) on imagenet (stand-in), seed 0: 384 images"]
    assert main([*picked[:-1], "fake [dim=32]"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "expected a backbone or one of the setups 'fake [dim=128] (random init)'" in err


def test_few_shot_errors_show_files_and_class_names(cli_env, capsys):
    argv = ["run", "--task", "imagenet-1shot", "--backbone", "fake", "--data", "embedded"]
    assert main([*argv, "--quiet", "--save-predictions", "--out", "R"]) == 0
    capsys.readouterr()
    assert main(["errors", "R", "--task", "imagenet-1shot", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert ".png" in out and "label_name" in out
    assert re.search(
        r"│ (circle|square|triangle|cross)-\w+-\w+ ", out
    )  # a class name, not a number
