"""Zero-shot classification and LiT: prompts, class embeddings against open_clip, the
contrastive losses against direct formulas, label spaces (ObjectNet scoring), image–text
readers in their real layouts, and LiT end to end on embedded data."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import pytest
import torch
from PIL import Image

from evalkit.data.shifted import LabelSpace, folder_space, numbered_space
from evalkit.errors import EvalkitError
from evalkit.heads.zeroshot import (
    Prompting,
    canonicalize,
    class_embeddings,
    label_space_hits,
    prompts,
    templates,
)

# --- prompts ---------------------------------------------------------------------------


def test_template_sets_have_their_published_sizes():
    assert [len(templates(n)) for n in ("clip_paper", "clip_best", "class_name_only")] == [81, 8, 1]
    assert templates("clip_paper")[0] == "a bad photo of a {}"  # punctuation gone, slot kept


def test_canonicalize_keeps_only_what_it_is_told():
    assert canonicalize("Great_White  Shark!") == "great white shark"
    assert canonicalize("a photo of a {}.", keep="{}") == "a photo of a {}"
    assert canonicalize("tiger cat, Felis", keep=",") == "tiger cat, felis"


def test_prompts_cover_every_alias_and_template():
    assert prompts("Maillot, tank suit", ["a {}", "{}"]) == [
        "a maillot",
        "a tank suit",
        "maillot",
        "tank suit",
    ]
    assert prompts("Maillot, tank suit", ["{}"], first_alias=True) == ["maillot"]


def test_open_clip_towers_are_scored_with_clip_benchmarks_exact_prompts(
    tiny_clip_registered, tmp_path
):
    """The classifier a zero-shot run builds for an open_clip tower (every setting at its
    default) equals open_clip's own ``build_zero_shot_classifier`` on open_clip's own ImageNet
    class names and OpenAI's 80 templates, as CLIP_benchmark builds it: all 80,000 prompts
    character for character, and the class embeddings."""
    open_clip = pytest.importorskip("open_clip")
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    from evalkit import load_backbone
    from evalkit.core.runner import resolve_task
    from evalkit.data.shifted import reference_classes

    backbone = load_backbone("open_clip/Tiny-Test")
    names = list(reference_classes(tmp_path).values())  # the ImageNet names evalkit ships
    task = resolve_task("zeroshot-imagenet")
    prompting = task.prompting(backbone.text, names)
    ours = [prompts(n, list(prompting.templates), style=prompting.style) for n in names]
    theirs = [[template(n) for template in OPENAI_IMAGENET_TEMPLATES] for n in IMAGENET_CLASSNAMES]
    assert ours == theirs and sum(map(len, ours)) == 80_000
    assert task.chosen_templates(backbone.text) == "openai" and prompting.style == "verbatim"
    subset = dataclasses.replace(prompting, names=prompting.names[::25])  # 40 classes
    embeddings = class_embeddings(backbone.text, subset)
    reference = open_clip.build_zero_shot_classifier(
        backbone.model,
        backbone.text.tokenizer,
        IMAGENET_CLASSNAMES[::25],
        OPENAI_IMAGENET_TEMPLATES,
        num_classes_per_batch=10,
        use_tqdm=False,
    )
    torch.testing.assert_close(embeddings, reference.T, atol=1e-5, rtol=1e-5)


def test_lit_towers_keep_big_visions_canonical_prompts():
    from evalkit.core.runner import resolve_task
    from evalkit.heads.text import LitModel, LitText, TowerConfig

    tower = LitText(LitModel(TowerConfig(width=32, layers=1, heads=2, context=16, embed_dim=8)))
    prompting = resolve_task("zeroshot-imagenet").prompting(tower, ["Kite (bird of prey)"])
    assert prompting.style == "canonical" and len(prompting.templates) == 81
    assert prompts("Kite (bird of prey)", list(prompting.templates), style="canonical")[0] == (
        "a bad photo of a kite bird of prey"
    )
    forced = resolve_task("zeroshot-imagenet", ["prompts=verbatim"]).prompting(tower, ["Kite (x)"])
    assert forced.style == "verbatim" and forced.templates[0] == "a bad photo of a {}."


def test_class_embeddings_normalise_each_prompt_before_the_mean():
    """A tower whose embeddings differ in length: each prompt counts alike (normalised, then
    averaged, then normalised again), as CLIP's zero-shot classifier does."""

    class Tower:
        def tokenize(self, texts):
            return torch.tensor([[float(len(t))] for t in texts])

        def encode(self, tokens):  # "a" → (10, 0); "a long one" → (0, 1)
            return torch.where(tokens < 5, torch.tensor([10.0, 0.0]), torch.tensor([0.0, 1.0]))

    embedding = class_embeddings(Tower(), Prompting(("x",), ("{}", "{} long one")))
    expected = torch.tensor([[1.0, 1.0]]) / 2**0.5  # mean of (1, 0) and (0, 1), normalised
    torch.testing.assert_close(embedding, expected)


