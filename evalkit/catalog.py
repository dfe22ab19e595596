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
for _fraction in ("1/16", "1/8", "1/4", "1/2", "1/1"):
    TASKS.add(
        f"ade20k-{_fraction}",
        f"evalkit.tasks.segmentation:ade20k_{_fraction.replace('/', '_')}",
        f"ADE20k segmentation, {_fraction} of the training images; head linear|upernet (mIoU)",
        aliases=(f"adek20k-{_fraction}",),
    )
_DEPTH = {"waymo": "Waymo Open (projected LiDAR)", "kitti": "KITTI (Garg crop)", "nyu": "NYU-v2"}
for _dataset, _what in _DEPTH.items():
    for _head in ("dpt", "linear"):
        TASKS.add(
            f"{_dataset}-depth-{_head}",
            f"evalkit.tasks.depth:{_dataset}_depth_{_head}",
            f"monocular depth, {_what}, frozen features + {_head} head (MSE, RMSE, AbsRel, δ)",
        )
