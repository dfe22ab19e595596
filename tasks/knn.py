"""k-nearest-neighbour classification on frozen features (DINO's protocol; docs/protocols.md,
"kNN"): the cheapest probe, no training.

Features of the train and eval splits are extracted once (cached) as ``imagenet-linear``
extracts them; the eval images' k nearest training images by cosine similarity vote with
weight exp(sim / T), T = 0.07 (``weighting=uniform`` for one vote each). ``ks`` lists the k
values scored in one pass (default 20; DINO reports 10, 20, 100, 200). The training features
are read a cache shard at a time (``chunk`` rows at most), so memory is about chunk × eval
images similarities. Any classification dataset: ``--set dataset=...``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.core.task import POSITIVE, Metric, Rule, one_of, setting
from evalkit.errors import EvalkitError
from evalkit.heads.knn import TEMPERATURE, nearest, vote
from evalkit.metrics import reported_ks
from evalkit.protocols.classification import FrozenClassification, percent
from evalkit.protocols.predictions import save_classifications, scored_hits

POSITIVE_INTS = Rule(
    "a non-empty list of distinct positive whole numbers",
    lambda v: bool(v) and all(int(k) == k and k > 0 for k in v) and len(set(v)) == len(v),
)


@dataclass(frozen=True)
class KNN(FrozenClassification):
    name: str = "imagenet-knn"
    ks: tuple[int, ...] = setting((20,), POSITIVE_INTS)
    temperature: float = setting(TEMPERATURE, POSITIVE)
    weighting: str = setting("exp", one_of("exp", "uniform"))
    chunk: int = setting(65536, POSITIVE)  # training rows compared at once (cache shards)
    query_chunk: int = setting(4096, POSITIVE)  # eval rows at once
    # bf16: candidates, fp32 ranking, fp32 search where it could miss; auto: bf16 where fast
    search: str = setting("auto", one_of("auto", "fp32", "bf16"))

    version = 1

    def metrics(self) -> list[str]:
        return [f"top{t}/k={k}" for k in self.ks for t in (1, 5)]

    def check_training(self, classes: list[str], counts: list[int]):
        """k neighbours need at least k training images."""
        if max(self.ks) > sum(counts):
            raise EvalkitError(
                f"ks={','.join(map(str, self.ks))}: the training split has {sum(counts)} "
                f"images, so k can be at most {sum(counts)}"
            )

    def run(self, backbone, ctx):
        train, test, space, test_set = self.split_features(backbone, ctx)
        classes = int(train.labels.max()) + 1
        scores = {k: [] for k in self.ks}
        for start in range(0, len(test), self.query_chunk):
            queries = test.take(torch.arange(start, min(start + self.query_chunk, len(test))))
            queries = queries.float().to(ctx.device)  # the search runs on the device
            sims, labels = nearest(self.train_chunks(train), queries, max(self.ks), self.search)
            for k in self.ks:
                votes = vote(sims, labels, k, classes, self.weighting, self.temperature)
                scores[k].append(votes.cpu())
        extra = {
            "n_train": len(train),
            "weighting": self.weighting,
            "temperature": self.temperature,
            "num_classes": classes,
        }
        for k in self.ks:
            logits = torch.cat(scores[k])
            if k == self.ks[0]:
                save_classifications(ctx, logits, test.labels, test_set, space, kind="votes")
            for t in reported_ks(classes):
                hits = scored_hits(logits, test.labels, space, t)
                yield Metric(f"top{t}/k={k}", percent(hits), n=len(test), extra=extra)

    def train_chunks(self, train):
        """(features, labels) of at most ``chunk`` training rows at a time."""
        for start in range(0, len(train), self.chunk):
            index = torch.arange(start, min(start + self.chunk, len(train)))
            for rows, part in train.by_shard(index):
                yield rows, train.labels[part]