# --- losses ----------------------------------------------------------------------------


def _pairs(n=5, dim=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    norm = torch.nn.functional.normalize
    return norm(torch.randn(n, dim, generator=gen), dim=-1), norm(
        torch.randn(n, dim, generator=gen), dim=-1
    )


def test_softmax_loss_and_gradient_equal_the_direct_formula():
    from evalkit.heads.text import contrastive_loss

    images, texts = _pairs()
    images.requires_grad_(True)
    log_t = torch.tensor(math.log(10.0))
    loss = contrastive_loss(images, texts, log_t, None)
    loss.backward()
    logits = 10.0 * images.detach() @ texts.T
    n = len(logits)
    direct = (
        -sum(
            0.5 * (torch.log_softmax(logits[i], 0)[i] + torch.log_softmax(logits[:, i], 0)[i])
            for i in range(n)
        )
        / n
    )
    torch.testing.assert_close(loss.detach(), direct)
    eye = torch.eye(n)
    d_logits = (logits.softmax(1) - eye) / (2 * n) + (logits.softmax(0) - eye) / (2 * n)
    torch.testing.assert_close(images.grad, 10.0 * d_logits @ texts)


def test_sigmoid_loss_equals_the_direct_formula():
    from evalkit.heads.text import contrastive_loss

    images, texts = _pairs(n=3)
    log_t, bias = torch.tensor(math.log(10.0)), torch.tensor(-2.71)
    loss = contrastive_loss(images, texts, log_t, bias, kind="sigmoid")
    direct = 0.0
    for i in range(3):
        for j in range(3):
            z = 10.0 * float(images[i] @ texts[j]) - 2.71
            direct -= math.log(1 / (1 + math.exp(-z if i == j else z)))
    assert loss.item() == pytest.approx(direct / 3, rel=1e-5)


# --- label spaces and scoring ----------------------------------------------------------


def test_objectnet_scoring_on_a_hand_made_case():
    # Reference classes 0..4; ObjectNet class 0 maps to {1, 2}, class 1 to {4}; 3 is unmapped.
    names = ("a", "b", "c", "d", "e")
    space = LabelSpace(names, names, ((1, 2), (4,)), candidates=(1, 2, 4))
    scores = torch.tensor(
        [
            [0.0, 0.1, 0.9, 0.0, 0.2],  # 2 ∈ {1,2}: right
            [0.0, 0.9, 0.1, 0.0, 0.2],  # 1 ∈ {1,2}: right
            [0.0, 0.1, 0.2, 0.9, 0.5],  # 3 is not a candidate: argmax among candidates is 4: right
            [0.9, 0.3, 0.1, 0.0, 0.2],  # 0 is not a candidate: 1 ∉ {4}: wrong
        ]
    )
    labels = torch.tensor([0, 0, 1, 1])
    assert label_space_hits(scores, labels, space, 1).tolist() == [True, True, True, False]
    assert label_space_hits(scores, labels, space, 3).tolist() == [True, True, True, True]


def test_folder_and_numbered_label_spaces():
    reference = {"n1": "tench", "n2": "goldfish", "n3": "shark"}
    subset = folder_space(["n3", "n1"], reference, restrict=True)  # ImageNet-R and -A
    assert subset.correct == ((2,), (0,)) and subset.candidates == (0, 2)
    partial_val = folder_space(["n3", "n1"], reference)  # ImageNet val: every class a candidate
    assert partial_val.correct == ((2,), (0,)) and partial_val.candidates is None
    assert folder_space(["n1", "n2", "n3"], reference).candidates is None
    own = folder_space(["red_fox", "cat"], reference)  # a set of one's own: its folder names
    assert own.names == ("red fox", "cat") and own.correct == ((0,), (1,))
    with pytest.raises(EvalkitError, match="not in the reference"):
        folder_space(["n1", "zebra"], reference)
    assert numbered_space(["2", "0"], reference).correct == ((2,), (0,))
    with pytest.raises(EvalkitError, match="class indices"):
        numbered_space(["7"], reference)


def test_a_label_space_over_a_probes_training_classes():
    reference = {"n1": "tench", "n2": "goldfish", "n3": "shark"}
    space = LabelSpace(("n1", "n2", "n3"), tuple(reference.values()), ((0, 1), (2,)), (0, 1, 2))
    over = space.over(["n3", "n1"])  # the probe never saw n2
    assert over.correct == ((1,), (0,)) and over.candidates == (0, 1)
    with pytest.raises(EvalkitError, match="none of the 2 training classes"):
        space.over(["cat", "dog"])


def test_embedded_objectnet_maps_each_class_to_two_and_drops_unmapped(data_cache):
    from evalkit.data import DataConfig
    from evalkit.data.shifted import open_scored

    dataset = open_scored(
        "objectnet", "test", DataConfig(source="embedded", cache=data_cache), None
    )
    space = dataset.label_space
    scored = {space.correct[label] for label in dataset.labels}
    assert len(scored) == 12 and all(len(ids) == 2 for ids in scored)
    assert len(space.candidates) == 24 and () not in scored
    assert "BorderCrop(2" in repr(dataset.transform)


# --- image–text readers ----------------------------------------------------------------


def _image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path)


