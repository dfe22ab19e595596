"""What a task got most wrong, as tables read from its per-image outputs (``evalkit errors``):
each built-in task declares its tables (``Task.error_tables``) as it declares its paired test,
and ``DECLARED`` names them for every class the catalog (``evalkit.core.catalog``) registers,
so ``evalkit errors`` reads them without importing the task, torch or a model library (a test
holds the two the same). Dense tasks show their images of lowest mIoU or highest depth error;
model-vs-human its confused categories and weakest sets; few-shot the images most draws
missed; fairness the subgroups and images of lowest expected accuracy; classification (probes,
kNN, zero-shot, video, calibration, distillation) its confused classes and most confident
mistakes."""

from __future__ import annotations

from evalkit.metrics import DEPTH_METRICS


def segmentation_tables(frame, top: int):
    return [("images of lowest mIoU", frame.nsmallest(top, "miou")[["image", "miou", "pixel_acc"]])]


def depth_tables(frame, top: int):
    """The images of highest error by the first depth metric the file holds (the board's
    headline one comes first in ``DEPTH_METRICS``)."""
    depth = [m for m in DEPTH_METRICS if m in frame]
    return [(f"images of highest {depth[0]}", frame.nlargest(top, depth[0])[["image", *depth]])]


def human_alignment_tables(frame, top: int):
    wrong = frame[~frame["correct"]]
    pairs = wrong.groupby(["category", "decision"]).size().rename("images")
    sets = frame.groupby("set")["correct"].mean().rename("accuracy").nsmallest(top).reset_index()
    return [
        ("most confused categories", pairs.nlargest(top).reset_index()),
        ("sets of lowest accuracy", sets),
    ]


def few_shot_tables(frame, top: int):
    label = "label_name" if "label_name" in frame else "label"  # older files: class numbers
    missed = frame.nsmallest(top, "correct_share")[["image", label, "correct_share"]]
    classes = frame.groupby(label)["correct_share"].mean().nsmallest(top).reset_index()
    return [("images most draws got wrong", missed), ("classes of lowest share right", classes)]


def fairness_tables(frame, top: int):
    groups = frame.groupby(["group", "target"])["accuracy"].mean().rename("expected accuracy")
    worst = frame.nsmallest(top, "accuracy")[["image", "group", "target", "score", "accuracy"]]
    return [
        ("subgroups of lowest expected accuracy", groups.nsmallest(top).reset_index()),
        ("images of lowest expected accuracy", worst),
    ]


def classification_tables(frame, top: int):
    label_names = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    if "prediction_name" in frame:  # predictions and labels named in the space scored
        predicted = frame["prediction_name"]
    else:  # files without names (calibration; files written before they had names)
        names = dict(zip(frame["label"], label_names, strict=False))
        predicted = [names.get(p, str(p)) for p in frame["prediction"]]
    frame = frame.assign(label_name=list(label_names), predicted=list(predicted))
    wrong = frame[~frame["correct"]]
    pairs = (
        wrong.groupby(["label_name", "predicted"])
        .size()
        .rename("images")
        .nlargest(top)
        .reset_index()
    )
    columns = ["image", "label_name", "predicted"]
    if "top5_probabilities" in frame:
        wrong = wrong.assign(probability=[p[0] for p in wrong["top5_probabilities"]])
        kind = frame["score_kind"].iloc[0] if len(frame) else "probability"
        title, score = f"most confident mistakes (probability: {kind})", "probability"
    elif "confidence" in frame:
        title, score = "most confident mistakes (softmax confidence)", "confidence"
    else:  # files written before predictions carried probabilities: the task's raw score
        wrong = wrong.assign(top_score=[s[0] for s in wrong["top5_scores"]])
        title = "highest-scored mistakes (top_score: the task's raw score, not a probability)"
        score = "top_score"
    return [
        ("most confused classes", pairs),
        (title, wrong.nlargest(top, score)[[*columns, score]]),
    ]


def by_columns(frame, top: int):
    """The tables of a task that declares none (a plugin's), chosen by what its per-image
    outputs hold: per-image mIoU or depth errors, model-vs-human decisions, few-shot shares,
    fairness groups; else classification's, which need ``correct`` and the labels."""
    if "miou" in frame:
        return segmentation_tables(frame, top)
    if any(m in frame for m in DEPTH_METRICS):
        return depth_tables(frame, top)
    if {"category", "decision"} <= set(frame.columns):
        return human_alignment_tables(frame, top)
    if "correct_share" in frame:
        return few_shot_tables(frame, top)
    if {"group", "score", "accuracy"} <= set(frame.columns):
        return fairness_tables(frame, top)
    if {"correct", "label"} <= set(frame.columns):
        return classification_tables(frame, top)
    return []


DECLARED = {
    "evalkit.tasks.calibration:Calibration": classification_tables,
    "evalkit.tasks.depth:Depth": depth_tables,
    "evalkit.tasks.distillation:Distillation": classification_tables,
    "evalkit.tasks.fairness:Fairness": fairness_tables,
    "evalkit.tasks.fewshot:FewShot": few_shot_tables,
    "evalkit.tasks.knn:KNN": classification_tables,
    "evalkit.tasks.linear_probe:LinearProbe": classification_tables,
    "evalkit.tasks.model_vs_human:ModelVsHuman": human_alignment_tables,
    "evalkit.tasks.segmentation:Segmentation": segmentation_tables,
    "evalkit.tasks.video:VideoClassification": classification_tables,
    "evalkit.tasks.zeroshot:Lit": classification_tables,
    "evalkit.tasks.zeroshot:ZeroShot": classification_tables,
}
