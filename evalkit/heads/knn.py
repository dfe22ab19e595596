"""k-nearest-neighbour classification on frozen features (DINO's weighted kNN;
docs/protocols.md, "kNN").

Features are L2-normalised; each eval image's neighbours are the training images of highest
cosine similarity; neighbour i votes for its class with weight exp(sim_i / T) (T = 0.07), or 1
with ``weighting="uniform"``. The training features arrive in chunks and only the running
top-k (k = the largest requested) survives each chunk; the chunks are read once and met by
the queries a block at a time, so memory is about block × ``TRAIN_BLOCK`` similarities plus one
chunk's features, whatever the training split's size, on whatever device the queries are;
several k come from one pass, since the neighbours of k = 20 are the first 20 of k = 200.

One answer whatever the search: a fast product (float32, or bf16 where that is fast) only
proposes candidates; the neighbours are always the candidates of highest float64 similarity,
equal similarities ordered by training index. Where a query's k-th rough similarity is more
than twice the product's error bound above its (k+1)-th, its k neighbours are proven by the
rough product alone and only those k rows are gathered to be ordered exactly. The others (near
ties) are ranked exactly among 2k candidates (bf16: then 4k); a query whose k-th float64
similarity still does not clear the best rough similarity left out by the error bound is
ranked by float64 over the whole chunk.
So ``search="fp32"``, ``"bf16"`` and ``"auto"`` give the same neighbours, in the same order,
on any CPU or GPU, duplicate and near-duplicate training rows included.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from evalkit.device import fast_bf16, on_free_cores

TEMPERATURE = 0.07
QUERY_BLOCK = 1024  # queries per rough product
TRAIN_BLOCK = 4096  # training columns per rough product: 16 MB of fp32 similarities a block
# candidates ranked exactly for a query the rough top-k does not prove: 2k, then 4k (bf16,
# whose error bound is wider) before the whole chunk
CANDIDATES = {torch.float32: (2,), torch.bfloat16: (2, 4)}
GROUP = 64  # columns met by their maximum first when looking for rough similarities above a floor
EXACT_BYTES = 2**21  # float64 candidate rows gathered at once when ranking them exactly
GRID = 2**25  # unit vectors' entries as multiples of 1/GRID (see GridRows)
# How far a rough similarity of two unit vectors can be from the exact one. bf16: each entry
# rounded to 8 significant bits (2·2^-9 of Σ|q_i·x_i| ≤ 1), the bf16 result rounded again
# (2^-9). Both products also carry their float32 sums' rounding (dim·2^-24) and the float32
# normalisation of each side (2^-23 each), added per call by ``slack``.
BF16_ERROR = 2**-8 + 2**-9 + 2**-16


@on_free_cores
def nearest(
    train_chunks: Iterable[tuple[torch.Tensor, torch.Tensor]],
    queries: torch.Tensor,
    k: int,
    search: str = "fp32",
    block: int = QUERY_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most similar training rows of every query: (similarities, labels), each
    (Q, k), most similar first (ties: lower training index first), on the queries' device.
    ``train_chunks`` yields (features, labels) and is read once. ``search`` picks the product
    that proposes candidates — ``fp32``, ``bf16`` (several times faster on GPUs and CPUs with
    AMX) or ``auto`` (``bf16_search_faster``) — and never the answer."""
    if search == "auto":
        search = "bf16" if bf16_search_faster(queries.device) else "fp32"
    dtype = torch.float32 if search == "fp32" else torch.bfloat16
    queries = GridRows.of(queries)
    rough = queries.unit(dtype)
    blocks = [slice(s, s + block) for s in range(0, len(rough), block)]
    best: list[tuple | None] = [None] * len(blocks)
    offset = 0
    for features, labels in train_chunks:
        chunk = Chunk(GridRows.of(features.to(rough.device)), dtype)
        labels = labels.to(rough.device)
        for i, part in enumerate(blocks):
            sims, index = chunk.top(queries[part], rough[part], k)
            best[i] = _merge(best[i], (sims, index + offset, labels[index]), k)
        offset += len(features)
    return torch.cat([b[0] for b in best]).float(), torch.cat([b[2] for b in best])


def bf16_search_faster(device: torch.device) -> bool:
    """Whether the bf16 product outruns the float32 one here: on a GPU; on a CPU with bf16
    instructions, as measured once per process and thread count. The instructions alone do not
    tell: AMX multiplies bf16 several times faster than float32, AVX-512 BF16 on an Intel CPU
    at about float32's rate or slower, and on an AMD one faster. Either choice gives the same
    neighbours, so a measurement that errs costs time only."""
    if device.type != "cpu" or not fast_bf16(device):
        return fast_bf16(device)
    return _bf16_product_faster(torch.get_num_threads())