def _open(root):
    import torchvision.transforms as T

    from evalkit.data.captions import open_captions

    return open_captions(root, "train", transform=T.ToTensor())


def test_csv_captions_group_by_image_and_count_skips(tmp_path):
    _image(tmp_path / "img" / "a.png")
    _image(tmp_path / "img" / "b.png")
    rows = [
        ("image", "caption"),
        ("img/a.png", "a red square"),
        ("img/b.png", "red"),
        ("img/a.png", "crimson block"),
        ("img/gone.png", "lost"),
        ("img/b.png", " "),
    ]
    with open(tmp_path / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    data = _open(tmp_path)
    assert data.captions == [["a red square", "crimson block"], ["red"]]
    assert data.skipped == {"missing image": 1, "empty caption": 1}
    assert data[1][1] == 1


@pytest.mark.parametrize("bad", ["../outside.png", "/etc/passwd"])
def test_caption_paths_that_leave_the_folder_are_refused(tmp_path, bad):
    (tmp_path / "train.jsonl").write_text(json.dumps({"image": bad, "caption": "x"}) + "\n")
    with pytest.raises(EvalkitError, match="leaves the dataset folder"):
        _open(tmp_path)


def test_non_utf8_caption_file_is_a_one_line_error(tmp_path):
    (tmp_path / "train.csv").write_bytes(b"image,caption\na.png,caf\xe9\n")
    with pytest.raises(EvalkitError, match="not UTF-8"):
        _open(tmp_path)


def test_corrupt_image_is_labelled_unreadable(tmp_path):
    from evalkit.data.captions import UNREADABLE

    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "train.jsonl").write_text(json.dumps({"image": "bad.png", "caption": ["x", "y"]}))
    data = _open(tmp_path)
    assert data.captions == [["x", "y"]] and data[0][1] == UNREADABLE


