"""The scales the paper's effect table runs at (docs/protocols.md, "Effect table"): ``tiny``
(embedded data on a CPU), ``smoke`` (a few steps each, to check the machinery) and ``paper``
(the paper's models, and its settings where they are known: ``PAPER_SETTINGS``), with the
measures that run with one seed and why."""

from __future__ import annotations

from dataclasses import dataclass

# The backbones that are the paper's models at scale ``paper`` (``--backbone ROLE=SPEC`` changes one)
PAPER_BACKBONES = {
    "ViT-L/32": "timm/vit_large_patch32_384",
    "ViT-G": "vit22b/g",
    "ViT-e": "vit22b/e",
    "ViT-22B": "vit22b",
}


# The paper's settings where they are known (docs/protocols.md); the others are the usual
# published recipes for the protocol, named in the comments.
_PAPER_TIMING = ("size=g", "image=224", "patch=14", "batch_size=64", "steps=1000", "timed_steps=20")


# ADE20k: the backbone fine-tuned with a linear decoder at the paper's 504 px (its
# data-fraction table); 40k iterations at batch 16 and sliding windows from mmseg's recipe
_PAPER_ADE = (
    "finetune=true",
    "image_size=504",
    "head=linear",
    "finetune_steps=40000",
    "finetune_batch_size=16",
    "eval_mode=slide",
    "augment=mmseg",
)


# depth: the DPT/DINOv2 head schedule, 38,400 iterations at batch 16; DPT's fusion width 256
_PAPER_DEPTH = ("steps=38400", "batch_size=16", "image_size=448", "channels=256")


PAPER_SETTINGS = {
    # ~8B diverged without QK-norm after a few thousand steps; ViT-e is the family's nearest size
    "qk-norm-stability": (
        "size=e",
        "image=224",
        "patch=14",
        "steps=5000",
        "batch_size=1024",
        "warmup=500",
        "lrs=1e-3,3e-3",
    ),
    "qk-norm-lr": (
        "sizes=s,b,l",
        "image=224",
        "patch=16",
        "steps=10000",
        "batch_size=1024",
        "warmup=1000",
    ),
    # ViT-G-sized variants: one GPU trains them without sharding
    "bias-efficiency": _PAPER_TIMING,
    "parallel-efficiency": _PAPER_TIMING,
    "imagenet-linear": (),
    # LiT: 5,000 steps at batch 4,096 (the public lit_coco recipe), a ViT-B-sized text tower
    # (image features: the model's own MAP head; ViT-22B has no class token for LiT's)
    "lit-objectnet": (
        "steps=5000",
        "batch_size=4096",
        "width=768",
        "text_layers=12",
        "heads=12",
        "warmup=500",
        "pool=map",
    ),
    "ade20k-1/16": _PAPER_ADE,
    "ade20k-1/1": _PAPER_ADE,
    "waymo-depth-dpt": _PAPER_DEPTH,
    "waymo-depth-linear": _PAPER_DEPTH,
    # video: 16 frames at stride 4, 8 segments × 3 crops at test, ~20 epochs at batch 256
    "kinetics400": (
        "frames=16",
        "stride=4",
        "segments=8",
        "crops=3",
        "steps=20000",
        "batch_size=256",
    ),
    # calibration of the classifier fine-tuned at 384 px: batch 512 as 8 micro-batches of 64
    "imagenet-c-ece": (
        "finetune=true",
        "finetune_resolution=384",
        "finetune_steps=20000",
        "finetune_batch_size=64",
        "finetune_accumulate=8",
    ),
    # a ViT-B/16 student, consistent teaching: 90 ImageNet epochs at batch 1,024
    "distill-imagenet": (
        "student=b",
        "student_image=384",
        "student_patch=16",
        "steps=112000",
        "batch_size=1024",
        "warmup=5000",
    ),
}


@dataclass(frozen=True)
class Scale:
    name: str
    ladder: tuple[str, str] = ("ti", "s")  # (stands in for ViT-e, for ViT-22B)
    pretrain_steps: int = 200
    ablation_steps: int = 150
    lrs: str = "1e-3,3e-1"
    head_steps: int = 150
    finetune_steps: int = 100
    image_size: int = 64  # dense tasks (a multiple of the ladder's patch, 8)
    student: str = "test"
    timed: str = "ti"  # the efficiency rows' model
    quality_steps: int = 100  # the efficiency rows' training budget per variant
    paper: bool = False  # the paper's models, real data, a sweep
    seeds: int = 2  # per scaling measure whose training depends on the seed (``ONE_SEED``)

    def settings(self) -> dict[str, tuple[str, ...]]:
        """Settings per task at this scale."""
        if self.paper:
            return PAPER_SETTINGS
        steps, dense = f"steps={self.ablation_steps}", f"image_size={self.image_size}"
        # ti: at the test size a step is too short to time against this machine's jitter
        timing = (
            f"size={self.timed}",
            "image=32",
            f"steps={self.quality_steps}",
            "rounds=9",
            "timed_steps=10",
        )
        ade = ("finetune=true", f"finetune_steps={self.finetune_steps}", dense)
        depth = (f"steps={self.head_steps}", dense)
        return {
            "qk-norm-stability": (f"lrs={self.lrs}", steps),
            "qk-norm-lr": (steps, "sizes=test,ti"),
            "bias-efficiency": timing,
            "parallel-efficiency": timing,
            "lit-objectnet": (f"steps={self.head_steps}",),
            "ade20k-1/16": ade,
            "ade20k-1/1": ade,
            "waymo-depth-dpt": depth,
            "waymo-depth-linear": depth,
            "kinetics400": (f"steps={self.head_steps}",),
            "imagenet-c-ece": ("severities=1,3,5",),
            "distill-imagenet": (f"student={self.student}", f"steps={self.head_steps}"),
        }


# Scaling measures run with one seed, and why; their interval is over the test items alone.
ONE_SEED = {
    "imagenet-linear": "the probe's fit does not depend on the seed (pinned optimum)",
    "imagenet-c-ece": "the probe's fit does not depend on the seed (pinned optimum)",
    "ade20k-1/16": "fine-tuning the backbone twice does not fit the tiny budget",
    "ade20k-1/1": "fine-tuning the backbone twice does not fit the tiny budget",
}


SCALES = {
    "tiny": Scale("tiny"),
    "smoke": Scale(
        "smoke",
        ladder=("test", "test"),
        pretrain_steps=4,
        ablation_steps=4,
        head_steps=4,
        finetune_steps=2,
        image_size=32,
        timed="test",
        quality_steps=4,
        seeds=1,
    ),
    "paper": Scale("paper", ladder=("", ""), paper=True, seeds=1),
}
