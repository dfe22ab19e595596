"""The built-in task names. Listing them imports nothing heavy; each entry points at a
factory in ``evalkit.tasks`` (the top-level ``tasks/`` folder) that builds the Task."""

from __future__ import annotations

from evalkit.registry import Registry

TASKS = Registry("task", "evalkit.tasks")

TASKS.add(
    "imagenet-linear",
    "evalkit.tasks.linear_probe:imagenet_linear",
    "ImageNet-1k linear probe: L-BFGS logistic regression, L2 swept (paper: ViT-22B 89.5)",
)
for _shots in (1, 5, 10, 25):
    TASKS.add(
        f"imagenet-{_shots}shot",
        f"evalkit.tasks.fewshot:imagenet_{_shots}shot",
        f"ImageNet-1k {_shots}-shot closed-form ridge probe, mean ± std over seeds",
    )
