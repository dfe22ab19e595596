"""``evalkit card``: a Hugging Face model card whose ``model-index`` metadata holds every result
row of one backbone, so the Hub shows them on the model's page.

Each distinct job's row (a job run again with ``--rerun`` counts once, its newest row) becomes
one evaluation result: the task (its Hub task type and evalkit's task name), the dataset as the
row records it (name, the evaluated split, the content id of the data as its revision; evalkit's
embedded stand-in named as a stand-in, never as the real set), the metric (its Hub type,
evalkit's metric name, the value) and, in the metric's ``args``, the row's standard error,
image count, seed, run key, weights id and provenance (evalkit's version among it); results are
marked unverified, as self-reported results are. The card's text repeats the rows as a table.

A card never holds an absolute local path: a folder data set is named by its folder's name, a
local checkpoint by its file name, and the finished card is checked for every local path the
rows hold before it is written. ``--push`` refuses rows on stand-in data, or rows that do not
record their data, unless asked to publish them (``--allow-stand-in``).
"""

from __future__ import annotations

import os
from pathlib import Path

from evalkit import __version__
from evalkit.core.labels import dataset_label, setup_key, setup_labels
from evalkit.core.results import Row, load_rows
from evalkit.errors import EvalkitError
from evalkit.storage.writes import replacing

METRIC_TYPES = {
    "top1": "accuracy",
    "top5": "top_5_accuracy",
    "miou": "mean_iou",
    "ece": "ece",
    "nll": "nll",
    "brier": "brier_score",
    "rmse": "rmse",
    "abs_rel": "abs_rel",
}
TASK_TYPES = (  # first match on the task name
    ("ade20k", "image-segmentation"),
    ("depth", "depth-estimation"),
    ("kinetics", "video-classification"),
    ("moments", "video-classification"),
    ("zeroshot", "zero-shot-image-classification"),
    ("lit", "zero-shot-image-classification"),
    ("imagenet", "image-classification"),
    ("distill", "image-classification"),
)
PROVENANCE_KEPT = (
    "evalkit",
    "torch",
    "timm",
    "open_clip",
    "device",
    "dtype",
    "cache_dtype",
    "tf32",
    "deterministic",
    "git_sha",
    "time",
    "wall_s",
)


def card_rows(results: Path, backbone: str | None = None) -> list[Row]:
    """The rows of one model setup under ``results``: ``backbone`` picks it by backbone name
    (when that backbone ran one setup there) or by the setup's label as the views print it
    (``fake [img_size=64] (random init)``). A card is for one model: a pick that names
    several setups is refused, naming them."""
    rows = load_rows([results])
    if not rows:
        raise EvalkitError(f"no result rows under {results} (expected evalkit run's *.jsonl)")
    labels = setup_labels(rows)
    if backbone is not None:
        rows = [r for r in rows if backbone in (r["backbone"], labels[setup_key(r)])]
        if not rows:
            raise EvalkitError(
                f"no rows of backbone {backbone!r} under {results}: it holds "
                f"{', '.join(map(repr, sorted(set(labels.values()))))}"
            )
    setups = sorted({labels[setup_key(r)] for r in rows})
    if len(setups) > 1:
        picked = f"--backbone {backbone} names" if backbone else f"{results} holds rows of"
        raise EvalkitError(
            f"{picked} {len(setups)} model setups ({', '.join(map(repr, setups))}): a card is "
            "for one model, pick one with --backbone and its label as written here"
        )
    return named_setups(distinct_jobs(rows))


def named_setups(rows: list[Row]) -> list[Row]:
    """Each row with ``setup``: its setup's label (``fake [img_size=64] (random init)``), so
    a card holding two setups of one backbone never lists one (task, metric) twice with nothing
    to tell the values apart."""
    labels = setup_labels(rows)
    several = len(set(labels.values())) > 1
    rows = [{**row, "setup": labels[setup_key(row)], "setups_named": several} for row in rows]
    seen: dict[tuple, Row] = {}
    for row in rows:
        key = (row["setup"], row["task"], dataset_label(row), row["metric"], row.get("seed"))
        other = seen.setdefault(key, row)
        if other.get("config_hash") != row.get("config_hash"):
            raise EvalkitError(
                f"{row['setup']} has two {row['task']} {row['metric']} values of seed "
                f"{row.get('seed')} under different settings, and a card cannot tell them "
                "apart: make the card from a folder holding one of the two runs"
            )
    return rows


def distinct_jobs(rows: list[Row]) -> list[Row]:
    """One row per (run key, metric), the newest: ``--rerun`` appends a job's rows again."""
    newest = {}
    for index, row in enumerate(rows):  # files hold rows in the order they were written
        newest[(row.get("run_key") or index, row["metric"])] = row
    return list(newest.values())


def public_dataset(row: Row) -> tuple[str, str]:
    """(Hub dataset type, name) of the data a row was computed on, with no local path: a folder
    of one's own by its folder's name, the embedded stand-in as a stand-in."""
    label = dataset_label(row) or row["task"]
    stand_in = label.endswith(" (stand-in)")
    name = label.removesuffix(" (stand-in)")
    if name.startswith("folder:"):
        name = "folder:" + Path(name.removeprefix("folder:")).name
    if stand_in:
        return f"evalkit-stand-in/{name}", f"{name} stand-in (evalkit's embedded data, not {name})"
    return name, name


