"""Weighted kNN: the vote by hand, uniform votes against scikit-learn's KNeighborsClassifier
on the same features, chunking that does not change the neighbours, and the task end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from evalkit.heads import knn
from evalkit.heads.knn import nearest, vote


def test_weighted_vote_by_hand():
    sims = torch.tensor([[0.9, 0.5, 0.4]])
    labels = torch.tensor([[1, 0, 0]])
    scores = vote(sims, labels, k=3, classes=2, temperature=0.1)
    assert scores[0, 1].item() == pytest.approx(math.exp(9.0))
    assert scores[0, 0].item() == pytest.approx(math.exp(5.0) + math.exp(4.0))
    assert vote(sims, labels, k=1, classes=2)[0, 0] == 0  # only the nearest votes


def test_uniform_knn_equals_scikit_learn():
    from sklearn.neighbors import KNeighborsClassifier

    generator = torch.Generator().manual_seed(0)
    train = torch.randn(500, 16, generator=generator)
    labels = torch.randint(0, 7, (500,), generator=generator)
    test = torch.randn(120, 16, generator=generator)
    chunks = [(train[i : i + 64], labels[i : i + 64]) for i in range(0, 500, 64)]
    sims, neighbour_labels = nearest(chunks, test, k=15)
    for k in (1, 5, 15):
        ours = vote(sims, neighbour_labels, k, classes=7, weighting="uniform").argmax(1)
        reference = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
        theirs = reference.fit(train.numpy(), labels.numpy()).predict(test.numpy())
        assert ours.tolist() == theirs.tolist(), k


def test_chunking_does_not_change_the_neighbours():
    generator = torch.Generator().manual_seed(1)
    train, labels = torch.randn(300, 8, generator=generator), torch.arange(300) % 5
    test = torch.randn(40, 8, generator=generator)
    whole = nearest([(train, labels)], test, k=10)
    pieces = nearest([(train[i : i + 7], labels[i : i + 7]) for i in range(0, 300, 7)], test, k=10)
    assert torch.allclose(whole[0], pieces[0]) and torch.equal(whole[1], pieces[1])
    rough = nearest(
        [(train[i : i + 64], labels[i : i + 64]) for i in range(0, 300, 64)],
        test,
        k=10,
        search="bf16",
    )
    assert torch.allclose(whole[0], rough[0]) and torch.equal(whole[1], rough[1])
    assert (whole[0][:, :-1] >= whole[0][:, 1:]).all()  # most similar first


def test_knn_task_writes_a_row_per_k(fake, ctx):
    from evalkit.core.runner import resolve_task

    task = resolve_task("imagenet-knn", ["ks=1,20", "chunk=100", "query_chunk=50"])
    rows = {m.metric: m for m in task.run(fake, ctx)}
    assert set(rows) == {"top1/k=1", "top5/k=1", "top1/k=20", "top5/k=20"}
    assert rows["top1/k=20"].value > 100 / 24 and rows["top1/k=20"].extra["n_train"] == 960
    small_chunks = {
        m.metric: m.value for m in resolve_task("imagenet-knn", ["ks=1,20"]).run(fake, ctx)
    }
    assert small_chunks == {k: m.value for k, m in rows.items()}


def test_knn_settings_are_checked():
    from evalkit.core.runner import resolve_task
    from evalkit.errors import EvalkitError

    with pytest.raises(EvalkitError, match="ks=0"):
        resolve_task("imagenet-knn", ["ks=0"])


def test_the_bf16_search_finds_the_exact_neighbours_where_bf16_cannot_tell_them_apart():
    """Training rows whose similarities to the query differ by less than bf16 resolves: the
    candidates of a bf16 product are a lottery there, so the search must notice and redo the
    query in float32 — the neighbours equal the float32 search's, in order."""
    generator = torch.Generator().manual_seed(3)
    query = torch.nn.functional.normalize(torch.randn(4, 64, generator=generator), dim=1)
    near = query.repeat_interleave(50, 0) + 1e-3 * torch.randn(200, 64, generator=generator)
    far = torch.randn(300, 64, generator=generator)
    train = torch.cat([far[:150], near, far[150:]])
    labels = torch.arange(len(train))
    exact = nearest([(train, labels)], query, k=5, search="fp32")
    rough = nearest([(train, labels)], query, k=5, search="bf16")
    assert torch.equal(exact[1], rough[1])
    assert torch.allclose(exact[0], rough[0])


def test_auto_search_uses_bf16_only_where_it_is_fast(monkeypatch):
    from evalkit import device

    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: False)
    assert not device.fast_bf16(torch.device("cpu")) and device.fast_bf16(torch.device("cuda"))
    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: True)
    assert device.fast_bf16(torch.device("cpu"))