@functools.cache
def _bf16_product_faster(threads: int) -> bool:
    """bf16 at least ``BF16_MARGIN`` times faster than float32 on a rough product's shape:
    the best of ``PROBE_ROUNDS`` interleaved timings each, after a first call of each (which
    builds its kernel). ``threads``: the count it was measured on."""
    queries, columns = (_probe_operand(shape) for shape in (PROBE_SHAPE[:2], PROBE_SHAPE[1:]))
    pairs = {t: (queries.to(t), columns.to(t)) for t in (torch.float32, torch.bfloat16)}
    for pair in pairs.values():
        _seconds(*pair)
    timings = {dtype: [] for dtype in pairs}
    for _ in range(PROBE_ROUNDS):
        for dtype, pair in pairs.items():
            timings[dtype].append(_seconds(*pair))
    return min(timings[torch.bfloat16]) * BF16_MARGIN <= min(timings[torch.float32])


def _probe_operand(shape: tuple[int, int]) -> torch.Tensor:
    """A matrix of spread values in [-1, 1] (only the product's time is read)."""
    return torch.linspace(-1.0, 1.0, shape[0] * shape[1]).sin_().reshape(shape)


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start


PROBE_SHAPE = (512, 768, 2048)  # queries, width, columns: ~1.6 GFLOP, milliseconds on a CPU
PROBE_ROUNDS = 3
BF16_MARGIN = 1.25  # bf16 must clearly win: a near draw goes to float32, which has fewer near ties


