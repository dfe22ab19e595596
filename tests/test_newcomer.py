"""What a newcomer meets first: settings the data cannot serve and inputs that cannot work are
one-line errors before any work; wide images are scaled, not clipped; `ls` lists what errors
point to; tables say which data a number is on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from evalkit.cli import main


def _run(cache, *args):
    return main(
        [
            "run",
            "--backbone",
            "fake",
            "--data",
            "embedded",
            "--quiet",
            "--cache-dir",
            str(cache),
            *args,
        ]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--task", "imagenet-5shot", "--set", "shots=41"],
            "class 'circle-blue-solid' has 40 training images, fewer than shots=41",
        ),
        (
            ["--task", "imagenet-knn", "--set", "ks=100000"],
            "the training split has 960 images, so k can be at most 960",
        ),
        (["--task", "imagenet-knn", "--set", "ks=5,5"], "distinct positive whole numbers"),
        (["--task", "imagenet-linear", "--set", "l2_grid=inf"], "expected a finite number"),
        (
            ["--task", "imagenet-linear", "--set", "holdout=0.99"],
            "would hold out all 40 training images of class 'circle-blue-solid'",
        ),
        (
            ["--task", "imagenet-linear", "--seed", "99999999999999999999"],
            "expected a whole number in 0",
        ),
        (
            ["--task", "imagenet-linear", "--set", "zz=1"],
            "run `evalkit ls settings imagenet-linear`",
        ),
    ],
)
def test_settings_the_data_cannot_serve_are_refused_before_work(cli_env, capsys, args, message):
    cache = cli_env / "cache"
    assert _run(cache, *args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err and err.count("error:") == 1
    assert not (cache / "features").exists()  # nothing was extracted


def test_unusable_output_and_cache_folders_are_refused_before_work(cli_env, capsys):
    (cli_env / "a-file").write_text("x")
    assert _run(cli_env / "c", "--task", "imagenet-linear", "--out", "a-file") == 2
    assert "--out a-file is a file: expected a folder" in capsys.readouterr().err
    assert _run("/proc/evalkit-cache", "--task", "imagenet-linear") == 2
    assert "--cache-dir /proc/evalkit-cache is not a writable folder" in capsys.readouterr().err
    assert main(["table", "/nonexistent"]) == 2
    assert "no such file or folder: /nonexistent" in capsys.readouterr().err


def test_a_16_bit_image_is_scaled_not_clipped(tmp_path):
    from evalkit.data.folder import load_rgb

    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "wide.png")  # 16-bit greyscale PNG
    with Image.open(tmp_path / "wide.png") as opened:
        assert opened.mode.startswith("I")
    rgb = np.asarray(load_rgb(tmp_path / "wide.png"))
    expected = np.rint(ramp.astype(np.float64) * 255 / 65535)
    assert rgb.shape == (64, 64, 3) and np.array_equal(rgb[..., 0], expected)
    assert (rgb == 255).mean() < 0.01  # PIL's own conversion makes 99% of it white


def test_ls_lists_what_errors_point_to(capsys):
    assert main(["ls", "settings", "imagenet-5shot"]) == 0
    out = capsys.readouterr().out
    assert "shots" in out and "a positive number" in out
    assert main(["ls", "datasets"]) == 0
    out = capsys.readouterr().out
    assert "ade20k" in out and "folder:PATH" in out
    assert main(["ls", "models", "timm", "resnet1*"]) == 0
    assert "timm/resnet18" in capsys.readouterr().out
    assert main(["ls", "models", "open_clip", "ViT-B-32"]) == 0
    assert "open_clip/ViT-B-32  tags: openai" in capsys.readouterr().out
    assert main(["ls", "settings"]) == 2


def test_ls_models_takes_a_plain_name_as_a_part_of_the_name(capsys):
    """``vit_tiny`` (no glob characters) finds every model whose name holds it, as
    ``'*vit_tiny*'`` does; a glob keeps its own meaning."""
    assert main(["ls", "models", "timm", "vit_tiny"]) == 0
    plain = capsys.readouterr().out
    assert "timm/vit_tiny_patch16_224" in plain and "\n0 models" not in plain
    assert main(["ls", "models", "timm", "*vit_tiny*"]) == 0
    assert capsys.readouterr().out == plain
    assert "resnet" not in plain
    assert main(["ls", "models", "timm", "resnet1?"]) == 0
    assert "timm/resnet18\n" in capsys.readouterr().out


def test_own_data_is_named_and_never_beside_the_papers_number(cli_env, capsys):
    from evalkit.core.runner import resolve_task

    (cli_env / "rows").mkdir()
    with (cli_env / "rows" / "imagenet-linear.jsonl").open("w") as f:
        for dataset, value in (("imagenet", 50.0), ("folder:/data/flowers", 70.0)):
            config = resolve_task("imagenet-linear", (f"dataset={dataset}",)).config()
            row = {
                "task": "imagenet-linear",
                "backbone": "timm/x",
                "weights_id": "sha256:a",
                "metric": "top1",
                "value": value,
                "config": config,
                "config_hash": dataset,
                "seed": 0,
                "higher_is_better": True,
            }
            f.write(json.dumps(row) + "\n")
    assert main(["table", str(cli_env / "rows")]) == 0
    out = capsys.readouterr().out
    header, *_ = [line for line in out.splitlines() if line.startswith("| backbone")]
    assert "imagenet-linear on folder:/data/flowers top1" in header
    paper = [line for line in out.splitlines() if line.startswith("| paper: ViT-22B")][0]
    cells = dict(zip(header.split("|"), paper.split("|"), strict=True))
    assert cells[" imagenet-linear on folder:/data/flowers top1 ↑ "].strip() == "–"
    assert cells[" imagenet-linear top1 ↑ "].strip() == "89.51"


def test_the_papers_numbers_never_sit_in_a_stand_in_column(cli_env, capsys):
    """Rows measured on the embedded stand-in carry the paper's numbers (measured on the real
    set): the table keeps those out of the stand-in's column, shows them beside the real
    run's, and its legend says why the stand-in column has none."""
    from evalkit.core.runner import resolve_task

    (cli_env / "rows").mkdir()
    config = resolve_task("imagenet-linear").config()
    with (cli_env / "rows" / "imagenet-linear.jsonl").open("w") as f:
        for stand_in, value in ((True, 24.2), (False, 80.0)):
            row = {
                "task": "imagenet-linear",
                "backbone": "timm/x",
                "weights_id": "sha256:a",
                "metric": "top1",
                "value": value,
                "config": config,
                "config_hash": "c",
                "dataset": {"name": "imagenet", "own": True, "stand_in": stand_in},
                "paper": {"ViT-22B": 89.51},
                "seed": 0,
                "higher_is_better": True,
            }
            f.write(json.dumps(row) + "\n")
    assert main(["table", str(cli_env / "rows")]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| backbone"))
    paper = next(line for line in out.splitlines() if line.startswith("| paper: ViT-22B"))
    cells = dict(zip(header.split("|"), paper.split("|"), strict=True))
    assert cells[" imagenet-linear (stand-in) top1 ↑ "].strip() == "–"
    assert cells[" imagenet-linear top1 ↑ "].strip() == "89.51"
    assert "(stand-in): measured on evalkit's embedded stand-in images, not the real set" in out


def test_a_pickled_checkpoint_is_one_line_without_torchs_advice(tmp_path):
    import argparse

    import torch

    from evalkit.errors import EvalkitError
    from evalkit.storage.checkpoints import read_state_dict

    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=1)}, tmp_path / "p.pt")
    with pytest.raises(EvalkitError) as caught:
        read_state_dict(tmp_path / "p.pt")
    text = str(caught.value)
    assert "argparse.Namespace" in text and "weights_only" not in text and "\n" not in text


