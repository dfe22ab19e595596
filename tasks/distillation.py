"""Distillation from a frozen teacher into a student trained from scratch (effect-table row
12; docs/protocols.md, "Distillation").

The teacher is the backbone under test with its classifier: the linear probe on frozen
features, or with ``--set finetune=true`` the fine-tuned backbone (evalkit.protocols.scorer). The
student is a size of the built-in family (``student``, at ``student_image`` px), trained by the
backbone trainer with the loss T²·KL(softmax(teacher/T) ‖ softmax(student/T)), plus
``label_weight`` × cross-entropy with the labels when asked (0 by default, as big_vision's
distillation has no label term). Two modes, named in the rows:

- ``consistent`` (function matching, the default): teacher and student see the same view of
  each image — an inception crop with a flip, mixed with the batch rolled by one (mixup with
  a ~ Beta(1, 1), a = max(a, 1 − a)) — and the teacher's logits are computed on the fly;
- ``cached``: the teacher's logits of the un-augmented images are computed once, and the
  student trains on augmented views against them.

The baseline is the same student trained on the same views with the labels only. Rows: top-1
of the teacher, the distilled student and the label-only student on the eval split, the
distilled student's gain, and how often each student agrees with the teacher's top-1.

Paper: a ViT-B/16 student reaches 86.7 on its own and 88.6 distilled from ViT-22B (384 px); a
ladder teacher and a tiny student on the stand-in measure the same effect at a small scale.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from evalkit.backbones.base import build_transform
from evalkit.core.task import NON_NEGATIVE, POSITIVE, Metric, Rule, Stage, one_of, setting
from evalkit.data.resolve import open_dataset
from evalkit.metrics import accuracy_stderr, mean_stderr
from evalkit.models.vit22b import build, config
from evalkit.parallel.sizing import forward_flops, training_flops
from evalkit.protocols.classification import percent
from evalkit.protocols.linear_classifier import LinearClassifier
from evalkit.protocols.scorer import Scorer
from evalkit.protocols.small_training import SIZE
from evalkit.schedule import declared_schedule
from evalkit.seeds import generator, seed_global
from evalkit.training.loop import fit, sampled_batches
from evalkit.training.pretrain import Classifier


@dataclass(frozen=True)
class Distillation(LinearClassifier):
    name: str = "distill-imagenet"
    student: str = setting("ti", SIZE)
    student_image: int = setting(32, POSITIVE)
    student_patch: int = setting(8, POSITIVE)
    mode: str = setting("consistent", one_of("consistent", "cached"))
    temperature: float = setting(1.0, POSITIVE)
    label_weight: float = setting(0.0, NON_NEGATIVE)
    mixup: bool = True  # consistent mode only
    steps: int = setting(300, POSITIVE)
    batch_size: int = setting(64, Rule("an even positive number", lambda v: v > 0 and v % 2 == 0))
    lr: float = setting(1e-3, POSITIVE)
    warmup: int = setting(30, NON_NEGATIVE)

    version = 2  # 2: batches, augmentations and mixup drawn by evalkit.seeds
    reference = {
        "top1/distilled": {"ViT-B/16 student of ViT-22B (384 px)": 88.6},
        "top1/label_only": {"ViT-B/16 (384 px)": 86.7},
    }

    def metrics(self) -> list[str]:
        return [
            "top1/teacher",
            "top1/distilled",
            "top1/label_only",
            "gain",
            "agreement/distilled",
            "agreement/label_only",
        ]

    def plan(self, inputs) -> list[Stage]:
        """The teacher's classifier, its logits for every student step (consistent) or once per
        training image (cached), and both students trained from scratch."""
        images = self.steps * self.batch_size
        passes = images if self.mode == "consistent" else inputs.sizes[self.train_split]
        student = config(self.student, image=self.student_image, patch=self.student_patch)
        students = 2 * (
            training_flops(student, images) + inputs.sizes[self.eval_split] * forward_flops(student)
        )
        return [
            *super().plan(inputs),
            Stage(
                "teacher logits",
                self.mode,
                forward_passes=passes,
                image=self.finetune_resolution if self.finetune else 0,
            ),
            Stage("train students", "distilled and label-only", flops=students),
        ]

    def run(self, backbone, ctx):
        teacher = Scorer.fit(self, backbone, ctx, refit_all=True)
        normalisation = (backbone.info.preprocess.mean, backbone.info.preprocess.std)
        train = IndexedViews(self.training_set(self._augment(backbone, teacher), ctx))
        teacher_logits, labels = teacher.score(self.dataset, self.eval_split)
        cached = teacher.score(self.dataset, self.train_split)[0] if self.mode == "cached" else None
        test = open_dataset(
            self.dataset,
            self.eval_split,
            ctx.data,
            transform=teacher.transform,
            classes=teacher.classes,
        )
        right = {"teacher": teacher_logits.argmax(1) == labels}
        agreement = {}
        for kind in ("distilled", "label_only"):
            student = Student(self, kind, teacher, cached, normalisation)
            logits = student.evaluate(student.train(train, ctx), test, ctx)
            right[kind] = logits.argmax(1) == labels
            agreement[kind] = percent(logits.argmax(1) == teacher_logits.argmax(1))
        top1 = {kind: percent(hits) for kind, hits in right.items()}
        extra = {
            **teacher.extra,
            "mode": self.mode,
            "temperature": self.temperature,
            "mixup": self.mixup and self.mode == "consistent",
            "student": self.student,
            "student_image": self.student_image,
            "student_steps": self.steps,
            "label_weight": self.label_weight,
        }
        n = len(labels)
        for kind, value in top1.items():
            yield Metric(
                f"top1/{kind}",
                value,
                stderr=accuracy_stderr(right[kind]),
                n=n,
                extra=extra,
            )
        paired = 100.0 * (right["distilled"].double() - right["label_only"].double())  # same images
        yield Metric(
            "gain",
            top1["distilled"] - top1["label_only"],
            stderr=mean_stderr(paired.numpy()),
            n=n,
            extra=extra,
        )
        for kind, value in agreement.items():
            yield Metric(f"agreement/{kind}", value, n=n, extra=extra)

    def _augment(self, backbone, teacher):
        """Training views at the teacher's resolution and normalisation: inception crop, flip."""
        pre = backbone.info.preprocess
        if teacher.tuned is not None:
            pre = dataclasses.replace(pre, size=teacher.extra["resolution"])
        return build_transform(pre, train=True)