class GridRows:
    """Feature rows as unit vectors on a grid of 2^-25 (int32), and their exact similarities:
    the product of two grid entries is an integer below 2^50, so every sum of such products is
    an integer that float64 holds exactly, in whatever order a BLAS, a thread count or a GPU
    adds them. A similarity is thus the same to the last bit on every machine; the grid moves a
    cosine by about 1e-6 at most, so rows closer than that may tie and go by index. Every step
    to the grid is IEEE arithmetic in an order fixed here (the norms' sums too), so the grid is
    the same everywhere."""

    def __init__(self, grid: torch.Tensor):
        self.grid = grid

    @classmethod
    def of(cls, features: torch.Tensor) -> GridRows:
        blocks = []
        for rows in features.float().split(TRAIN_BLOCK):
            norms = exact_sqrt(fixed_sum(rows.square())).clamp_min(1e-12)
            blocks.append((rows / norms[:, None] * GRID).round_().int())
        return cls(torch.cat(blocks))

    def __len__(self) -> int:
        return len(self.grid)

    def __getitem__(self, index) -> GridRows:
        return GridRows(self.grid[index])

    def unit(self, dtype: torch.dtype) -> torch.Tensor:
        """The unit rows in ``dtype`` (the rough product's), a block at a time."""
        return torch.cat([(rows.float() / GRID).to(dtype) for rows in self.grid.split(TRAIN_BLOCK)])

    def similarities(self, others: torch.Tensor, candidates: torch.Tensor | None = None):
        """Exact cosine similarities of these Q rows with ``others``' grid rows (C, D): all of
        them (Q, C), or each query's own ``candidates`` (Q, W), gathered a few queries at a
        time so that what is gathered is still in cache when it is multiplied."""
        width = others.shape[0] if candidates is None else candidates.shape[1]
        step = max(1, EXACT_BYTES // (8 * width * others.shape[1]))
        parts = []
        for s in range(0, len(self), step):
            mine = self.grid[s : s + step].double()
            if candidates is None:
                parts.append(mine @ others.double().T)
                continue
            part = candidates[s : s + step]
            theirs = others.index_select(0, part.flatten()).view(*part.shape, -1).double()
            parts.append(torch.bmm(theirs, mine[:, :, None])[..., 0])
        return torch.cat(parts) / GRID**2


def exact_sqrt(values: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of each float32 value. torch's own float32 ``sqrt``
    may go through MKL's vector library, whose result depends on the code branch it takes
    (``MKL_CBWR``: on an Intel CPU its compatible branch rounds about one value in six
    differently); the C library's double square root is IEEE-exact, and rounding it to float32
    gives the correctly rounded float32 root (a double holds more than twice float32's bits)."""
    roots = [math.sqrt(value) for value in values.double().tolist()]
    return torch.tensor(roots, dtype=torch.float64, device=values.device).float()


def fixed_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum over the last dimension in one pairwise order fixed here (halves added
    elementwise), so no kernel, vector width or thread count changes its rounding."""
    while values.shape[-1] > 1:
        half = values.shape[-1] // 2
        summed = values[..., :half] + values[..., half : 2 * half]
        values = (
            torch.cat([summed, values[..., 2 * half :]], -1) if values.shape[-1] % 2 else summed
        )
    return values[..., 0]


class Chunk:
    """One chunk of training rows, and its unit rows laid out column by column in the rough
    product's dtype."""

    def __init__(self, rows: GridRows, dtype: torch.dtype):
        self.rows, self.columns = rows, rows.unit(dtype).T.contiguous()

    def __len__(self) -> int:
        return len(self.rows)

    def top(self, queries: GridRows, rough: torch.Tensor, k: int):
        """The k rows of highest exact similarity to each query (similarities, chunk index)."""
        if k >= len(self):  # every row is a neighbour: order them exactly
            return self.exhaustive(queries, k)
        proof = Proof.of(rough, k, len(self))
        rough_top, candidates = self.rough_top(rough, proof.widths[-1])
        proven = proof.proven(rough_top)
        sims = torch.empty(len(queries), k, dtype=torch.float64, device=rough.device)
        index = torch.empty(len(queries), k, dtype=torch.long, device=rough.device)
        sure, near = proven.nonzero()[:, 0], (~proven).nonzero()[:, 0]
        if len(sure):  # only the k proven rows are gathered, to be ordered exactly
            sims[sure], index[sure] = self.ranked(queries[sure], candidates[sure, :k], k)
        if len(near):
            ties = (rough_top[near], candidates[near])
            sims[near], index[near] = self.near_ties(queries[near], ties, proof)
        return sims, index

    def near_ties(self, queries: GridRows, rough: tuple, proof: Proof):
        """The exact top k of queries the rough top k does not prove: ranked among each width
        of ``proof`` in turn, then over the whole chunk, until the k-th exact similarity
        clears every rough one left out by the margin."""
        rough_top, candidates = rough
        k, widths = proof.k, proof.widths[1:]
        sims, index = self.ranked(queries, candidates[:, : widths[0]], k)
        doubtful = torch.arange(len(queries), device=sims.device)
        for width, wider in zip(widths, [*widths[1:], None], strict=True):
            if width == len(self):  # every row was a candidate
                break
            doubtful = doubtful[~proof.cleared(sims[doubtful, k - 1], rough_top[doubtful], width)]
            if not len(doubtful):
                break
            if wider is None:
                found = self.exhaustive(queries[doubtful], k)
            else:
                found = self.ranked(queries[doubtful], candidates[doubtful, :wider], k)
            sims[doubtful], index[doubtful] = found
        return sims, index

    def rough_top(self, rough: torch.Tensor, width: int):
        """The ``width`` highest rough similarities per query and their rows, most similar
        first, from products ``TRAIN_BLOCK`` columns at a time. After the first block only the
        similarities above a query's current width-th enter the merge (a comparison instead
        of a ``topk`` per block: most of a block's rows are below it)."""
        best = None
        for start in range(0, len(self), TRAIN_BLOCK):
            sims = _product(rough, self.columns[:, start : start + TRAIN_BLOCK])
            if best is None or best[0].shape[1] < width:
                found = sims.topk(min(width, sims.shape[1]), dim=1)
                found = (found.values, found.indices + start)
            elif (found := _above(sims, best[0][:, -1], start)) is None:
                continue
            if best is not None:
                top, order = torch.cat([best[0], found[0]], 1).topk(width, dim=1)
                found = (top, torch.cat([best[1], found[1]], 1).gather(1, order))
            best = found
        return best

    def ranked(self, queries: GridRows, candidates: torch.Tensor, k: int):
        """Of each query's candidates, the k of highest exact similarity, ties by index."""
        candidates = candidates.sort(dim=1).values
        return ordered_top(queries.similarities(self.rows.grid, candidates), candidates, k)

    def exhaustive(self, queries: GridRows, k: int):
        """The k rows of highest exact similarity over the whole chunk, ties by index."""
        best = None
        for start in range(0, len(self), TRAIN_BLOCK):
            sims = queries.similarities(self.rows.grid[start : start + TRAIN_BLOCK])
            index = torch.arange(start, start + sims.shape[1], device=sims.device).expand_as(sims)
            best = _merge(best, ordered_top(sims, index, k), k)
        return best


@dataclass(frozen=True)
class Proof:
    """What proves a query's neighbours from rough similarities: ``k``, the candidate widths
    (k + 1 for the rough top k's own proof, then those ranked exactly for near ties) and the
    rough product's error bound."""

    k: int
    widths: tuple[int, ...]
    margin: float

    @classmethod
    def of(cls, rough: torch.Tensor, k: int, rows: int) -> Proof:
        widths = [min(times * k, rows) for times in CANDIDATES[rough.dtype]]
        return cls(k, (k + 1, *widths), slack(rough.dtype, rough.shape[1]))

    def proven(self, rough_top: torch.Tensor) -> torch.Tensor:
        """Rows outside a query's rough top k are at most its (k+1)-th rough similarity +
        margin exactly, rows inside at least its k-th − margin: a gap over twice the margin
        proves the set (no tie can cross it)."""
        gap = rough_top[:, self.k - 1].double() - rough_top[:, self.k].double()
        return gap > 2 * self.margin

    def cleared(self, kth: torch.Tensor, rough_top: torch.Tensor, width: int) -> torch.Tensor:
        """Whether an exact k-th similarity beats every row outside the first ``width``
        candidates: their rough similarity is at most the width-th, their exact one at most
        that + margin, so none can beat (or tie) it."""
        return kth > rough_top[:, width - 1].double() + self.margin


def _above(sims: torch.Tensor, floor: torch.Tensor, start: int):
    """Per query, the similarities above ``floor`` and their rows (``start`` + column), as
    rows padded with -inf, in column order; None when there are none."""
    rows, cols = _columns_above(sims, floor)
    if not len(rows):
        return None
    counts = torch.bincount(rows, minlength=len(sims))
    place = torch.arange(len(rows), device=sims.device) - (counts.cumsum(0) - counts)[rows]
    values = sims.new_full((len(sims), int(counts.max())), -torch.inf)
    index = torch.zeros(values.shape, dtype=torch.long, device=sims.device)
    values[rows, place], index[rows, place] = sims[rows, cols], cols + start
    return values, index


def _columns_above(sims: torch.Tensor, floor: torch.Tensor):
    """(query, column) of each similarity above its query's ``floor``, query by query in
    column order. Past a block or two few similarities clear the floor, so each run of
    ``GROUP`` columns is first met by its maximum (one pass over the block) and only the runs
    whose maximum clears it are compared in full, instead of a comparison and a scan over
    every similarity."""
    queries, width = sims.shape
    if width % GROUP or sims.is_cuda:  # a GPU compares every similarity at once anyway
        return (sims > floor[:, None]).nonzero(as_tuple=True)
    runs = sims.view(queries, width // GROUP, GROUP)
    peaks = runs.amax(-1)
    if peaks.isnan().any():  # a NaN is its run's maximum and would hide the run's values
        return (sims > floor[:, None]).nonzero(as_tuple=True)
    rows, run = (peaks > floor[:, None]).nonzero(as_tuple=True)
    pair, offset = (runs[rows, run] > floor[rows, None]).nonzero(as_tuple=True)
    return rows[pair], run[pair] * GROUP + offset


def ordered_top(sims: torch.Tensor, index: torch.Tensor, k: int):
    """The k highest ``sims`` per row, highest first, equal ones in ``index``'s (ascending)
    order: a stable sort keeps it."""
    order = sims.sort(dim=1, descending=True, stable=True).indices[:, :k]
    return sims.gather(1, order), index.gather(1, order)


def _merge(best, found, k: int):
    """The running top-k of a query block and the next rows' own (similarities, training index
    and any more columns, e.g. labels): the next rows come after every earlier one, so a stable
    sort orders equal similarities by index."""
    if best is None:
        return found
    parts = [torch.cat(pair, dim=1) for pair in zip(best, found, strict=True)]
    order = parts[0].sort(dim=1, descending=True, stable=True).indices[:, :k]
    return tuple(part.gather(1, order) for part in parts)


def slack(dtype: torch.dtype, dim: int) -> float:
    """The error bound of a rough similarity of unit vectors in ``dtype`` (see BF16_ERROR)."""
    rounding = dim * 2**-24 + 2 * 2**-23
    return rounding + (BF16_ERROR if dtype == torch.bfloat16 else 0.0)


def _product(queries: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """queries·columns with float32 sums (the error bound assumes them): CUDA's
    reduced-precision reductions are switched off for a bf16 call."""
    if queries.device.type != "cuda" or queries.dtype != torch.bfloat16:
        return queries @ columns
    flags = torch.backends.cuda.matmul
    kept, flags.allow_bf16_reduced_precision_reduction = (
        flags.allow_bf16_reduced_precision_reduction,
        False,
    )
    try:
        return queries @ columns
    finally:
        flags.allow_bf16_reduced_precision_reduction = kept


def vote(
    similarities: torch.Tensor,
    labels: torch.Tensor,
    k: int,
    classes: int,
    weighting: str = "exp",
    temperature: float = TEMPERATURE,
) -> torch.Tensor:
    """Class scores (Q, classes) from the first ``k`` neighbours: each adds exp(sim / T)
    (``exp``) or 1 (``uniform``) to its class."""
    sims, labs = similarities[:, :k], labels[:, :k]
    weights = (sims / temperature).exp() if weighting == "exp" else torch.ones_like(sims)
    scores = torch.zeros(len(sims), classes, dtype=weights.dtype, device=sims.device)
    return scores.scatter_add_(1, labs, weights)