def test_a_resumed_row_counts_only_the_images_it_extracted(cli_env):
    from safetensors import safe_open

    cache = cli_env / "cache"
    assert _run(cache, "--task", "imagenet-knn", "--out", "one") == 0
    [victim, *_] = sorted((cache / "features").glob("*/shard-*.safetensors"))
    with safe_open(str(victim), framework="pt") as f:
        lost = len(f.get_tensor("labels"))
    victim.unlink()
    assert _run(cache, "--task", "imagenet-knn", "--out", "two") == 0
    rows = [json.loads(line) for line in (cli_env / "two" / "imagenet-knn.jsonl").open()]
    assert {r["provenance"]["images_extracted"] for r in rows} == {lost}


def test_the_run_table_has_no_empty_column(cli_env, capsys):
    assert _run(cli_env / "cache", "--task", "imagenet-knn") == 0
    out = capsys.readouterr().out
    assert "note" not in out and "││" not in out.replace(" ", "")
    assert _run(cli_env / "cache", "--task", "imagenet-knn") == 0
    assert "note" in capsys.readouterr().out  # now a row was skipped: the note says so


def test_a_full_disk_anywhere_is_one_line(capsys, monkeypatch):
    import errno

    from evalkit import cli

    def fill_up(args, console):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out/x.json")

    monkeypatch.setitem(cli.COMMANDS, "table", (cli.COMMANDS["table"][0], fill_up))
    assert main(["table", "anything"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (
        "error: no space left on the device writing /data/out/x.json: free space (or write "
        "elsewhere) and rerun; finished work is kept"
    )