@dataclass
class Student:
    """One student (``distilled`` or ``label_only``) and how it trains and is scored."""

    task: Distillation
    kind: str
    teacher: Scorer
    cached: torch.Tensor | None  # the teacher's logits of the un-augmented training images
    normalisation: tuple  # the teacher's (mean, std): views arrive normalised for it

    def train(self, train, ctx) -> Classifier:
        task = self.task
        cfg = config(task.student, image=task.student_image, patch=task.student_patch)
        seed_global(ctx.seed, "student-weights")
        model = Classifier(build(cfg, seed=ctx.seed), len(self.teacher.classes))
        schedule = declared_schedule(task, ctx.seed, checkpoint_every=10**9)
        # Mixing rolls the whole batch by one: each rank also loads the item before its share,
        # so its first image meets the partner one process would give it.
        lead = int(task.mixup and task.mode == "consistent")
        views = sampled_batches(train, task.batch_size, ctx.seed, lead=lead)

        def batch(step: int, micro: int):
            images, pairs = views(step, micro)
            mixed, lam = self.mix(images, generator(ctx.seed, "mixup", step, micro))
            return self.to_student(mixed)[lead:], self.targets(mixed, pairs, lam)[lead:]

        fit(
            model.to(ctx.device),
            batch,
            self.loss,
            schedule,
            device=ctx.device,
            progress=ctx.extract.progress,
        )
        return model

    def mix(self, images: torch.Tensor, draw: torch.Generator) -> tuple[torch.Tensor, float]:
        """Mixup with the batch rolled by one (consistent mode): a ~ Beta(1, 1) = U(0, 1), from
        ``draw``, a stream of its own (not the batch pick's)."""
        if not (self.task.mixup and self.task.mode == "consistent"):
            return images, 1.0
        a = torch.rand((), generator=draw).item()
        lam = max(a, 1 - a)
        return lam * images + (1 - lam) * images.roll(1, 0), lam

    def targets(self, mixed: torch.Tensor, pairs: torch.Tensor, lam: float) -> torch.Tensor:
        """Mixed one-hot labels beside the teacher's softened probabilities (zeros for the
        label-only student), as one tensor the trainer moves to the device."""
        labels, indices = pairs[:, 0], pairs[:, 1]
        onehot = F.one_hot(labels, len(self.teacher.classes)).float()
        onehot = lam * onehot + (1 - lam) * onehot.roll(1, 0)
        if self.kind == "label_only":
            return torch.cat([onehot, torch.zeros_like(onehot)], 1)
        logits = self.cached[indices] if self.cached is not None else self.teacher.logits_of(mixed)
        return torch.cat([onehot, torch.softmax(logits.cpu() / self.task.temperature, 1)], 1)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """T²·KL(teacher ‖ student) at temperature T, plus label_weight × cross-entropy."""
        onehot, soft = targets.chunk(2, dim=1)
        hard = -(onehot * F.log_softmax(logits, 1)).sum(1).mean()
        if self.kind == "label_only":
            return hard
        t = self.task.temperature
        kl = (soft * (soft.clamp_min(1e-12).log() - F.log_softmax(logits / t, 1))).sum(1).mean()
        return t**2 * kl + self.task.label_weight * hard

    def to_student(self, images: torch.Tensor) -> torch.Tensor:
        """The teacher's view at the student's size and normalisation (the same crop): uint8
        pixels (an evaluation view) or images the teacher's normalisation made."""
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in self.normalisation)
        size = (self.task.student_image,) * 2
        unit = images.float() / 255 if images.dtype == torch.uint8 else images * std + mean
        small = F.interpolate(unit, size=size, mode="bilinear", antialias=True, align_corners=False)
        return (small - 0.5) / 0.5  # the family's normalisation

    @torch.no_grad()
    def evaluate(self, model, test, ctx) -> torch.Tensor:
        loader = torch.utils.data.DataLoader(test, batch_size=ctx.extract.batch_size)
        model.eval()
        return torch.cat(
            [model(self.to_student(x).to(ctx.device)).float().cpu() for x, _ in loader]
        )


class IndexedViews(torch.utils.data.Dataset):
    """Items (view, (label, index)): the index finds the cached teacher logits of an image."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.classes = dataset.classes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        view, label = self.dataset[index]
        return view, torch.tensor([label, index])
