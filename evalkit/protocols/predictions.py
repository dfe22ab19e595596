"""Per-image predictions of the classification tasks (``--save-predictions``), as Parquet beside
the rows: each image's label and prediction in the space that was scored, its top-5 classes with
their raw scores and their probabilities, and what those probabilities are (``SCORE_KINDS``);
``evalkit errors`` reads them (docs/results.md, "Predictions")."""

from __future__ import annotations

import os

import torch

from evalkit.data.resolve import reading_of
from evalkit.heads.zeroshot import label_space_hits, restricted
from evalkit.metrics import topk_hits

SCORE_KINDS = {  # what a task's scores are, and how they become probabilities
    "logits": "softmax of the classifier's logits",
    "votes": "share of the neighbours' weighted votes",
    "probabilities": "the model's averaged class probabilities",
    "similarities": "softmax of 100 × cosine similarity (CLIP's convention)",
}


def as_probabilities(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """Scores of ``kind`` (``SCORE_KINDS``) as probabilities over the scored classes."""
    scores = scores.double()
    if kind == "logits":
        return scores.softmax(dim=1)
    if kind == "similarities":
        return (100.0 * scores).softmax(dim=1)
    scores = scores.clamp_min(0)  # classes outside a restricted space are at -inf
    return scores / scores.sum(dim=1, keepdim=True).clamp_min(1e-300)


def save_classifications(
    ctx, scores: torch.Tensor, labels: torch.Tensor, dataset, space, *, kind: str = "logits"
):
    """One row per eval image (``--save-predictions``), in the space that was scored: the
    prediction and top-5 among the candidate classes only, with their names, scores and
    probabilities (``kind`` says what the scores are); the image's label as an index of the
    same classes (``label_classes``: every class counted correct, for ObjectNet's many-to-one
    mapping) and its name; and whether top-1 was right."""
    if ctx.predictions is None:
        return
    own = list(getattr(dataset, "classes", []))
    if space is None:  # the classifier's classes are the set's own
        names, correct = own, [(label,) for label in range(max(len(own), scores.shape[1]))]
    else:
        names, correct = list(space.names), space.correct
        if space.candidates is not None:
            scores = restricted(scores, space.candidates)
    scorable = (
        scores.shape[1] if space is None or space.candidates is None else len(space.candidates)
    )
    top = scores.float().topk(min(5, scorable), dim=1)
    probabilities = as_probabilities(scores, kind).gather(1, top.indices)
    label_classes = [list(correct[label]) for label in labels.tolist()]
    ids = image_ids(dataset)
    ctx.save_predictions(
        {
            "image": ids if len(ids) == len(labels) else [str(i) for i in range(len(labels))],
            "label": [classes[0] if classes else -1 for classes in label_classes],
            "label_classes": label_classes,
            "label_name": [
                label_name(own, names, label, classes)
                for label, classes in zip(labels.tolist(), label_classes, strict=True)
            ],
            "prediction": top.indices[:, 0].tolist(),
            "prediction_name": [class_name(names, i) for i in top.indices[:, 0].tolist()],
            "top5": top.indices.tolist(),
            "top5_names": [[class_name(names, i) for i in row] for row in top.indices.tolist()],
            "top5_scores": top.values.tolist(),
            "top5_probabilities": probabilities.tolist(),
            "score_kind": [SCORE_KINDS[kind]] * len(labels),
            "correct": scored_hits(scores, labels, space, 1).tolist(),
        }
    )


def class_name(names: list[str], index: int) -> str:
    return names[index] if 0 <= index < len(names) else str(index)


def label_name(own: list[str], names: list[str], label: int, classes: list[int]) -> str:
    """The scored class's name when the image has one correct class, else its own class's
    (an ObjectNet class that several ImageNet classes map to)."""
    return class_name(names, classes[0]) if len(classes) == 1 else class_name(own, label)


def image_ids(dataset) -> list[str]:
    """Each item's file path relative to the dataset's root where it has one, else its index:
    the same cell run on copies of the data at two places writes the same per-image files."""
    samples = getattr(dataset, "samples", None)
    images = [sample[0] for sample in samples] if samples is not None else None
    if images is None:
        images = getattr(dataset, "images", None)
    if images is None:
        return [str(i) for i in range(len(dataset))]
    root = reading_of(dataset).root or getattr(dataset, "root", None)
    return [relative_id(path, root) for path in images]


def relative_id(path, root) -> str:
    """``path`` relative to ``root`` when it lies under it; else as it is (a reader's own
    naming, or a file reached from elsewhere)."""
    path = os.fspath(path)
    if root is None or not isinstance(path, str):
        return str(path)
    prefix = os.path.join(os.fspath(root), "")
    return path[len(prefix) :] if path.startswith(prefix) else path


def scored_hits(scores: torch.Tensor, labels: torch.Tensor, space, k: int) -> torch.Tensor:
    """Top-k hits against the labels, or, for a test set with its own label space, within its
    candidate classes against each image's correct set."""
    if space is None:
        return topk_hits(scores, labels, k)
    return label_space_hits(scores, labels, space, k)