def public_source(row: Row) -> str:
    """Where the weights came from, a local checkpoint by its file name only."""
    source = row.get("weights_source") or row.get("weights_id", "")
    if source.startswith("local file "):
        return "local file " + Path(source.removeprefix("local file ")).name
    return source


def unverifiable(rows: list[Row]) -> list[Row]:
    """Rows ``--push`` refuses by default: on the embedded stand-in, or not saying their data."""
    return [
        r for r in rows if not isinstance(r.get("dataset"), dict) or r["dataset"].get("stand_in")
    ]


def eval_result(row: Row):
    """One row as the Hub's ``EvalResult``."""
    from huggingface_hub import EvalResult

    config = row.get("config", {})
    split = config.get("eval_split", "val")
    provenance = row.get("provenance", {})
    dataset_type, dataset_name = public_dataset(row)
    return EvalResult(
        task_type=task_type(row["task"]),
        task_name=f"{row['task']} · {row['setup']}" if row["setups_named"] else row["task"],
        dataset_type=dataset_type,
        dataset_name=dataset_name,
        dataset_split=split,
        dataset_revision=row.get("data_id", {}).get(split),
        metric_type=METRIC_TYPES.get(row["metric"], row["metric"]),
        metric_name=row["metric"],
        metric_value=row["value"],
        verified=False,
        metric_args={
            "stderr": row.get("stderr"),
            "n": row.get("n"),
            "seed": row.get("seed"),
            "run_key": row.get("run_key"),
            "weights_id": row.get("weights_id"),
            "weights_source": public_source(row),
            "backbone": row["backbone"],
            "setup": row["setup"],
            "backbone_options": row.get("backbone_options") or {},
            "random_init": bool(row.get("random_init")),
            "stand_in": bool((row.get("dataset") or {}).get("stand_in")),
            "provenance": {k: provenance[k] for k in PROVENANCE_KEPT if k in provenance},
        },
    )


def task_type(task: str) -> str:
    return next((kind for word, kind in TASK_TYPES if word in task), "other")


def model_card(rows: list[Row], model_id: str):
    """A ``ModelCard`` with every row in its ``model-index`` and a table of them in its text."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(model_name=model_id, eval_results=[eval_result(r) for r in rows])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{card_text(rows, model_id)}")


def card_text(rows: list[Row], model_id: str) -> str:
    lines = [
        f"# {model_id}",
        "",
        f"Evaluation results of {_setups_text(rows)} written by evalkit {__version__}. Each "
        "row is also in this card's `model-index`, with its provenance. `±` is the standard "
        "error over the test items.",
        "",
        "| setup | task | dataset | metric | value | n | seed | device | evalkit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stderr = f" ± {row['stderr']:.2f}" if row.get("stderr") is not None else ""
        prov = row.get("provenance", {})
        cells = [
            row["setup"],
            row["task"],
            public_dataset(row)[1],
            row["metric"],
            f"{row['value']:.4g}{stderr}",
            row.get("n") or "",
            row.get("seed"),
            prov.get("device", ""),
            prov.get("evalkit", ""),
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def local_paths(rows: list[Row]) -> set[str]:
    """Every absolute local path the rows hold, anywhere in them (a card must show none)."""
    found = set()

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            for word in value.replace("folder:", " ").split():
                if os.path.isabs(word) and len(Path(word).parts) > 2:
                    found.add(word)

    walk(list(rows))
    return found


def _setups_text(rows: list[Row]) -> str:
    """Who the rows are of: each setup by its label and weights id."""
    setups = {row["setup"]: row.get("weights_id") for row in rows}
    return ", ".join(f"`{label}` (weights `{weights}`)" for label, weights in setups.items())


def write_card(rows: list[Row], model_id: str, out: Path) -> Path:
    text = str(model_card(rows, model_id))
    leaked = sorted(path for path in local_paths(rows) if path in text)
    if leaked:
        raise EvalkitError(f"the card would publish the local path {leaked[0]}: not written")
    with replacing(out) as tmp:
        tmp.write_text(text)
    return out


def check_publishable(rows: list[Row], allow_stand_in: bool):
    """``--push`` refuses stand-in numbers (and rows that do not say their data) unless asked."""
    refused = unverifiable(rows)
    if refused and not allow_stand_in:
        raise EvalkitError(
            f"not pushed: {len(refused)} row(s) are on evalkit's embedded stand-in data or do "
            f"not record their data (e.g. {refused[0]['task']} {refused[0]['metric']}), so they "
            "are not the real sets' numbers; rerun on the real data, or pass --allow-stand-in "
            "to publish them labelled as stand-in"
        )


def push_card(path: Path, model_id: str) -> str:
    """Upload the card as the model repository's README.md; needs a Hub token."""
    from huggingface_hub import ModelCard, get_token

    if not get_token():
        raise EvalkitError("--push needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return ModelCard.load(path).push_to_hub(model_id, commit_message="evalkit results")