def test_webdataset_shards_as_written_by_webdataset(tmp_path):
    import io

    webdataset = pytest.importorskip("webdataset")
    (tmp_path / "train").mkdir()
    with webdataset.TarWriter(str(tmp_path / "train" / "00000.tar")) as sink:
        for i in range(3):
            buffer = io.BytesIO()
            Image.new("RGB", (8, 8), (i * 80, 0, 0)).save(buffer, format="JPEG")
            sink.write({"__key__": f"{i:09d}", "jpg": buffer.getvalue(), "txt": f"shade {i}"})
    data = _open(tmp_path)
    assert [c[0] for c in data.captions] == ["shade 0", "shade 1", "shade 2"]
    assert data[2][0].shape == (3, 8, 8) and data[2][1] == 2


def test_parquet_image_text(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "train").mkdir()
    images = [Image.new("RGB", (8, 8), (0, i * 80, 0)) for i in range(2)]
    table = datasets.Dataset.from_dict(
        {"image": images, "text": ["green", "more green"]},
        features=datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")}),
    )
    table.to_parquet(str(tmp_path / "train" / "part-0.parquet"))
    data = _open(tmp_path)
    assert data.captions == [["green"], ["more green"]]
    assert data[1][0][1, 0, 0].item() == pytest.approx(80 / 255, abs=0.01)


# --- LiT end to end --------------------------------------------------------------------

SMALL = {"width": 32, "heads": 2, "text_layers": 1, "steps": 30, "batch_size": 32, "warmup": 3}


def test_lit_trains_saves_and_its_tower_scores_the_same(fake, ctx, tmp_path):
    from evalkit.tasks.zeroshot import Lit, ZeroShot

    ctx.artifacts = tmp_path / "pictures"
    lit = Lit(name="lit-objectnet", dataset="objectnet", eval_split="test", **SMALL)
    rows = {m.metric: m for m in lit.run(fake, ctx)}
    extra = rows["top1"].extra
    assert extra["lit_final_loss"] < extra["lit_first_loss"]
    assert extra["lit_pairs"] == 2400 and extra["candidates"] == 24
    images_before = ctx.stats["images"]
    again = ZeroShot(
        name="zeroshot-objectnet",
        dataset="objectnet",
        eval_split="test",
        text_tower=extra["text_tower"],
        pool="mean",
    )
    reloaded = {m.metric: m.value for m in again.run(fake, ctx)}
    assert reloaded["top1"] == pytest.approx(rows["top1"].value)
    assert ctx.stats["images"] == images_before  # the cached image features were reused


def test_saved_tower_refuses_another_image_tower(fake, ctx, tmp_path):
    from evalkit.heads.text import LitModel, TowerConfig, save_tower
    from evalkit.tasks.zeroshot import ZeroShot

    image = {"backbone": "fake", "weights_id": "someone-else", "pool": "mean", "layers": [-1]}
    cfg = TowerConfig(width=32, heads=2, layers=1, embed_dim=fake.info.embed_dim, image_tower=image)
    path = save_tower(LitModel(cfg), tmp_path / "tower")
    task = ZeroShot(text_tower=str(path))
    with pytest.raises(EvalkitError, match="pair it with the image tower"):
        list(task.run(fake, ctx))


def test_zero_shot_needs_a_text_tower(fake, ctx):
    from evalkit.tasks.zeroshot import ZeroShot

    with pytest.raises(EvalkitError, match="has no text tower"):
        list(ZeroShot().run(fake, ctx))


def test_lit_settings_are_validated():
    from evalkit.tasks.zeroshot import Lit

    with pytest.raises(EvalkitError, match="loss"):
        Lit(loss="hinge")
    with pytest.raises(EvalkitError, match="steps"):
        dataclasses.replace(Lit(), steps=0)


