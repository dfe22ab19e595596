"""Zero-shot classification with a text tower (effect-table row 6; docs/protocols.md,
"Zero-shot").

Prompts follow the text tower they are fed to. ``verbatim``: each template filled with the
class name exactly as written (``template.format(name)``), as OpenAI's CLIP and open_clip
report ImageNet with (open_clip's ``build_zero_shot_classifier``); the default for open_clip
towers. ``canonical``: names and templates canonicalised as big_vision's LiT evaluators do
("_" → space, punctuation removed except the alias separator "," in names and the slot "{}" in
templates, lower case, whitespace collapsed; every comma-separated alias prompted); the default
for LiT towers. Each class's embedding is the L2-normalised mean of the normalised embeddings
of its prompts. An image is scored by the dot product of its normalised embedding with the
class embeddings, restricted to the label space's candidate classes; a prediction is right when
it is one of the image's correct classes.
"""

from __future__ import annotations

import json
import pickle
import re
import string
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.storage.identity import spec_key
from evalkit.storage.writes import replacing

TEMPLATE_SETS: dict[str, list[str]] = json.loads(
    resources.files("evalkit.data").joinpath("meta", "templates.json").read_text()
)
SLOT = "{}"


def canonicalize(text: str, *, keep: str | None = None) -> str:
    """Lower case, "_" as a space, punctuation removed (except ``keep``, kept verbatim),
    whitespace collapsed."""
    drop = str.maketrans("", "", string.punctuation)
    text = text.replace("_", " ")
    parts = text.split(keep) if keep else [text]
    text = (keep or "").join(part.translate(drop) for part in parts).lower()
    return re.sub(r"\s+", " ", text).strip()


PROMPT_STYLES = ("verbatim", "canonical")


def templates(name: str, style: str = "canonical") -> list[str]:
    """A named template set, or a text file of one template per line, each with one ``{}``
    where the class name goes (blank lines and lines starting with ``#`` are skipped); as
    written (``verbatim``) or canonicalised."""
    if name in TEMPLATE_SETS:
        raw = TEMPLATE_SETS[name]
    elif is_template_file(name):
        raw = template_file_lines(Path(name))
    else:
        raise EvalkitError(
            f"unknown template set {name!r}: choose from {', '.join(TEMPLATE_SETS)}, or name a "
            "text file of templates (one per line, each with {})"
        )
    return list(raw) if style == "verbatim" else [canonicalize(t, keep=SLOT) for t in raw]


def is_template_file(name: str) -> bool:
    return name not in TEMPLATE_SETS and ("/" in name or name.endswith(".txt"))


def template_file_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise EvalkitError(
            f"template file not found: {path} (one template per line, each with {{}})"
        )
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    bad = [line for line in lines if line.count(SLOT) != 1]
    if not lines or bad:
        raise EvalkitError(
            f"{path}: every template needs exactly one {{}} for the class name"
            + (f", not {bad[0]!r}" if bad else " (the file has none)")
        )
    return lines


def prompts(name: str, template_list: list[str], *, first_alias=False, style="canonical"):
    """Every prompt of one class. Verbatim: each template filled with the name as written
    (its first comma-separated alias with ``first_alias``). Canonical: each template filled
    with each canonicalised alias."""
    if style == "verbatim":
        name = name.split(",")[0].strip() if first_alias else name
        return [t.replace(SLOT, name) for t in template_list]
    aliases = [a.strip() for a in canonicalize(name, keep=",").split(",") if a.strip()]
    if first_alias:
        aliases = aliases[:1]
    return [t.replace(SLOT, alias) for t in template_list for alias in aliases]


def names_id(names) -> str:
    """A hash of a class-name list, recorded in rows."""
    return spec_key(list(names), length=12)


@dataclass(frozen=True)
class Prompting:
    """What a classifier is built from: class names, templates, and whether only each
    name's first alias is used."""

    names: tuple[str, ...]
    templates: tuple[str, ...]
    first_alias: bool = False
    style: str = "canonical"  # one of PROMPT_STYLES

    def key(self, tower_id: str) -> str:
        return spec_key({"tower": tower_id, **asdict(self)}, length=24)


@torch.no_grad()
def class_embeddings(tower, prompting: Prompting, *, batch: int = 256) -> torch.Tensor:
    """(classes, E): per class, the normalised mean of its prompts' normalised embeddings."""
    out = []
    for name in prompting.names:
        texts = prompts(
            name,
            list(prompting.templates),
            first_alias=prompting.first_alias,
            style=prompting.style,
        )
        if not texts:
            raise EvalkitError(f"class name {name!r} is empty after canonicalisation")
        parts = [
            tower.encode(tower.tokenize(texts[i : i + batch])) for i in range(0, len(texts), batch)
        ]
        mean = torch.nn.functional.normalize(torch.cat(parts).float(), dim=-1).mean(0)
        out.append(torch.nn.functional.normalize(mean, dim=-1, eps=1e-8))
    return torch.stack(out)


def stored_class_embeddings(
    tower, prompting: Prompting, *, tower_id: str, folder: Path
) -> torch.Tensor:
    """``class_embeddings``, kept under ``folder/classifiers``: thousands of prompts through a
    text tower are computed once per (tower, names, templates), not once per test set."""
    path = Path(folder) / "classifiers" / f"{prompting.key(tower_id)}.pt"
    if path.exists():
        try:
            return torch.load(path, weights_only=True)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError):  # damaged: recompute
            path.unlink(missing_ok=True)
    embeddings = class_embeddings(tower, prompting)
    with replacing(path) as tmp:
        torch.save(embeddings, tmp)
    return embeddings


def restricted(scores: torch.Tensor, candidates) -> torch.Tensor:
    """Scores with every class outside ``candidates`` at -inf."""
    masked = torch.full_like(scores, float("-inf"))
    keep = torch.tensor(candidates, device=scores.device)
    masked[:, keep] = scores[:, keep]
    return masked


def label_space_hits(scores: torch.Tensor, labels: torch.Tensor, space, k: int) -> torch.Tensor:
    """Per image, whether any of its top-``k`` classes (among the candidates) is correct.
    ``scores`` is (N, classes), ``labels`` the images' own labels, ``space`` a LabelSpace.
    Computed on the scores' device; the hits come back on the CPU, beside the labels."""
    if space.candidates is not None:
        scores = restricted(scores, space.candidates)
    top = scores.topk(
        min(k, scores.shape[1] if space.candidates is None else len(space.candidates)), dim=1
    ).indices
    correct = torch.zeros(len(space.correct), scores.shape[1], dtype=torch.bool)
    for label, ids in enumerate(space.correct):
        correct[label, list(ids)] = True
    rows = torch.arange(len(labels))[:, None]
    return correct[labels.cpu()][rows, top.cpu()].any(dim=1)
