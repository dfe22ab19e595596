"""Few-shot linear probes on frozen features (big_vision's protocol; paper: ViT-22B few-shot).

Protocol: ``seeds`` times, ``shots`` training images per class are drawn from a seeded
permutation of each class; features are whitened with the few-shot set's statistics, a
constant bias feature of 100 is appended, and a least-squares regression to {-1, +1} one-hot
targets with L2 strength ``l2`` (big_vision default 2¹⁰) is solved in closed form. Top-1 on
the eval split is reported as the mean ± std over the ``seeds`` draws. Each draw is seeded by
the one seed rule from the job's seed, ``"shots"`` and its index (``shot_seeds``), so the jobs
of two ``--seed`` values share no draw; the row's ``seeds`` are the draws' own seeds. Features
come from the same cache as the linear probe, so every k and every seed reuses one extraction.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from evalkit.core.task import BYTES, POSITIVE, Metric, Stage, setting
from evalkit.errors import EvalkitError
from evalkit.heads.linear import ridge_fewshot_hits
from evalkit.protocols.classification import SCORED_SETS, FrozenClassification
from evalkit.protocols.error_tables import few_shot_tables
from evalkit.protocols.paired_tests import few_shot_test
from evalkit.protocols.predictions import class_name, image_ids
from evalkit.seeds import derived_seed, generator


@dataclass(frozen=True)
class FewShot(FrozenClassification):
    name: str = "imagenet-5shot"
    shots: int = setting(5, POSITIVE)
    seeds: int = setting(3, POSITIVE)
    l2: float = setting(1024.0, POSITIVE)

    # 2: the spread over seeds is in ``std`` (it was in ``stderr``); 3: draws seeded by
    # (job seed, "shots", index), no longer job seed + index, and ``seeds`` records the draws'
    # seeds (it listed job seeds that never ran)
    version = 3

    paired_test = staticmethod(few_shot_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(few_shot_tables)  # declared in error_tables.DECLARED too

    def metrics(self) -> list[str]:
        return ["top1"]

    def check_training(self, classes: list[str], counts: list[int]):
        """Every class has ``shots`` images: fewer would draw the same few every seed."""
        smallest = min(range(len(classes)), key=counts.__getitem__)
        if counts[smallest] < self.shots:
            raise EvalkitError(
                f"{self.name}: class {classes[smallest]!r} has {counts[smallest]} training "
                f"images, fewer than shots={self.shots}: lower shots or add images"
            )

    def plan(self, inputs) -> list:
        """The shots in float64, and the eval split in its stored dtype plus a float64 copy."""
        dim = len(self.layers) * inputs.shape.embed_dim
        n_eval = inputs.sizes[self.eval_split]
        shots = self.shots * inputs.classes * dim * 8
        host = shots + n_eval * dim * (BYTES[inputs.storage] + 8)
        return [
            self.extraction_stage(inputs),
            Stage("few-shot ridge", "in memory", host_bytes=host),
        ]

    def run(self, backbone, ctx):
        if self.eval_split in SCORED_SETS:
            raise EvalkitError(
                f"{self.name} scores a split of {self.dataset}; a shifted test set "
                f"(eval_split={self.eval_split}) is scored by imagenet-linear"
            )
        train, test, _, test_set = self.split_features(backbone, ctx)
        num_classes = int(max(train.labels.max(), test.labels.max())) + 1
        seeds = shot_seeds(ctx.seed, self.seeds)
        x_test, hits = test.pooled, []
        for seed in seeds:
            pick = kshot_indices(train.labels, self.shots, seed=seed)
            shots = train.take(pick)  # reads only the shards that hold the shots
            hits.append(
                ridge_fewshot_hits(
                    shots,
                    train.labels[pick],
                    x_test,
                    test.labels,
                    num_classes=num_classes,
                    l2=self.l2,
                )
            )
        scores = [100.0 * h.double().mean().item() for h in hits]
        save_shot_hits(ctx, torch.stack(hits, dim=1), test.labels, test_set)
        yield Metric(
            "top1",
            statistics.fmean(scores),
            std=statistics.stdev(scores) if len(scores) > 1 else None,
            n=len(test.labels),
            seeds=seeds,
            extra={"per_seed": scores, "shots": self.shots, "l2": self.l2},
        )


def shot_seeds(seed: int, draws: int) -> list[int]:
    """The seed of each of a job's ``draws`` draws of shots, named by the job's ``seed``,
    ``"shots"`` and the draw's index: job seed + index would make the jobs of seeds 0 and 1
    share two of their three draws."""
    return [derived_seed(seed, "shots", index) for index in range(draws)]


def kshot_indices(labels: torch.Tensor, shots: int, *, seed: int) -> torch.Tensor:
    """The first ``shots`` of a seeded permutation of each class (fewer if a class is small)."""
    gen = generator(seed, "shot-pick")
    picks = []
    for cls in labels.unique():
        idx = torch.nonzero(labels == cls).squeeze(1)
        picks.append(idx[torch.randperm(len(idx), generator=gen)[:shots]])
    return torch.cat(picks)


def save_shot_hits(ctx, hits: torch.Tensor, labels: torch.Tensor, dataset):
    """Per test image (``--save-predictions``): its file and label (index and class name, as
    the other classification tasks keep them), whether each draw's probe got it right, and
    the share of draws that did (whose mean over images × 100 is the top-1)."""
    ids, names = image_ids(dataset), list(getattr(dataset, "classes", []))
    ctx.save_predictions(
        {
            "image": ids if len(ids) == len(labels) else [str(i) for i in range(len(labels))],
            "label": labels.tolist(),
            "label_name": [class_name(names, label) for label in labels.tolist()],
            "correct_by_seed": hits.tolist(),
            "correct_share": hits.double().mean(dim=1).tolist(),
        }
    )
