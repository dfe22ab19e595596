"""The built-in tasks, each declared once: a name, the task class and the settings that make
the variant. Listing them imports nothing heavy; ``evalkit.core.runner.resolve_task`` builds
``Class(name=<name>, **settings)``. Plugins add tasks under the entry-point group
``evalkit.tasks`` (a Task class that takes ``name=`` and its defaults for the rest).
"""

from __future__ import annotations

from evalkit.errors import EvalkitError
from evalkit.registry import Registry

TASKS = Registry("task", "evalkit.tasks")


def resolve_task(name: str, overrides=()):
    """The task registered as ``name`` (or an alias of it), with its bracketed settings
    (``imagenet-linear[eval_split=imagenet-r]``, as suites list them) and then ``key=value``
    overrides."""
    base, inline = task_settings(name)
    entry = TASKS.get(base)
    task = entry.load()(name=entry.canonical, **entry.params)
    return task.with_overrides([*inline, *(overrides or ())])


def task_settings(name: str) -> tuple[str, list[str]]:
    """``task[key=value,key=value]`` → (task, ["key=value", ...]); a plain name has none.
    A value with commas (a tuple setting) is written with ``;`` between its items."""
    base, bracket, rest = name.partition("[")
    if not bracket:
        return name, []
    if not rest.endswith("]") or not rest[:-1].strip():
        raise EvalkitError(
            f"task {name!r}: expected task[key=value,...], e.g. imagenet-linear[eval_split=imagenet-r]"
        )
    pairs = [p.strip().replace(";", ",") for p in rest[:-1].split(",") if p.strip()]
    return base.strip(), pairs


def declared_by(task: str | None, declared: dict, attribute: str, default):
    """What ``task`` declares as ``attribute`` (its paired test, its error tables): for a
    built-in task read from ``declared`` (catalog class → value) without importing the task
    and torch, for any other built and asked; ``default`` for a task not known here."""
    try:
        target = TASKS.get(task_settings(task)[0]).target if task else None
    except EvalkitError:
        target = None
    if target in declared:
        return declared[target]
    try:
        built = resolve_task(task) if task else None
    except (EvalkitError, ImportError):  # a plugin whose module cannot load declares nothing
        built = None
    return default if built is None else getattr(built, attribute, default)


def alias_note(name: str) -> str | None:
    """A note when ``name`` is an alias, naming the real task."""
    entry = TASKS.get(task_settings(name)[0])
    return f"{name!r} is an alias of {entry.alias_of!r}" if entry.alias_of else None


TASKS.add(
    "imagenet-linear",
    "evalkit.tasks.linear_probe:LinearProbe",
    "ImageNet-1k linear probe: L-BFGS logistic regression, L2 swept (paper: ViT-22B 89.5)",
)
TASKS.add(
    "imagenet-knn",
    "evalkit.tasks.knn:KNN",
    "ImageNet-1k weighted kNN on frozen features (DINO: cosine, exp(sim/0.07) votes; --set ks=10,20)",
)
for _shots in (1, 5, 10, 25):
    TASKS.add(
        f"imagenet-{_shots}shot",
        "evalkit.tasks.fewshot:FewShot",
        f"ImageNet-1k {_shots}-shot closed-form ridge probe, mean ± std over seeds",
        shots=_shots,
    )
_FRACTIONS = {"1/16": 1 / 16, "1/8": 1 / 8, "1/4": 1 / 4, "1/2": 1 / 2, "1/1": 1.0}
for _fraction, _value in _FRACTIONS.items():
    TASKS.add(
        f"ade20k-{_fraction}",
        "evalkit.tasks.segmentation:Segmentation",
        f"ADE20k segmentation, {_fraction} of the training images; head linear|upernet (mIoU)",
        aliases=(f"adek20k-{_fraction}",),
        fraction=_value,
    )
_DEPTH = {"waymo": "Waymo Open (projected LiDAR)", "kitti": "KITTI (Garg crop)", "nyu": "NYU-v2"}
for _dataset, _what in _DEPTH.items():
    for _head in ("dpt", "linear"):
        TASKS.add(
            f"{_dataset}-depth-{_head}",
            "evalkit.tasks.depth:Depth",
            f"monocular depth, {_what}, frozen features + {_head} head (MSE, RMSE, AbsRel, δ)",
            dataset=_dataset,
            head=_head,
        )