def _near_duplicates(seed: int = 5):
    """Training rows as ImageNet's duplicates give them: each of 60 images with four
    near-copies (similarities within 1e-7 of each other) and two exact copies, labels mixed."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(60, 48, generator=generator)
    near = base.repeat_interleave(4, 0) * (1 + 1e-7 * torch.randn(240, 48, generator=generator))
    train = torch.cat([near, base, base])[torch.randperm(360, generator=generator)]
    labels = torch.randint(0, 5, (360,), generator=generator)
    queries = base[:40] + 0.3 * torch.randn(40, 48, generator=generator)
    return train, labels, torch.cat([queries, base[40:]])  # the last queries equal train rows


def _grid(rows: torch.Tensor) -> np.ndarray:
    """The documented grid, computed apart from evalkit (numpy, no torch kernel): float32
    squares summed pairwise (the first half plus the second, an odd last one carried), the
    square root correctly rounded to float32, each entry divided by it, times 2^25, rounded
    half to even, as int64."""
    values = rows.numpy().astype(np.float32)

    def pairwise(parts: np.ndarray) -> np.ndarray:
        if parts.shape[1] == 1:
            return parts[:, 0]
        half = parts.shape[1] // 2
        summed = parts[:, :half] + parts[:, half : 2 * half]
        return pairwise(np.concatenate([summed, parts[:, 2 * half :]], axis=1))

    sums = pairwise(values * values)
    norms = np.array([math.sqrt(float(v)) for v in sums], dtype=np.float64).astype(np.float32)
    return np.rint(
        values / np.maximum(norms, np.float32(1e-12))[:, None] * np.float32(2**25)
    ).astype(np.int64)


def _reference(train, labels, queries, k):
    """Brute force on the independent grid: every similarity exact in int64, equal ones
    ordered by training index."""
    products = _grid(queries) @ _grid(train).T  # exact: |entries| ≤ 2^25, 48 of them
    cosine = F.normalize(queries.double(), dim=1) @ F.normalize(train.double(), dim=1).T
    assert np.abs(products / 2.0**50 - cosine.numpy()).max() < 1e-6
    order = np.argsort(-products, axis=1, kind="stable")[:, :k]
    return labels[torch.from_numpy(order)]


def test_the_grid_is_the_documented_one_on_every_kernel_path():
    """evalkit's grid equals the independent one on rows whose float32 square roots torch's
    vector library rounds differently under some MKL code branches."""
    from evalkit.heads.knn import GridRows

    generator = torch.Generator().manual_seed(0)
    rows = torch.rand(4000, 37, generator=generator) * torch.rand(4000, 1, generator=generator)
    assert np.array_equal(GridRows.of(rows).grid.numpy().astype(np.int64), _grid(rows))


@pytest.mark.parametrize("chunk", [360, 7, 100])
def test_every_search_mode_gives_one_answer_on_duplicate_rows(chunk, monkeypatch):
    from evalkit.heads import knn

    train, labels, queries = _near_duplicates()
    chunks = [(train[i : i + chunk], labels[i : i + chunk]) for i in range(0, 360, chunk)]
    answers = {mode: nearest(chunks, queries, k=12, search=mode) for mode in ("fp32", "bf16")}
    for fast in (True, False):
        monkeypatch.setattr(knn, "fast_bf16", lambda device, fast=fast: fast)
        answers[f"auto/{fast}"] = nearest(chunks, queries, k=12, search="auto")
    first = answers["fp32"]
    assert torch.equal(first[1], _reference(train, labels, queries, 12))
    for sims, neighbour_labels in answers.values():
        assert torch.equal(sims, first[0]) and torch.equal(neighbour_labels, first[1])
        assert torch.equal(
            vote(sims, neighbour_labels, 12, 5).argmax(1), vote(*first, 12, 5).argmax(1)
        )


def test_bf16_certification_at_its_bound(monkeypatch):
    """A query whose nearest row has a bf16 similarity below four others' while every one of
    those four is exactly more similar than the fourth's bf16 value: only the bf16 error term
    of the margin sends the query to the exact search. Without that term the search would
    certify the wrong neighbour (checked below, so this data sits at the bound)."""
    from evalkit.heads import knn

    query = torch.tensor([[1.0, 1, 1, 1, -1, -1, -1, -1]]).double() / 8**0.5
    pattern = torch.tensor([1.0, 1, -1, -1, 1, 1, -1, -1]).double() / 8**0.5
    generator = torch.Generator().manual_seed(4)
    train = F.normalize(
        pattern + 1e-3 * torch.randn(64, 8, generator=generator, dtype=torch.float64), dim=1
    )
    labels = torch.arange(64)
    truth = int((train @ query.T).argmax())
    found = nearest([(train.float(), labels)], query.float(), k=1, search="bf16")[1]
    assert found.item() == truth
    monkeypatch.setattr(knn, "BF16_ERROR", 0.0)
    assert nearest([(train.float(), labels)], query.float(), k=1, search="bf16")[1].item() != truth


@pytest.mark.parametrize("search", ["fp32", "bf16"])
def test_only_near_ties_are_ranked_among_more_candidates_than_k(search, monkeypatch):
    """Well-separated queries are proven by the rough product alone: exactly their k rows are
    gathered for the float64 ordering. Queries with a duplicate straddling the k-th place go
    to the wider ranking; the neighbours equal the reference either way."""
    from evalkit.heads.knn import GridRows

    widths = []
    real = GridRows.similarities

    def recorded(self, others, candidates=None):
        widths.append(None if candidates is None else candidates.shape[1])
        return real(self, others, candidates)

    monkeypatch.setattr(GridRows, "similarities", recorded)
    generator = torch.Generator().manual_seed(1)
    train = torch.randn(2000, 32, generator=generator)
    labels = torch.randint(0, 5, (2000,), generator=generator)
    queries = train[:50] + 0.01 * torch.randn(50, 32, generator=generator)
    sims, found = nearest([(train, labels)], queries, k=1, search=search)
    assert set(widths) == {1} and torch.equal(found, _reference(train, labels, queries, 1))
    widths.clear()
    tied = torch.cat([train, train[:1]])  # the first query's neighbour, twice
    sims, found = nearest([(tied, torch.cat([labels, labels[:1]]))], queries, k=1, search=search)
    assert widths.count(1) == 1 and len(widths) >= 2  # 49 proven at once, 1 near tie wider


def test_a_rough_gap_under_twice_the_error_bound_proves_nothing():
    """Each rough similarity may be off by the product's error bound (the margin), so the k-th
    and the (k+1)-th may swap exactly when their rough gap is at most twice it: a gap of 1.5
    margins leaves the query to the exact ranking, one of 2.5 margins proves its k rows."""
    from evalkit.heads.knn import Proof, slack

    margin = slack(torch.float32, 64)
    proof = Proof(k=1, widths=(2, 2), margin=margin)
    rough = torch.tensor([[0.5 + 1.5 * margin, 0.5], [0.5 + 2.5 * margin, 0.5]])
    assert proof.proven(rough.double()).tolist() == [False, True]


@settings(max_examples=60, deadline=None)
@given(
    queries=st.integers(1, 6),
    runs=st.integers(1, 4),
    extra=st.sampled_from([0, 0, 5]),
    levels=st.integers(2, 40),
    nan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_similarities_above_a_floor_are_those_a_full_comparison_finds(
    queries, runs, extra, levels, nan, seed
):
    """The rough merge meets each run of columns by its maximum first; what it finds is what
    comparing every similarity finds, in the same order: ties with the floor, NaN (which
    would hide its run's values), a block whose width is no multiple of the run, no hits."""
    gen = torch.Generator().manual_seed(seed)
    sims = torch.randint(0, levels, (queries, runs * knn.GROUP + extra), generator=gen) / levels
    if nan:
        sims[0, 3] = torch.nan
    floor = torch.randint(0, levels + 1, (queries,), generator=gen) / levels
    expected = (sims > floor[:, None]).nonzero(as_tuple=True)
    found = knn._columns_above(sims, floor)
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))


def test_auto_search_takes_bf16_where_it_measured_clearly_faster(monkeypatch):
    """On a CPU with bf16 instructions ``auto`` times both products once: AVX-512 BF16 on an
    Intel CPU multiplies at about float32's rate (bf16 would cost time), AMX several times
    faster. A near draw goes to float32; no bf16 instructions or a GPU need no timing."""
    from evalkit import device

    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: True)
    for bf16, fp32, expected in ((1.0, 1.2, False), (1.0, 1.25, True), (1.0, 5.0, True)):
        knn._bf16_product_faster.cache_clear()
        timings = {torch.bfloat16: bf16, torch.float32: fp32}
        monkeypatch.setattr(knn, "_seconds", lambda a, b, t=timings: t[a.dtype])
        assert knn.bf16_search_faster(cpu) is expected, (bf16, fp32)
    knn._bf16_product_faster.cache_clear()
    monkeypatch.setattr(knn, "_seconds", lambda a, b: pytest.fail("timed without bf16"))
    monkeypatch.setattr(device, "_cpu_has_bf16", lambda: False)
    assert not knn.bf16_search_faster(cpu)
    assert knn.bf16_search_faster(torch.device("cuda"))
    knn._bf16_product_faster.cache_clear()
