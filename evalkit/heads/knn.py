"""k-nearest-neighbour classification on frozen features (DINO's weighted kNN;
docs/protocols.md, "kNN").

Features are L2-normalised; each eval image's neighbours are the training images of highest
cosine similarity; neighbour i votes for its class with weight exp(sim_i / T) (T = 0.07), or 1
with ``weighting="uniform"``. The training features arrive in chunks and only the running
top-k (k = the largest requested) survives each chunk, so memory is about
chunk × eval images similarities, whatever the training split's size; several k come from
one pass, since the neighbours of k = 20 are the first 20 of k = 200.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

TEMPERATURE = 0.07


def nearest(train_chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], queries: torch.Tensor,
            k: int, search: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ``k`` most similar training rows of every query: (similarities, labels), each
    (Q, k), most similar first. ``train_chunks`` yields (features, labels). ``search="bf16"``
    finds 2k candidates per chunk with a bf16 product (several times faster on CPUs with bf16
    instructions and on GPUs) and ranks them by their exact float32 similarity."""
    queries = F.normalize(queries.float(), dim=1)
    best_sim = torch.full((len(queries), 0), -torch.inf, device=queries.device)
    best_lab = torch.zeros((len(queries), 0), dtype=torch.long, device=queries.device)
    for features, labels in train_chunks:
        features = F.normalize(features.float().to(queries.device), dim=1)
        # The chunk's own top-k first, so the merge with the running top-k stays k wide.
        sims, index = _chunk_top(queries, features, k, search)
        sims = torch.cat([best_sim, sims], dim=1)
        labs = torch.cat([best_lab, labels.to(queries.device)[index]], dim=1)
        best_sim, index = sims.topk(min(k, sims.shape[1]), dim=1)
        best_lab = labs.gather(1, index)
    return best_sim, best_lab


def _chunk_top(queries, features, k: int, search: str):
    if search == "fp32":
        return (queries @ features.T).topk(min(k, len(features)), dim=1)
    rough = queries.bfloat16() @ features.bfloat16().T
    candidates = rough.topk(min(2 * k, len(features)), dim=1).indices
    exact = torch.einsum("qd,qcd->qc", queries, features[candidates])
    sims, order = exact.topk(min(k, exact.shape[1]), dim=1)
    return sims, candidates.gather(1, order)


def vote(similarities: torch.Tensor, labels: torch.Tensor, k: int, classes: int,
         weighting: str = "exp", temperature: float = TEMPERATURE) -> torch.Tensor:  # fmt: skip
    """Class scores (Q, classes) from the first ``k`` neighbours: each adds exp(sim / T)
    (``exp``) or 1 (``uniform``) to its class."""
    sims, labs = similarities[:, :k], labels[:, :k]
    weights = (sims / temperature).exp() if weighting == "exp" else torch.ones_like(sims)
    scores = torch.zeros(len(sims), classes, dtype=weights.dtype, device=sims.device)
    return scores.scatter_add_(1, labs, weights)