_ZERO_SHOT = {
    "imagenet": ("imagenet", "val", "ImageNet-1k val"),
    "imagenet-v2": ("imagenet-v2", "test", "ImageNet-v2 matched frequency"),
    "imagenet-r": ("imagenet-r", "test", "ImageNet-R (its 200 classes)"),
    "imagenet-a": ("imagenet-a", "test", "ImageNet-A (its 200 classes)"),
    "imagenet-real": ("imagenet-real", "val", "ImageNet ReaL (any label of the image's set)"),
    "objectnet": ("objectnet", "test", "ObjectNet (classes mapped to ImageNet's)"),
}
for _set, (_dataset, _split, _what) in _ZERO_SHOT.items():
    TASKS.add(
        f"zeroshot-{_set}",
        "evalkit.tasks.zeroshot:ZeroShot",
        f"{_what} zero-shot with the backbone's text tower or a saved LiT tower (top-1)",
        dataset=_dataset,
        eval_split=_split,
    )
    TASKS.add(
        f"lit-{_set}",
        "evalkit.tasks.zeroshot:Lit",
        f"LiT: a text tower trained on cached image embeddings, then {_what} zero-shot (top-1)",
        dataset=_dataset,
        eval_split=_split,
    )
for _classes in (400, 600, 700):
    TASKS.add(
        f"kinetics{_classes}",
        "evalkit.tasks.video:VideoClassification",
        f"Kinetics-{_classes}: per-frame frozen features, a temporal head (head temporal|attentive|mean)",
        dataset=f"kinetics{_classes}",
    )
TASKS.add(
    "moments-in-time",
    "evalkit.tasks.video:VideoClassification",
    "Moments in Time: per-frame frozen features, a temporal head (head temporal|attentive|mean)",
    dataset="moments",
    train_split="training",
    eval_split="validation",
)
TASKS.add(
    "qk-norm-stability",
    "evalkit.tasks.stability:QKNormStability",
    "ablation: a small model trained with and without QK-norm over an LR sweep (max attention logit, loss)",
)
for _switch, _what in (
    ("bias", "with vs without QKV and LayerNorm biases"),
    ("parallel", "parallel vs sequential blocks"),
):
    TASKS.add(
        f"{_switch}-efficiency",
        "evalkit.tasks.efficiency:EfficiencyAblation",
        f"ablation: training throughput (interleaved) and quality, {_what}",
        switch="biases" if _switch == "bias" else "parallel",
    )
TASKS.add(
    "qk-norm-lr",
    "evalkit.tasks.stability:QKNormLR",
    "ablation: with QK-norm, LR kept at 1e-3 at every ladder size vs lowered with width (final loss)",
)
TASKS.add(
    "imagenet-ece",
    "evalkit.tasks.calibration:Calibration",
    "calibration on ImageNet val: ECE (15 bins), NLL, Brier, with and without temperature scaling",
)
TASKS.add(
    "imagenet-c-ece",
    "evalkit.tasks.calibration:Calibration",
    "calibration on ImageNet-C: ECE per corruption and severity, averaged as Plex/UB do",
    corrupted=True,
)
TASKS.add(
    "distill-imagenet",
    "evalkit.tasks.distillation:Distillation",
    "distillation: a student of the built-in family from the backbone + its classifier (consistent|cached)",
)
TASKS.add(
    "model-vs-human",
    "evalkit.tasks.model_vs_human:ModelVsHuman",
    "model-vs-human: OOD accuracy on 17 sets, shape bias, consistency with people (own head or probe)",
)
TASKS.add(
    "shape-bias",
    "evalkit.tasks.model_vs_human:ModelVsHuman",
    "shape bias on model-vs-human's cue-conflict images (shape vs texture decisions)",
    sets=("cue-conflict",),
)
for _target in ("smiling", "attractive"):
    TASKS.add(
        f"celeba-fairness-{_target}",
        "evalkit.tasks.fairness:Fairness",
        f"CelebA {_target}: linear head on frozen features, post-processed to demographic-parity levels",
        attribute=_target.capitalize(),
    )
