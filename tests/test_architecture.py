"""The driver and the contracts: the CLI and the API write the same rows, each job counts only
its own images, a task and a backbone (and a dataset kind) are added by one module each through
entry points, video clips and text towers fit the backbone contract, and the layer rules that
import-linter cannot express (torch.distributed, the evalkit.tasks mapping, file citations)."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import evalkit
from evalkit.cli import main
from evalkit.core.results import load_rows
from evalkit.errors import EvalkitError

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = {"time", "wall_s", "images_per_s", "peak_mem_mb", "git_sha"}


def stable(rows: list[dict]) -> list[dict]:
    """Rows without the fields that differ between two identical runs (clock, memory)."""
    out = []
    for row in rows:
        prov = {k: v for k, v in row["provenance"].items() if k not in VOLATILE}
        out.append({**row, "provenance": prov})
    return out


def test_cli_and_api_write_identical_rows(cli_env):
    """Both read the same stand-in files (under c1); neither uses the feature cache, so
    every image is extracted in both."""
    common = dict(data="embedded", progress=False)
    args = ["--task", "imagenet-linear", "--task", "imagenet-1shot", "--backbone", "fake"]
    assert (
        main(
            [
                "run",
                *args,
                "--data",
                "embedded",
                "--quiet",
                "--out",
                "cli",
                "--cache-dir",
                "c1",
                "--no-cache",
            ]
        )
        == 0
    )
    returned = evalkit.run(
        ["imagenet-linear", "imagenet-1shot"],
        "fake",
        out="api",
        cache_dir="c1",
        no_cache=True,
        **common,
    )
    cli_rows, api_rows = load_rows([cli_env / "cli"]), load_rows([cli_env / "api"])
    assert len(cli_rows) == 3
    key = lambda r: (r["task"], r["metric"])  # noqa: E731 - files list tasks alphabetically
    assert sorted(stable(cli_rows), key=key) == sorted(stable(api_rows), key=key)
    as_written = json.loads(json.dumps(returned))
    assert sorted(stable(as_written), key=key) == sorted(stable(api_rows), key=key)


def test_each_job_counts_only_its_own_images(cli_env):
    """Two tasks on the same features in one command: the second reads the cache and counts
    no images (one shared context used to report the first job's count again)."""
    tasks = ["imagenet-linear", "imagenet-1shot"]
    common = dict(data="embedded", progress=False)
    rows = evalkit.run(tasks, "fake", cache_dir="fresh", out="a", **common)
    n = rows[0]["extra"]["n_train"] + rows[0]["n"]
    counted = {r["task"]: r["provenance"]["images_extracted"] for r in rows}
    assert counted == {"imagenet-linear": n, "imagenet-1shot": 0}
    rows = evalkit.run(tasks, "fake", no_cache=True, out="b", **common)
    counted = {r["task"]: r["provenance"]["images_extracted"] for r in rows}
    assert counted == {"imagenet-linear": n, "imagenet-1shot": n}


def test_seeds_make_one_job_each(cli_env):
    rows = evalkit.run(
        "imagenet-1shot",
        "fake",
        data="embedded",
        progress=False,
        seeds=[0, 1],
        out="s",
        overrides=["seeds=1"],
    )
    # each seed draws its own weights and its own shots (a one-shot probe on a random backbone
    # may score chance under both, so the values alone cannot tell)
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["weights_id"] != rows[1]["weights_id"] and rows[0]["seeds"] != rows[1]["seeds"]


def test_the_process_layout_is_torn_down_when_a_job_fails(cli_env, monkeypatch):
    from evalkit import distributed
    from evalkit.core import runner
    from evalkit.core.spec import RunSpec

    torn_down = []
    monkeypatch.setattr(distributed, "teardown", lambda: torn_down.append(True))

    def failing(*args, **kwargs):
        raise EvalkitError("the job failed")

    monkeypatch.setattr(runner, "run_task", failing)
    spec = RunSpec.of(tasks="imagenet-knn", backbones="fake", data="embedded", progress=False)
    with pytest.raises(EvalkitError, match="the job failed"):
        list(runner.run(spec))
    assert torn_down == [True]


def test_every_catalog_entry_builds_its_own_name():
    from evalkit.core.catalog import TASKS
    from evalkit.core.runner import resolve_task

    for name in TASKS.names(with_aliases=True):
        entry = TASKS.get(name)
        assert resolve_task(name).name == entry.canonical
    assert resolve_task("adek20k-1/16").name == "ade20k-1/16"
    assert resolve_task("ade20k-1/16").fraction == 1 / 16
    assert resolve_task("kitti-depth-linear").head == "linear"


# --- one module per plugin, through entry points -------------------------------------------

PLUGIN = '''
"""A toy plugin: one dataset kind, one task, one backbone."""
import torch
from dataclasses import dataclass
from evalkit.data import DataKind
from evalkit.data.resolve import open_dataset
from evalkit.core.task import Metric, Task, resolve_pool
from evalkit.cache.settings import FeatureRequest
from evalkit.backbones.base import BackboneInfo, Features, Preprocess


class Stripes(torch.utils.data.Dataset):
    def __init__(self, root, split, *, source, transform=None):
        self.n = 40 if split == "train" else 20
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        label = i % 2
        image = torch.zeros(3, 8, 8)
        image[:, ::2] = 1.0 if label else 0.0
        return image, label
    def identity(self):
        return f"stripes-{self.n}"


STRIPES = DataKind("stripes", "stripes", "stripes/<nothing>", lambda folder: folder, Stripes)


@dataclass(frozen=True)
class MeanGap(Task):
    name: str = "toy-gap"
    pool: str = "auto"

    def metrics(self):
        return ["gap"]

    def run(self, backbone, ctx):
        request = FeatureRequest(pool=resolve_pool(self.pool, backbone))
        feats = ctx.features(backbone, open_dataset("stripes", "val", ctx.data), split="val",
                             request=request)
        gap = feats.pooled[feats.labels == 1].mean() - feats.pooled[feats.labels == 0].mean()
        yield Metric("gap", float(gap), n=len(feats.labels))


class Toy:
    info = BackboneInfo(name="toy", weights_id="toy-v1", embed_dim=3, patch_size=8, depth=1,
                        num_prefix_tokens=0, params=0, pools=("mean",))

    def transform(self, train=False):
        return None

    def extract(self, images, *, layers=(-1,), pool="mean", dense=False):
        return Features(pooled=images.mean(dim=(2, 3)))


def build(variant, opts):
    return Toy()
'''

ENTRY_POINTS = """
[evalkit.tasks]
toy-gap = toy_plugin:MeanGap
[evalkit.backbones]
toy = toy_plugin:build
[evalkit.datasets]
stripes = toy_plugin:STRIPES
"""


def test_a_task_a_backbone_and_a_dataset_are_one_module_each(tmp_path):
    (tmp_path / "toy_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "EVALKIT_CACHE": str(tmp_path / "c")}
    cmd = [
        sys.executable,
        "-m",
        "evalkit",
        "run",
        "--task",
        "toy-gap",
        "--backbone",
        "toy",
        "--data",
        "folder",
        "--data-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "rows"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [row] = load_rows([tmp_path / "rows"])
    assert row["task"] == "toy-gap" and row["backbone"] == "toy"
    assert row["value"] == pytest.approx(0.5) and row["n"] == 20
    listing = subprocess.run(
        [sys.executable, "-m", "evalkit", "ls", "tasks"], env=env, capture_output=True, text=True
    )
    assert "toy-gap" in listing.stdout


# --- the backbone contract: video clips and text towers -------------------------------------


class Clips(torch.utils.data.Dataset):
    def __init__(self, frames: int, n: int = 10):
        gen = torch.Generator().manual_seed(3)
        self.clips = torch.rand(n, frames, 3, 32, 32, generator=gen)

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, index):
        return self.clips[index], index % 3

    def identity(self):
        return f"clips-{tuple(self.clips.shape)}"


def test_clips_go_through_the_image_path_and_cache_per_clip(fake, tmp_path):
    from evalkit.cache.extraction import extract_features
    from evalkit.cache.settings import ExtractSettings, FeatureRequest

    clips = Clips(frames=4)
    settings = ExtractSettings(cache_dir=tmp_path, batch_size=3, shard_size=4, progress=False)
    request = FeatureRequest(pool="mean", frames=4)
    feats = extract_features(fake, clips, request=request, settings=settings, split="val")
    assert feats.pooled.shape == (10, 4, fake.info.embed_dim)
    frame = fake.extract(clips.clips[7, 2:3], layers=(-1,), pool="mean").pooled[0]
    torch.testing.assert_close(feats.pooled[7, 2], frame)
    again = extract_features(fake, clips, request=request, settings=settings, split="val")
    assert again.from_cache and torch.equal(again.pooled, feats.pooled)
    assert len(list(tmp_path.glob("features/*/shard-*.safetensors"))) == 3  # 4 + 4 + 2 clips
    with pytest.raises(EvalkitError, match="clips of 4 frames, the task asked for clips of 8"):
        extract_features(
            fake,
            clips,
            request=FeatureRequest(pool="mean", frames=8),
            settings=settings,
            split="val",
        )
    with pytest.raises(EvalkitError, match="yields clips of 4 frames, the task asked for images"):
        extract_features(
            fake, clips, request=FeatureRequest(pool="mean"), settings=settings, split="val"
        )


class TrainedTower:
    """What a LiT task will train: any object with tokenize, encode and embed_dim."""

    embed_dim = 4

    def tokenize(self, texts):
        return torch.tensor([[len(t)] for t in texts])

    def encode(self, tokens):
        return torch.nn.functional.normalize(tokens.float().repeat(1, 4), dim=-1)


def test_text_tower_protocol(fake):
    from evalkit.backbones.base import TextTower, text_tower

    assert isinstance(TrainedTower(), TextTower)
    fake.text = TrainedTower()
    assert text_tower(fake).encode(text_tower(fake).tokenize(["ab"])).shape == (1, 4)
    del fake.text
    with pytest.raises(EvalkitError, match="fake has no text tower"):
        text_tower(fake)


def test_open_clip_text_tower_satisfies_the_protocol():
    pytest.importorskip("open_clip")
    from evalkit import load_backbone
    from evalkit.backbones.base import TextTower, text_tower

    backbone = load_backbone("open_clip/ViT-B-32", model_kwargs={"force_image_size": 64})
    assert isinstance(backbone.text, TextTower) and text_tower(backbone).embed_dim == 512


def test_every_declared_pool_is_documented():
    from evalkit.backbones.base import POOLS

    assert set(POOLS) == {"cls", "mean", "map", "embed"}


# --- rules import-linter cannot state -------------------------------------------------------


def python_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_model_family_imports_no_torch_distributed():
    for path in python_files("evalkit/models"):
        bad = [n for n in imported_names(path) if n.startswith("torch.distributed")]
        assert not bad, f"{path.name} imports {bad}"


def test_the_core_imports_no_task_by_its_installed_name():
    for path in python_files("evalkit"):
        bad = [n for n in imported_names(path) if n.startswith("evalkit.tasks")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_docstrings_and_docs_cite_only_files_in_the_repository():
    cited = re.compile(r"\b([\w./-]+\.md)\b")
    outside = re.compile(r"\b(DESIGN|REFERENCE|PROTOCOLS)\b|shared/")
    sources = python_files("evalkit", "tasks", "tests", "benchmarks") + sorted(
        (ROOT / "docs").glob("*.md")
    )
    for path in [*sources, ROOT / "README.md"]:
        text = path.read_text()
        if path.name != "test_architecture.py":
            assert not outside.search(text), f"{path.relative_to(ROOT)} cites a file outside"
        for name in cited.findall(text):
            if name.startswith(("http", "www.")):
                continue
            candidates = [ROOT / name, ROOT / "docs" / name, path.parent / name]
            assert any(c.exists() for c in candidates), f"{path.relative_to(ROOT)} cites {name}"


# --- the house: what a newcomer sees --------------------------------------------------------

HOUSE_ROOT_MODULES = 15  # the ground and services every floor uses (docs/architecture.md)
HOUSE_PACKAGE_MODULE = 500  # lines: above it a module of the package fails
HOUSE_LONG_MODULE = 600  # formatted lines: above it a module is flagged (a warning) for a look
HOUSE_FORMATTER_ESCAPES = 20  # formatter escapes (skip, off) in the repository: data tables
HOUSE_README_LINES = 250


HOUSE_FOLDERS = ("evalkit", "tasks", "tests", "benchmarks")


def test_the_package_root_holds_few_modules():
    root_modules = sorted(p.name for p in (ROOT / "evalkit").glob("*.py"))
    assert len(root_modules) <= HOUSE_ROOT_MODULES, root_modules
    assert len((ROOT / "README.md").read_text().splitlines()) <= HOUSE_README_LINES


def test_the_formatter_owns_the_code():
    """Code is laid out by ``ruff format``, not packed by hand: escapes only for data tables."""
    marker = "fmt: " + "skip", "fmt: " + "off"  # spelled apart, so this file does not count
    escapes = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in python_files(*HOUSE_FOLDERS)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if any(m in line for m in marker)
    ]
    assert len(escapes) < HOUSE_FORMATTER_ESCAPES, escapes


def test_no_module_of_the_package_is_over_500_lines():
    """A module of the package or the tasks over ``HOUSE_PACKAGE_MODULE`` lines holds more than
    one responsibility: split it by responsibility (packing lines would only hide it). Tests
    and benchmarks are flagged above ``HOUSE_LONG_MODULE``, for a look."""
    import warnings

    long = []
    for path in python_files(*HOUSE_FOLDERS):
        lines = len(path.read_text().splitlines())
        if path.is_relative_to(ROOT / "evalkit") or path.is_relative_to(ROOT / "tasks"):
            if lines > HOUSE_PACKAGE_MODULE:
                long.append(f"{path.relative_to(ROOT)}: {lines}")
        elif lines > HOUSE_LONG_MODULE:
            warnings.warn(
                f"{path.relative_to(ROOT)} has {lines} lines: one responsibility?", stacklevel=1
            )
    assert not long, long


def test_every_relative_link_in_the_readme_and_docs_resolves():
    import re

    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in link.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, broken
    readme = (ROOT / "README.md").read_text()
    assert all(f"docs/{p.name}" in readme for p in (ROOT / "docs").glob("*.md")), (
        "link every docs page"
    )


def test_every_folder_the_readmes_results_commands_read_exists_by_then():
    """A folder that ``compare``, ``table`` or ``leaderboard`` reads in the README is in the
    checkout or written by a command before it (``--out DIR``, else ``results/runs``): an
    example that names a folder nothing makes fails for the reader who follows it."""
    readme = (ROOT / "README.md").read_text()
    commands = [
        block.replace("\\\n", " ") for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
    ]
    made, missing = set(), []
    for line in "\n".join(commands).splitlines():
        words = line.split("#")[0].split()
        if any(pair == ("evalkit", "run") for pair in zip(words, words[1:], strict=False)):
            outs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out"]
            made.update(outs or ["results/runs"])
        for verb in ("compare", "table", "leaderboard"):
            if words[:2] == ["evalkit", verb]:
                read = [w for w in words[2:] if w.startswith("results/")]
                missing += [w for w in read if w not in made and not (ROOT / w).exists()]
    assert not missing, f"the README reads folders nothing before it makes: {missing}"


def test_every_fault_of_the_mutation_pass_still_applies():
    """Each fault names one line of today's code: a fault whose text moved or was reformatted
    would silently test nothing."""
    from benchmarks.mutations import FAULTS

    stale = [f.name for f in FAULTS if (ROOT / f.path).read_text().count(f.old) != 1]
    assert not stale, stale


def test_the_runner_records_the_seed_a_task_did_not_name():
    """A task need not write ``seeds``: the row records the job's own, so a task that forgets
    it cannot write rows whose ``seeds`` contradict their ``seed``."""
    from evalkit.core.rows import make_row
    from evalkit.core.runner import resolve_task
    from evalkit.core.task import Metric, TaskContext

    task = resolve_task("imagenet-knn")
    ctx = TaskContext(seed=3)
    info = evalkit.load_backbone("fake").info
    row = make_row(task, info, Metric("top1/k=20", 50.0), ctx, key="k")
    assert (row["seed"], row["seeds"]) == (3, [3])


def test_every_module_of_evalkit_is_on_a_floor():
    """A module the ``layers`` contract names neither itself nor by a package above it is on
    no floor, and import-linter would let it import anything: name it in pyproject.toml
    (package ``__init__`` files hold docstrings and re-exports only)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    named = {part.strip() for layer in layers for part in layer.replace("|", ":").split(":")}
    nowhere = []
    for path in sorted((ROOT / "evalkit").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if not any(".".join(parts[:i]) in named for i in range(1, len(parts) + 1)):
            nowhere.append(".".join(parts))
    assert not nowhere, f"modules on no floor: {nowhere}"


def contract_floors() -> list[set[str]]:
    """The floors of the ``layers`` contract, top to bottom, each as the set of names it holds."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [{part.strip() for part in layer.replace("|", ":").split(":")} for layer in layers]


def test_every_package_docstring_names_exactly_its_modules():
    """Each package's docstring ends with a ``Modules:`` paragraph naming every module it holds
    and nothing else, so a module added, moved or removed makes its package say so."""
    packages = [p.parent for p in (ROOT / "evalkit").rglob("__init__.py")] + [ROOT / "tasks"]
    wrong = {}
    for package in packages:
        if package == ROOT / "evalkit":
            continue
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        _, marker, listed = doc.partition("Modules")
        named = set(re.findall(r"``(\w+)``", listed)) if marker else set()
        held = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        held |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
        if named != held:
            wrong[str(package.relative_to(ROOT))] = {
                "unnamed": sorted(held - named),
                "missing": sorted(named - held),
            }
    assert not wrong, wrong


def test_the_architecture_page_draws_the_contracts_floors():
    """docs/architecture.md's floor drawing lists, top to bottom, exactly the floors of the
    ``layers`` contract (``name/`` is a folder, a bare name a root module), and every module
    path it mentions exists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text.split("```")[1].strip().splitlines()
    drawn = []
    for line in drawing:
        names = re.findall(r"\w+/?", line.split(None, 1)[1])
        drawn.append({("tasks" if n == "tasks/" else f"evalkit.{n.rstrip('/')}") for n in names})
    assert drawn == contract_floors()
    paths = set(re.findall(r"`((?:evalkit|tasks)/[\w/]+\.py)`", text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_one_seed_rule_and_one_schedule():
    """Every seed is the job's or derived from it by ``evalkit.seeds``: no module seeds torch
    itself (``manual_seed``) or derives a seed by arithmetic or Python's ``hash``, and one
    ``Schedule`` class exists."""
    seeding = re.compile(r"manual_seed\(|hash\(\(|seed \* \d|\(seed \+ 1\)")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in python_files("evalkit", "tasks")
        if p != ROOT / "evalkit" / "seeds.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if seeding.search(line)
    ]
    assert not found, found
    schedules = [
        str(p.relative_to(ROOT))
        for p in python_files("evalkit", "tasks")
        if re.search(r"^class \w*(Schedule|TrainConfig)\b", p.read_text(), re.M)
    ]
    assert schedules == ["evalkit/schedule.py"]


def test_derived_seeds_are_stable_named_and_match_the_files_they_made():
    """Values pinned: a seed derived here is the same on every Python and platform; the
    built-in family's initial values and prepared ImageNet-C files keep the seeds they had."""
    from evalkit.seeds import derived_seed, generator

    assert torch.equal(
        torch.rand(3, generator=generator(7, "x")),
        torch.rand(3, generator=torch.Generator().manual_seed(derived_seed(7, "x"))),
    )
    assert derived_seed(0, "epoch", 1) != derived_seed(0, "epoch", 2) != derived_seed(1, "epoch", 1)
    # the formulas the built-in family's parameters and ImageNet-C's images used before the rule
    assert derived_seed(0, "blocks.0.attn.qkv.weight") == 3533784484680752091
    assert derived_seed(3, "fog", 2, "a/b.jpg") & 0xFFFFFFFF == 1939340872
    assert 0 <= derived_seed(2**40, "x") < 2**63


def test_every_protocol_names_the_modules_that_implement_it():
    """Each section of docs/protocols.md opens with the modules that implement it, and they
    exist: a reader goes from the protocol to the code, and a moved module fails here."""
    text = (ROOT / "docs" / "protocols.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    unnamed, missing = [], []
    for section in sections:
        title, _, body = section.partition("\n")
        first = body.strip().split("\n\n", 1)[0]
        if not first.startswith("Implemented in "):
            unnamed.append(title)
        paths = re.findall(r"`((?:evalkit|tasks)/[\w/]+\.py)`", first)
        missing += [p for p in paths if not (ROOT / p).exists()]
    assert not unnamed and not missing, (unnamed, missing)


SEED_CALLS = {"derived_seed": 1, "generator": 1, "numpy_generator": 1, "seed_global": 1}
SEED_CALLS |= {"seeded": 1, "seeded_build": 2}  # the position of the draw's name


# Every draw's name and the modules taking it. A name in several modules is the same kind of
# draw in jobs that never meet (a head's weights in a dense, video or fine-tuning job; a
# training batch in the ladder, the stability or the efficiency ablation): a name added, or
# taken by one more module, is added here on purpose. A variable name is listed as written.
DRAWS = {
    "<WEIGHTS_DRAW>": {"backbones/fake", "backbones/open_clip_backbone", "backbones/timm_backbone"},
    "<corruption>": {"data/prepare/imagenet_c"},
    "<name>": {"data/corruptions", "models/vit22b"},
    "augment": {"training/loop"},
    "batch": {"training/loop", "tasks/efficiency", "tasks/stability"},
    "captions": {"tasks/zeroshot"},
    "collate": {"training/loop"},
    "epoch": {"heads/train"},
    "head-batches": {"heads/train"},
    "head-dropout": {"heads/train"},
    "head-weights": {"protocols/finetuning", "protocols/grids", "tasks/video"},
    "holdout": {"protocols/classification"},
    "fairness-interval": {"tasks/fairness"},
    "miou-stderr": {"tasks/segmentation"},
    "mixup": {"tasks/distillation"},
    "model-weights": {"training/pretrain", "tasks/efficiency", "tasks/stability"},
    "shot-pick": {"tasks/fewshot"},
    "shots": {"tasks/fewshot"},
    "student-weights": {"tasks/distillation"},
    "tower-weights": {"tasks/zeroshot"},
}


def draw_names() -> dict[str, set[str]]:
    """Each name the code gives a draw (a literal, or ``<expression>``) → its modules."""
    found = {}
    for path in python_files("evalkit", "tasks"):
        if path.name == "seeds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else None
            at = SEED_CALLS.get(node.func.id if isinstance(node.func, ast.Name) else func)
            if at is not None and len(node.args) > at:
                name = node.args[at]
                key = name.value if isinstance(name, ast.Constant) else f"<{ast.unparse(name)}>"
                module = str(path.relative_to(ROOT).with_suffix("")).removeprefix("evalkit/")
                found.setdefault(key, set()).add(module)
    return found


# Generators seeded outside the rule, each for a reason: the stand-in data sets are made from
# their own seed (the data's, not a job's), and the statistics resample from the seed their
# caller passes (a job passes a named draw; the views, the statistics' own fixed seed).
OWN_SEEDS = {
    "data/embedded",
    "data/scenes",
    "data/stimuli",
    "data/celeba",
    "data/clips",
    "data/captions",
    "data/multilabel",
    "data/shifted",
    "data/corruptions",
    "protocols/grids",
    "metrics",
    "significance",
    "publish/board_ranks",
    "publish/board_pairs",
}


def test_no_generator_is_seeded_but_through_the_rule():
    """A NumPy or torch generator seeded in evalkit or the tasks takes a seed from the rule
    (``derived_seed``, ``numpy_generator``), except where ``OWN_SEEDS`` says why not: a job's
    seed passed straight to ``default_rng`` would draw unnamed."""
    seeding = {"default_rng", "manual_seed", "RandomState"}
    found = set()
    for path in python_files("evalkit", "tasks"):
        module = str(path.relative_to(ROOT).with_suffix("")).removeprefix("evalkit/")
        if path.name == "seeds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            name = getattr(func, "attr", None) or getattr(func, "id", None)
            if isinstance(node, ast.Call) and name in seeding:
                found.add(module)
    assert found == OWN_SEEDS


def test_each_draw_name_means_one_draw():
    """The census of draw names: two draws of one job under one name would be one stream (a
    batch pick and its mixup coefficient were), so a name is taken by a new module only on
    purpose, here."""
    assert draw_names() == DRAWS


def test_no_draw_is_taken_without_a_name():
    """Every call of the seed rule names its draw (a string, or a constant holding one), in
    the package, the tasks and the benchmarks; and the rule itself refuses a nameless draw, so
    one added later fails where it runs too."""
    from evalkit.seeds import derived_seed, generator, seeded

    nameless = []
    for path in python_files("evalkit", "tasks", "benchmarks"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else None
            func = node.func.id if isinstance(node.func, ast.Name) else func
            at = SEED_CALLS.get(func)
            if at is None or path.name == "seeds.py" and func == "derived_seed":
                continue
            named = len(node.args) > at and isinstance(node.args[at], ast.Constant | ast.Name)
            if not named or isinstance(node.args[at], ast.Constant) and not node.args[at].value:
                nameless.append(f"{path.relative_to(ROOT)}:{node.lineno} {func}")
    assert not nameless, nameless
    for call in (lambda: derived_seed(3), lambda: generator(3, ""), lambda: seeded(3, None)):
        with (
            pytest.raises(
                TypeError, match="a draw needs a name|required positional argument: .name."
            ),
            contextlib.ExitStack() as stack,
        ):
            made = call()
            if hasattr(made, "__enter__"):
                stack.enter_context(made)


def test_draws_with_distinct_names_are_independent_streams():
    """Two names under one seed give streams that look independent: no shared values, and
    correlations, as across different seeds, within what chance gives 200,000 draws (5 standard
    errors). A head's initial weights and its batch order came from one stream before draws
    were named."""
    from evalkit.seeds import generator

    n = 200_000
    streams = {
        name: torch.rand(n, generator=generator(0, name), dtype=torch.float64)
        for name in ("head-weights", "head-batches", "head-dropout", "mixup", "batch")
    }
    names = sorted(streams)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            x, y = streams[a], streams[b]
            assert not torch.isin(x[:1000], y).any(), (a, b)
            r = torch.corrcoef(torch.stack([x, y]))[0, 1].item()
            assert abs(r) < 5 / n**0.5, (a, b, r)
            lagged = torch.corrcoef(torch.stack([x[1:], y[:-1]]))[0, 1].item()
            assert abs(lagged) < 5 / n**0.5, (a, b, lagged)


DOTTED = re.compile(r"`{1,2}(evalkit(?:\.[A-Za-z_]\w*)+)(?:\(\))?`{1,2}")


def names_in_prose() -> dict[str, set[str]]:
    """Each ``evalkit.x.y`` named in the README, docs/ or a docstring → where it is named."""
    found = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in DOTTED.finditer(page.read_text()):
            found.setdefault(match[1], set()).add(page.name)
    for path in python_files("evalkit", "tasks"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef):
                for match in DOTTED.finditer(ast.get_docstring(node) or ""):
                    found.setdefault(match[1], set()).add(str(path.relative_to(ROOT)))
    return found


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute reached from the longest module prefix."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return all((found := getattr(found, part, None)) is not None for part in parts[cut:])
    return False


def test_every_dotted_name_the_prose_gives_exists():
    """A module or function named in full (``evalkit.core.cells.request_key``) in the README,
    docs/ or a docstring exists where it says: a move that leaves prose behind fails here. Entry-
    point groups (``evalkit.datasets``) are names of groups, not modules."""
    registries = re.compile(r'Registry\("\w+", "([\w.]+)"\)')
    groups = {g for p in python_files("evalkit") for g in registries.findall(p.read_text())}
    stale = {
        name: sorted(where)
        for name, where in names_in_prose().items()
        if name not in groups and not resolves(name)
    }
    assert not stale, stale
    assert len(names_in_prose()) > 40  # the prose names dozens: the pattern still finds them
    assert resolves("evalkit.core.cells.request_key") and resolves("evalkit.core.cells")
    assert not resolves("evalkit.core.cells.job_spec") and not resolves("evalkit.nowhere")
