"""k-nearest-neighbour classification on frozen features (DINO's weighted kNN;
docs/protocols.md, "kNN").

Features are L2-normalised; each eval image's neighbours are the training images of highest
cosine similarity; neighbour i votes for its class with weight exp(sim_i / T) (T = 0.07), or 1
with ``weighting="uniform"``. The training features arrive in chunks and only the running
top-k (k = the largest requested) survives each chunk; the chunks are read once and met by
the queries a block at a time, so memory is about chunk × block similarities, whatever the
training split's size, on whatever device the queries are; several k come from one pass,
since the neighbours of k = 20 are the first 20 of k = 200.

The bf16 search is exact too: it takes 2k candidates per chunk from a bf16 product and ranks
them by their float32 similarity, and a query whose k-th exact similarity does not clear the
2k-th rough one (4k-th for a second try) by the bf16 product's error bound is searched again in float32 on that chunk.
``search="auto"`` uses it where bf16 products are fast (a GPU, or a CPU with bf16 instructions).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

TEMPERATURE = 0.07
QUERY_BLOCK = 4096  # queries per similarity product (a bf16 search: 1024, its gathers are wide)
CANDIDATES = (2, 4)  # a bf16 search ranks 2k candidates exactly, 4k for a query it cannot
# certify with 2k (a fifth of the queries of 100k × 768 features; with 4k, none), then fp32
TRAIN_BLOCK = 4096  # training rows per similarity product: 64 MB of fp32 similarities
# How far a bf16 similarity of two unit vectors can be from the fp32 one: each entry rounded to
# 8 significant bits (2·2^-9 of Σ|q_i·x_i| ≤ 1), the bf16 result rounded again (2^-9); the fp32
# sums' own rounding (dim·2^-24, twice) is added per call.
BF16_ERROR = 2**-8 + 2**-9 + 2**-16


def nearest(train_chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], queries: torch.Tensor,
            k: int, search: str = "fp32", block: int = QUERY_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ``k`` most similar training rows of every query: (similarities, labels), each
    (Q, k), most similar first, on the queries' device. ``train_chunks`` yields (features,
    labels) and is read once: each chunk is normalised and laid out column by column once,
    and met by the queries ``block`` at a time, ``TRAIN_BLOCK`` columns at a time, the
    similarities written into one reused buffer (a fresh 100-MB product per step costs more
    in page faults than its top-k). ``search="bf16"`` finds 2k (or 4k) candidates per chunk with a
    bf16 product (several times faster on CPUs with bf16 instructions and on GPUs) and ranks
    them by their exact float32 similarity, with a float32 search wherever that could have
    missed a neighbour (``search="auto"``: bf16 where ``fast_bf16``)."""
    if search == "auto":
        search = "bf16" if fast_bf16(queries.device) else "fp32"
    queries = F.normalize(queries.float(), dim=1)
    block = block if search == "fp32" else min(block, 1024)
    blocks = [slice(s, s + block) for s in range(0, len(queries), block)]
    best = [_empty(queries[b], k) for b in blocks]
    buffer = queries.new_empty(min(block, len(queries)), TRAIN_BLOCK)
    for features, labels in train_chunks:
        features = F.normalize(features.float().to(queries.device), dim=1)
        labels = labels.to(queries.device)
        columns = features.T.contiguous()
        step = TRAIN_BLOCK
        if search == "bf16":  # converted once; candidates gathered once per chunk, not per block
            columns, step = columns.bfloat16(), len(features)
        for start in range(0, len(features), step):
            part = slice(start, start + step)
            for i, rows in enumerate(blocks):
                found = _block_top(queries[rows], columns[:, part], features[part], k, buffer)
                best[i] = _merge(best[i], found, labels[part], k)
    return torch.cat([b[0] for b in best]), torch.cat([b[1] for b in best])


def _empty(queries: torch.Tensor, k: int):
    return (queries.new_full((len(queries), 0), -torch.inf),
            torch.zeros((len(queries), 0), dtype=torch.long, device=queries.device))  # fmt: skip