class CountingTower:
    """A text tower that counts the prompts it encodes."""

    embed_dim = 4

    def __init__(self):
        self.encoded = 0

    def tokenize(self, texts):
        return torch.tensor([[len(t), t.count(" "), 1, 0] for t in texts], dtype=torch.float)

    def encode(self, tokens):
        self.encoded += len(tokens)
        return torch.nn.functional.normalize(tokens, dim=-1)


def test_class_embeddings_are_stored_once_per_tower_names_and_templates(tmp_path):
    from evalkit.heads.zeroshot import stored_class_embeddings

    tower, prompting = (
        CountingTower(),
        Prompting(("cat", "dog, hound"), tuple(templates("clip_best"))),
    )
    first = stored_class_embeddings(tower, prompting, tower_id="t1", folder=tmp_path)
    assert tower.encoded == 8 + 16
    again = stored_class_embeddings(tower, prompting, tower_id="t1", folder=tmp_path)
    assert tower.encoded == 24 and torch.equal(first, again)
    stored_class_embeddings(tower, prompting, tower_id="t2", folder=tmp_path)  # another tower
    assert tower.encoded == 48
    (tmp_path / "classifiers" / f"{prompting.key('t1')}.pt").write_bytes(b"damaged")
    rebuilt = stored_class_embeddings(tower, prompting, tower_id="t1", folder=tmp_path)
    assert torch.equal(rebuilt, first) and tower.encoded == 72


def test_linear_probe_scores_a_shifted_set_in_its_label_space(fake, ctx):
    from evalkit.tasks.fewshot import FewShot
    from evalkit.tasks.linear_probe import LinearProbe

    probe = LinearProbe(eval_split="objectnet", l2_grid=(1e-3,), max_iter=20, refit_max_iter=50)
    assert probe.datasets() == ("imagenet", "objectnet")
    assert probe.reads() == {"imagenet": {"train": "train"}, "objectnet": {"objectnet": "test"}}
    rows = {m.metric: m for m in probe.run(fake, ctx)}
    assert rows["top1"].n == 192  # the 12 mapped classes' images only
    assert 100 / 12 < rows["top1"].value <= rows["top5"].value  # above chance (2 of 24 right)
    with pytest.raises(EvalkitError, match="scored by imagenet-linear"):
        list(FewShot(eval_split="imagenet-r").run(fake, ctx))


def test_cli_lit_then_zero_shot_with_its_tower(cli_env, capsys):
    from evalkit.cli import main
    from evalkit.core.results import load_rows

    small = [f"--set={k}={v}" for k, v in SMALL.items()]
    args = ["--backbone", "fake", "--data", "embedded", "--quiet", "--out", "rows"]
    assert main(["run", "--task", "lit-imagenet-r", *args, *small]) == 0
    (row,) = [
        r for r in load_rows([cli_env / "rows" / "lit-imagenet-r.jsonl"]) if r["metric"] == "top1"
    ]
    assert row["extra"]["candidates"] == 16 and row["n"] == 256
    tower = row["extra"]["text_tower"]
    assert (
        main(
            [
                "run",
                "--task",
                "zeroshot-imagenet-r",
                *args,
                "--set",
                f"text_tower={tower}",
                "--set",
                "pool=mean",
                "--set",
                "templates=clip_paper",
                "--save-predictions",
            ]
        )
        == 0
    )
    import pandas as pd

    (saved,) = (cli_env / "rows" / "predictions").glob("zeroshot-imagenet-r--*.parquet")
    frame = pd.read_parquet(saved)
    assert len(frame) == 256 and frame["image"].str.endswith(".png").all()
    (again,) = [
        r
        for r in load_rows([cli_env / "rows" / "zeroshot-imagenet-r.jsonl"])
        if r["metric"] == "top1"
    ]
    assert again["value"] == pytest.approx(row["value"])
    assert again["provenance"]["images_extracted"] == 0  # the image features came from the cache
    assert main(["run", "--task", "zeroshot-imagenet", *args]) == 2
    assert "has no text tower" in capsys.readouterr().err
