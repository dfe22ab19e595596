"""``evalkit card``: a Hugging Face model card whose ``model-index`` metadata holds every result
row of one backbone, so the Hub shows them on the model's page.

Each row becomes one evaluation result: the task (its Hub task type and evalkit's task name),
the dataset (name, the evaluated split, the content id of the data the row was computed on as
its revision, and the data source as its config), the metric (its Hub type, evalkit's metric
name, the value) and, in the metric's ``args``, the row's standard error, image count, seed,
run key, weights id and provenance (evalkit's version among it); results are marked
unverified, as self-reported results are. The card's text repeats the rows as a table.
"""

from __future__ import annotations

from pathlib import Path

from evalkit import __version__
from evalkit.core.results import Row, load_rows
from evalkit.errors import EvalkitError
from evalkit.writes import replacing

METRIC_TYPES = {"top1": "accuracy", "top5": "top_5_accuracy", "miou": "mean_iou", "ece": "ece",
                "nll": "nll", "brier": "brier_score", "rmse": "rmse", "abs_rel": "abs_rel"}  # fmt: skip
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
PROVENANCE_KEPT = ("evalkit", "torch", "timm", "open_clip", "device", "dtype", "cache_dtype",
                   "tf32", "deterministic", "git_sha", "time", "wall_s")  # fmt: skip


def card_rows(results: Path, backbone: str | None = None) -> list[Row]:
    """The rows of one backbone under ``results`` (``backbone`` picks one when there are more)."""
    rows = load_rows([results])
    names = sorted({r["backbone"] for r in rows})
    if backbone is not None:
        rows = [r for r in rows if r["backbone"] == backbone]
        if not rows:
            raise EvalkitError(f"no rows of backbone {backbone!r} under {results}: it holds "
                               f"{', '.join(names) or 'none'}")  # fmt: skip
    elif len(names) > 1:
        raise EvalkitError(f"{results} holds rows of {len(names)} backbones ({', '.join(names)}):"
                           " a card is for one model, pick it with --backbone")  # fmt: skip
    if not rows:
        raise EvalkitError(f"no result rows under {results} (expected evalkit run's *.jsonl)")
    return rows


def eval_result(row: Row):
    """One row as the Hub's ``EvalResult``."""
    from huggingface_hub import EvalResult

    config = row.get("config", {})
    split = config.get("eval_split", "val")
    provenance = row.get("provenance", {})
    return EvalResult(
        task_type=task_type(row["task"]), task_name=row["task"],
        dataset_type=config.get("dataset", row["task"]), dataset_name=config.get("dataset", row["task"]),
        dataset_split=split, dataset_revision=row.get("data_id", {}).get(split),
        metric_type=METRIC_TYPES.get(row["metric"], row["metric"]), metric_name=row["metric"],
        metric_value=row["value"], verified=False,
        metric_args={"stderr": row.get("stderr"), "n": row.get("n"), "seed": row.get("seed"),
                     "run_key": row.get("run_key"), "weights_id": row.get("weights_id"),
                     "backbone": row["backbone"],
                     "provenance": {k: provenance[k] for k in PROVENANCE_KEPT if k in provenance}},
    )  # fmt: skip


def task_type(task: str) -> str:
    return next((kind for word, kind in TASK_TYPES if word in task), "other")


def model_card(rows: list[Row], model_id: str):
    """A ``ModelCard`` with every row in its ``model-index`` and a table of them in its text."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(model_name=model_id, eval_results=[eval_result(r) for r in rows])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{card_text(rows, model_id)}")


def card_text(rows: list[Row], model_id: str) -> str:
    lines = [f"# {model_id}", "",
             f"Evaluation results of `{rows[0]['backbone']}` (weights `{rows[0].get('weights_id')}`) "
             f"written by evalkit {__version__}. Each row is also in this card's `model-index`, "
             "with its provenance.", "",
             "| task | metric | value | n | seed | device | evalkit |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        stderr = f" ± {row['stderr']:.2f}" if row.get("stderr") is not None else ""
        prov = row.get("provenance", {})
        lines.append(f"| {row['task']} | {row['metric']} | {row['value']:.4g}{stderr} | "
                     f"{row.get('n') or ''} | {row.get('seed')} | {prov.get('device', '')} | "
                     f"{prov.get('evalkit', '')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_card(results: Path, model_id: str, out: Path, backbone: str | None = None) -> Path:
    card = model_card(card_rows(results, backbone), model_id)
    with replacing(out) as tmp:
        tmp.write_text(str(card))
    return out


def push_card(path: Path, model_id: str) -> str:
    """Upload the card as the model repository's README.md; needs a Hub token."""
    from huggingface_hub import ModelCard, get_token

    if not get_token():
        raise EvalkitError("--push needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return ModelCard.load(path).push_to_hub(model_id, commit_message="evalkit results")