def _merge(best, found, labels, k: int):
    """The running top-k of a query block and a chunk's own top-k, still k wide."""
    sims, index = found
    sims = torch.cat([best[0], sims], dim=1)
    labs = torch.cat([best[1], labels[index]], dim=1)
    top, order = sims.topk(min(k, sims.shape[1]), dim=1)
    return top, labs.gather(1, order)


def _block_top(queries, columns, features, k: int, buffer):
    """The top-k of one query block against one block of training columns (D, C): exact
    when the columns are fp32; from 2k (or 4k) bf16 candidates re-ranked in fp32 when bf16, the
    queries whose candidates cannot be shown to hold their k nearest searched in fp32."""
    if columns.dtype == torch.float32:
        sims = torch.mm(queries, columns, out=buffer[: len(queries), : columns.shape[1]])
        return sims.topk(min(k, columns.shape[1]), dim=1)
    rough = _bf16_product(queries, columns)
    widths = [min(times * k, columns.shape[1]) for times in CANDIDATES]
    rough_top, candidates = rough.topk(widths[-1], dim=1)
    # a row outside the first w candidates has a bf16 similarity ≤ the w-th, so an exact one
    # ≤ that + the error bound: below the k-th exact candidate, it cannot be a neighbour
    slack = BF16_ERROR + 2 * queries.shape[1] * 2**-24
    rows = torch.arange(len(queries), device=queries.device)
    sims, index = _ranked(queries, features, candidates[:, : widths[0]], k)
    for width, wider in zip(widths, [*widths[1:], None], strict=True):
        if width == columns.shape[1]:  # every row was a candidate
            break
        rows = rows[sims[rows, -1] <= rough_top[rows, width - 1].float() + slack]
        if not len(rows):
            break
        if wider is None:  # still doubtful: the float32 search of the whole block
            sims[rows], index[rows] = (queries[rows] @ features.T).topk(k, dim=1)
        else:
            found = _ranked(queries[rows], features, candidates[rows, :wider], k)
            sims[rows], index[rows] = found
    return sims, index


def _ranked(queries, features, candidates, k: int):
    """The k candidates of highest float32 similarity, and the similarities."""
    exact = torch.einsum("qd,qcd->qc", queries, features[candidates])
    sims, order = exact.topk(min(k, exact.shape[1]), dim=1)
    return sims, candidates.gather(1, order)


def _bf16_product(queries: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """queries·columns in bf16 with float32 sums (the error bound assumes them): CUDA's
    reduced-precision reductions are switched off for the call."""
    if queries.device.type != "cuda":
        return queries.bfloat16() @ columns
    flags = torch.backends.cuda.matmul
    kept, flags.allow_bf16_reduced_precision_reduction = (
        flags.allow_bf16_reduced_precision_reduction,
        False,
    )
    try:
        return queries.bfloat16() @ columns
    finally:
        flags.allow_bf16_reduced_precision_reduction = kept


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 products outrun fp32 ones here: on a GPU, or a CPU with bf16 instructions
    (AVX-512 BF16 or AMX); elsewhere bf16 is emulated and slower."""
    return device.type == "cuda" or _cpu_has_bf16()


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def vote(similarities: torch.Tensor, labels: torch.Tensor, k: int, classes: int,
         weighting: str = "exp", temperature: float = TEMPERATURE) -> torch.Tensor:  # fmt: skip
    """Class scores (Q, classes) from the first ``k`` neighbours: each adds exp(sim / T)
    (``exp``) or 1 (``uniform``) to its class."""
    sims, labs = similarities[:, :k], labels[:, :k]
    weights = (sims / temperature).exp() if weighting == "exp" else torch.ones_like(sims)
    scores = torch.zeros(len(sims), classes, dtype=weights.dtype, device=sims.device)
    return scores.scatter_add_(1, labs, weights)
