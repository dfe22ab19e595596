"""``evalkit card``: the card's ``model-index`` parses with huggingface_hub's own ``ModelCard``
and ``model_index_to_eval_results`` and gives back every row (task, dataset, split, revision,
metric, value, seed, run key, provenance); one backbone per card; one entry per job however
often it was rerun; stand-in data named as such and refused by ``--push`` unless asked; no
absolute local path in the card or in what ``--push`` sends; ``--push`` needs a token."""

from __future__ import annotations

import pytest

import evalkit
from evalkit.cli import main


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_cache):
    out = tmp_path_factory.mktemp("card") / "rows"
    rows = evalkit.run(
        "imagenet-knn",
        "fake",
        data="embedded",
        seeds=(0, 1),
        out=out,
        cache_dir=data_cache,
        progress=False,
        overrides=["ks=1,20"],
    )
    return out, rows


def test_the_card_round_trips_every_row_through_huggingface_hub(results, tmp_path):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    out, rows = results
    card_path = tmp_path / "README.md"
    assert main(["card", str(out), "--model-id", "org/fake-vit", "--out", str(card_path)]) == 0
    card = ModelCard.load(card_path)
    name, parsed = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == "org/fake-vit"
    assert len(parsed) == len(rows) == 8  # 2 seeds × (top1, top5) × k = 1, 20
    found = {(r.task_name, r.metric_name, r.metric_args["seed"]): r for r in parsed}
    for row in rows:
        result = found[(row["task"], row["metric"], row["seed"])]
        assert result.metric_value == row["value"]
        assert result.task_type == "image-classification"
        assert result.dataset_type == "evalkit-stand-in/imagenet"  # never ImageNet's numbers
        assert "stand-in" in result.dataset_name and result.dataset_split == "val"
        assert result.dataset_revision == row["data_id"]["val"]
        assert result.metric_args["run_key"] == row["run_key"]
        assert result.metric_args["provenance"]["torch"] == row["provenance"]["torch"]
        assert result.verified is False
    assert [r.metric_value for r in card.data.eval_results] == [r.metric_value for r in parsed]
    assert "| imagenet-knn | imagenet stand-in" in card.text


def test_a_card_is_for_one_backbone(results, tmp_path, capsys):
    import shutil

    out, _ = results
    mixed = tmp_path / "mixed"
    shutil.copytree(out, mixed)
    rows_file = next(mixed.glob("*.jsonl"))
    rows_file.write_text(rows_file.read_text() + rows_file.read_text().replace('"fake"', '"other"'))
    assert (
        main(["card", str(mixed), "--model-id", "org/x", "--out", str(tmp_path / "other-card.txt")])
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "2 model setups ('fake (random init)', 'other (random init)')" in err
    assert (
        main(
            [
                "card",
                str(mixed),
                "--model-id",
                "org/x",
                "--out",
                str(tmp_path / "other-card.txt"),
                "--backbone",
                "other",
            ]
        )
        == 0
    )


def test_push_needs_a_token_and_uploads_the_card_when_there_is_one(
    results, tmp_path, monkeypatch, capsys
):
    from huggingface_hub import ModelCard

    out, _ = results
    args = [
        "card",
        str(out),
        "--model-id",
        "org/fake-vit",
        "--out",
        str(tmp_path / "card.txt"),
        "--push",
    ]
    pushed = []
    monkeypatch.setattr(
        ModelCard, "push_to_hub", lambda card, repo, **kw: pushed.append((repo, card)) or "url"
    )
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_test")
    assert main(args) == 2 and not pushed  # stand-in numbers are not published by default
    assert "--allow-stand-in" in capsys.readouterr().err
    args.append("--allow-stand-in")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    assert main(args) == 2 and "needs a Hugging Face token" in capsys.readouterr().err
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_test")
    assert main(args) == 0 and pushed[0][0] == "org/fake-vit"
    assert pushed[0][1].data.eval_results[0].task_name == "imagenet-knn"


def test_a_rerun_job_is_one_entry(results, tmp_path, data_cache):
    from huggingface_hub import ModelCard

    out, rows = results
    again = tmp_path / "again"
    import shutil

    shutil.copytree(out, again)
    for _ in range(2):  # --rerun appends the job's rows again each time
        evalkit.run(
            "imagenet-knn",
            "fake",
            data="embedded",
            seeds=(0,),
            out=again,
            cache_dir=data_cache,
            progress=False,
            overrides=["ks=1,20"],
            rerun=True,
        )
    card_path = tmp_path / "README.md"
    assert main(["card", str(again), "--model-id", "org/x", "--out", str(card_path)]) == 0
    assert len(ModelCard.load(card_path).data.eval_results) == len(rows) == 8


def test_no_absolute_local_path_reaches_the_card_or_the_hub(tmp_path, data_cache, monkeypatch):
    """A folder data set and a local checkpoint are named by their last path part only."""
    import json

    from huggingface_hub import ModelCard
    from PIL import Image

    flowers = tmp_path / "private" / "flowers"
    for split in ("train", "val"):
        for index, colour in enumerate(("red", "blue")):
            (flowers / split / colour).mkdir(parents=True)
            for i in range(3):
                pixel = (200 * (index == 0), 40 * i, 200 * (index == 1))
                Image.new("RGB", (16, 16), pixel).save(flowers / split / colour / f"{i}.png")
    out = tmp_path / "rows"
    evalkit.run(
        "imagenet-knn",
        "fake",
        out=out,
        cache_dir=data_cache,
        progress=False,
        overrides=[f"dataset=folder:{flowers}", "ks=1"],
    )
    (rows_file,) = out.glob("*.jsonl")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    checkpoint = tmp_path / "private" / "ckpt.safetensors"
    for row in rows:  # as a row of a backbone loaded with --weights PATH records it
        row["weights_source"] = f"local file {checkpoint}"
    rows_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_test")
    sent = []
    monkeypatch.setattr(ModelCard, "push_to_hub", lambda card, repo, **kw: sent.append(str(card)))
    card_path = tmp_path / "model-card.txt"
    args = ["card", str(out), "--model-id", "org/x", "--out", str(card_path), "--push"]
    assert main(args) == 0
    for text in (card_path.read_text(), sent[0]):
        assert str(tmp_path) not in text and "folder:flowers" in text
        assert "local file ckpt.safetensors" in text
