"""Weighted kNN: the vote by hand, uniform votes against scikit-learn's KNeighborsClassifier
on the same features, chunking that does not change the neighbours, and the task end to end."""

from __future__ import annotations

import math

import pytest
import torch

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
    rough = nearest([(train[i : i + 64], labels[i : i + 64]) for i in range(0, 300, 64)], test,
                    k=10, search="bf16")  # fmt: skip
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
    from evalkit.heads import knn

    monkeypatch.setattr(knn, "_cpu_has_bf16", lambda: False)
    assert not knn.fast_bf16(torch.device("cpu")) and knn.fast_bf16(torch.device("cuda"))
    monkeypatch.setattr(knn, "_cpu_has_bf16", lambda: True)
    assert knn.fast_bf16(torch.device("cpu"))
