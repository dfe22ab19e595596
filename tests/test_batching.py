"""Batch back-off: an out-of-memory error during extraction or prediction halves the batch and
retries the part that failed (errors that are not about memory are raised as they are), down to
a floor; the features and numbers equal those of a run whose batches fitted, and the row
records the batch size used; ``--batch-size auto`` starts from the planner's estimate."""

from __future__ import annotations

import pytest
import torch

import evalkit
from evalkit.batching import BatchLimit, is_out_of_memory
from evalkit.errors import EvalkitError

KNN = dict(data="embedded", progress=False, overrides=["ks=1,20"])


def failing_above(limit: int, original, error=None):
    """``original`` that runs out of memory on more than ``limit`` items."""
    calls = []

    def forward(backbone, images, labels, *args, **kwargs):
        calls.append(len(labels))
        if len(labels) > limit:
            raise error or torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(backbone, images, labels, *args, **kwargs)

    return forward, calls


def test_extraction_backs_off_and_gives_the_same_features_and_numbers(tmp_path, monkeypatch, capfd):
    from evalkit.cache import extraction

    fitted = evalkit.run(
        "imagenet-knn", "fake", out=tmp_path / "a", cache_dir=tmp_path / "ca", **KNN
    )
    forward, calls = failing_above(16, extraction._forward_once)
    monkeypatch.setattr(extraction, "_forward_once", forward)
    backed = evalkit.run(
        "imagenet-knn", "fake", out=tmp_path / "b", cache_dir=tmp_path / "cb", **KNN
    )
    assert [r["value"] for r in backed] == [r["value"] for r in fitted]
    assert {r["provenance"]["batch_size"] for r in fitted} == {64}
    assert {r["provenance"]["batch_size"] for r in backed} == {16}
    assert calls[:3] == [64, 32, 16] and max(calls[3:]) == 16  # later batches start at 16
    assert capfd.readouterr().err.count("out of memory at a batch of") == 2
    assert _features(tmp_path / "ca") == _features(tmp_path / "cb")


def _features(cache) -> dict:
    """Every cached tensor, by split, shard and name."""
    import json

    from safetensors.torch import load_file

    found = {}
    for path in sorted(cache.rglob("*.safetensors")):
        split = json.loads((path.parent / "meta.json").read_text())["split"]
        for name, tensor in load_file(path).items():
            found[(split, path.name, name)] = tensor.numpy().tobytes()
    assert found
    return found


def test_an_error_that_is_not_about_memory_is_raised_as_it_is():
    limit = BatchLimit()

    def work(start, stop):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        limit.pieces(work, 64, "feature extraction")
    assert limit.size is None


def test_out_of_memory_at_the_floor_is_one_line():
    def work(start, stop):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(EvalkitError, match="out of memory even at a batch of 1"):
        BatchLimit().pieces(work, 8, "prediction")


@pytest.mark.parametrize(
    ("error", "memory"),
    [
        (torch.OutOfMemoryError("x"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (
            RuntimeError(
                "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"
            ),
            True,
        ),
        (
            RuntimeError(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"
            ),
            True,
        ),
        (RuntimeError("expected scalar type Float but found Half"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_which_errors_are_about_memory(error, memory):
    assert is_out_of_memory(error) is memory


def test_prediction_backs_off_and_gives_the_same_logits(fake, ctx, monkeypatch):
    from evalkit.backbones.base import build_transform
    from evalkit.data.resolve import open_dataset
    from evalkit.protocols.classification import predict

    # a fine-tuned model reads normalised images (its own forward, not a backbone's extract)
    view = build_transform(fake.info.preprocess, normalised=True)
    data = open_dataset("imagenet", "val", ctx.data, transform=view)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(24))
    model(torch.zeros(1, *data[0][0].shape))
    fitted, labels = predict(model, data, ctx)
    original = model.forward

    def forward(x):
        if len(x) > 8:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(x)

    monkeypatch.setattr(model, "forward", forward)
    backed, backed_labels = predict(model, data, ctx)
    # not bitwise: a BLAS may multiply 8 rows with another kernel than 64 (MKL's compatible
    # code does); the predictions are the same, the logits within float32 rounding
    assert torch.equal(backed_labels, labels) and torch.equal(backed.argmax(1), fitted.argmax(1))
    assert torch.allclose(backed, fitted, rtol=1e-5, atol=1e-6)
    assert ctx.extract.limit.size == 8


def test_auto_batch_size_is_the_planner_estimate_for_the_free_memory(tmp_path, monkeypatch):
    from evalkit.core.shapes import measured_shape
    from evalkit.core.spec import RunSpec

    backbone = evalkit.load_backbone("fake")
    per_image = max(measured_shape(backbone, dtype="fp32").activation_bytes_per_image, 1)
    monkeypatch.setattr("evalkit.core.shapes.free_bytes", lambda device: 2 * 100 * per_image)
    rows = evalkit.run(
        "imagenet-knn",
        "fake",
        out=tmp_path,
        batch_size="auto",
        force=True,
        cache_dir=tmp_path / "c",
        **KNN,
    )
    assert {r["provenance"]["batch_size"] for r in rows} == {64}  # half of 200 images' worth
    with pytest.raises(EvalkitError, match="--batch-size must be auto or at least 1"):
        RunSpec.of(tasks="imagenet-knn", backbones="fake", batch_size="big")


def test_a_training_step_that_runs_out_of_memory_is_redone_in_accumulated_pieces(monkeypatch):
    """A head whose loss is a mean over images: the step split in pieces (gradients accumulated,
    each piece weighted by its share) gives the same weights as the step that fitted."""
    from evalkit.batching import job_limits
    from evalkit.heads.train import train
    from evalkit.schedule import Schedule

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,), generator=generator)
    cfg = Schedule(steps=4, batch_size=32, lr=0.1, warmup=0, b2=0.999, clip=35.0, seed=0)

    def fitted(limit: int | None):
        module = torch.nn.Linear(8, 3).double()
        torch.nn.init.zeros_(module.weight), torch.nn.init.zeros_(module.bias)

        def step_loss(indices):
            if limit is not None and len(indices) > limit:
                raise torch.OutOfMemoryError("CUDA out of memory")
            return torch.nn.functional.cross_entropy(module(x[indices].double()), y[indices])

        with job_limits() as limits:
            losses = train(module, step_loss, len(y), cfg)
        return module.weight.detach(), losses, limits

    whole, whole_losses, _ = fitted(None)
    pieces, piece_losses, limits = fitted(8)
    torch.testing.assert_close(pieces, whole, rtol=1e-12, atol=1e-12)
    assert piece_losses == pytest.approx(whole_losses, rel=1e-12)
    assert limits["training"].size == 8
