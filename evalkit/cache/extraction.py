"""Batched feature extraction with a content-addressed, crash-safe on-disk cache: images come
from a ``feed.Feed`` (the pixel cache, or decoded), features go back as a
``feature_set.FeatureSet``.

An entry's key is the hash of ``feature_spec`` (``keys``). An entry is a folder of
fixed-size shards (``shard-00000.safetensors`` …) plus ``manifest.json``. Each shard carries a
checksum of its tensors and is written to a temporary name and renamed, so a shard on disk is
complete; a crash at any point loses at most the shard in flight, the rerun extracts only the
missing shards, and a damaged shard is reported, deleted and recomputed. Shard boundaries
depend on the sample index alone, never on batch size or the number of ranks. An entry another
user keeps private in a shared cache is read where it can be and never written or deleted:
what it lacks is computed in memory (``shards.may_write``).

Under torchrun, data-parallel groups take the missing shards round-robin and meet on disk;
tensor-parallel ranks of one group compute the same shards together and one of them writes.

Video: a dataset whose items are clips (T, C, H, W) is extracted frame by frame through the
backbone's image path (the frames of a batch of clips are folded into one batch) and cached per
clip: ``pooled`` is then (N, T, D), and a shard holds whole clips.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from evalkit import distributed
from evalkit.cache.entries import META
from evalkit.cache.feature_set import FeatureSet
from evalkit.cache.feed import Feed
from evalkit.cache.keys import backbone_key, cache_key
from evalkit.cache.pixels import PixelStore, pixel_store, subset_key
from evalkit.cache.settings import STORAGE, ExtractSettings, FeatureRequest
from evalkit.data.clips import split_status
from evalkit.data.feeding import on_device
from evalkit.data.resolve import pixels_setting
from evalkit.errors import EvalkitError, warn_once
from evalkit.progress import ProgressBar
from evalkit.storage import shards as files
from evalkit.storage.identity import write_json

WORKER_PREFIX = "evalkit.errors.EvalkitError: "


def extract_features(
    backbone,
    dataset,
    *,
    request: FeatureRequest,
    settings: ExtractSettings,
    split: str,
    subset: Sequence[int] | None = None,
) -> FeatureSet:
    """Features of ``dataset`` (or of ``subset`` of its indices), from the cache when present."""
    indices = list(range(len(dataset))) if subset is None else list(subset)
    shards = [
        indices[i : i + settings.shard_size] for i in range(0, len(indices), settings.shard_size)
    ]
    folder, read_only = None, settings.read_only
    dataset_id = dataset.identity()  # stats every file: compute once
    if settings.cache_dir is not None:
        key = cache_key(
            backbone.info,
            request,
            dtype=settings.dtype,
            dataset_id=dataset_id,
            split=split,
            subset=subset,
            shard_size=settings.shard_size,
            storage=settings.cache_dtype,
            device=settings.device,
        )
        folder = Path(settings.cache_dir) / "features" / key
        # another user's entry in a shared cache is read where it can be, never written
        read_only = settings.read_only or not files.may_write(folder)
        if not read_only:
            _write_meta(folder, backbone.info, split, request, settings, len(indices))
    wanted = files.places(folder.name if folder else "", len(indices), settings.shard_size)
    done = _usable_shards(settings, folder, wanted, read_only)
    writes_to = None if read_only else folder
    pixels = _pixels(dataset, settings, request, dataset_id, split, subset, len(indices))
    feed = Feed(dataset, shards, settings, pixels)
    computed = _compute_missing(backbone, feed, done, request, writes_to)
    distributed.barrier()  # every group's shards are on disk
    if folder is None:
        parts = [computed[i] for i in range(len(shards))]
    else:
        parts = [computed.get(i) or files.shard_path(folder, i) for i in range(len(shards))]
        if writes_to and distributed.current().main and not (folder / files.MANIFEST).exists():
            files.write_manifest(folder, wanted, len(indices))
    features = FeatureSet(parts, from_cache=not computed and bool(shards), dataset_id=dataset_id)
    features.key = folder.name if folder is not None else None
    features.extracted = sum(len(shards[i]) for i in computed)  # by this process's group
    _check_labels(features, dataset, indices, folder)
    return features


def _usable_shards(settings, folder: Path | None, wanted, read_only: bool) -> set[int]:
    """The shards of the entry at ``folder`` this run reads rather than computes: on disk,
    sound (``verify_shards``), not derived from damaged views, and readable by this user."""
    unusable, seen = set(), folder is not None and files.searchable(folder)
    if seen and distributed.current().main:
        bad = files.verify_shards(
            folder, wanted, recheck=settings.verify_cache, read_only=read_only
        )
        bad += derived_damage(settings, folder, wanted, read_only)
        unusable = {files.shard_index(path) for path in bad}
    distributed.barrier()  # all ranks agree on what is missing before any rank writes
    return {
        p.index
        for p in wanted
        if seen and p.index not in unusable and files.shard_path(folder, p.index).exists()
    }


def derived_damage(settings: ExtractSettings, folder: Path, wanted, read_only: bool) -> list[Path]:
    """Shards of ``folder`` computed from cached views later found damaged: removed (kept, but
    not used, in a read-only cache or entry), so they are recomputed from sound ones."""
    derived = files.derived_from_damaged(Path(settings.cache_dir), folder, wanted)
    if derived and not read_only:
        files.drop_derived(folder, derived)
    return derived


def _check_labels(features: FeatureSet, dataset, indices: list[int], folder: Path | None):
    """Cached labels are the data set's (as readers encode them: an item they could not
    decode, a padded clip; ``split_status``): damage under a kept stamp (found otherwise only by ``evalkit cache verify``) must
    not become a wrong number or a huge allocation."""
    expected = getattr(dataset, "labels", None)
    if not isinstance(expected, list) or len(expected) != len(dataset) or not features.parts:
        return
    if features.labels.dim() != 1 or len(features.labels) != len(indices):
        differ = len(indices)
    else:
        classes, _, unreadable = split_status(features.labels)
        differ = int(((classes != torch.as_tensor(expected)[indices]) & ~unreadable).sum())
    if differ:
        raise EvalkitError(
            f"the feature cache {folder} holds labels that are not the data set's ({differ} of "
            f"{len(indices)} differ): it is damaged; run `evalkit cache verify` (it removes "
            "damaged shards), then rerun"
        )


def _pixels(dataset, settings, request, dataset_id, split, subset, n) -> PixelStore | None:
    """The pixel cache of this extraction: images (not clips), in a run of one process (ranks
    would have to agree on which shards it holds before they split or broadcast batches)."""
    layout = distributed.current()
    if request.frames is not None:
        return None
    if layout.dp_size > 1 or layout.tp_size > 1:
        if layout.main and pixels_setting(dataset) != "decode" and settings.cache_dir:
            warn_once(
                "pixel cache",
                f"the pixel cache is off under {layout.dp_size * layout.tp_size} processes "
                "(ranks would have to agree on which shards it holds): images are decoded",
            )
        return None
    return pixel_store(
        dataset, settings, dataset_id=dataset_id, split=split, subset_key=subset_key(subset), n=n
    )


def _compute_missing(backbone, feed: Feed, done, request, folder) -> dict[int, dict]:
    layout, shards, settings = distributed.current(), feed.shards, feed.settings
    if layout.dp_size > 1 and folder is None:
        raise EvalkitError(
            "data-parallel extraction shares its shards through the feature cache: drop "
            "--no-cache, or launch as many processes as --tp"
        )
    missing = [i for i in range(len(shards)) if i not in done]
    todo = feed.order(missing[layout.dp_rank :: layout.dp_size])
    batches = feed.batches(todo)
    computed = {}
    if todo:
        loader = _decoded_once(feed, todo)
        try:
            computed = _run_loader(loader, backbone, feed, todo, request, folder)
        except EvalkitError as exc:  # raised in a worker: keep only the original message
            message = str(exc).strip().splitlines()[-1].removeprefix(WORKER_PREFIX)
            raise EvalkitError(message) from None
    if _gathers_weights(backbone):
        most = max(
            _batch_count(shards, missing[r :: layout.dp_size], settings.batch_size)
            for r in range(layout.dp_size)
        )
        for _ in range(most - len(batches)):
            _idle_forward(backbone, request, settings)
    return computed


def _decoded_once(feed: Feed, todo: list[int]):
    """The batches of the ``todo`` shards, decoded once per tensor-parallel group: every rank
    of a group runs the same forward on the same images, so the group's first rank decodes
    them (with the loader's workers) and broadcasts each batch to the others."""
    layout = distributed.current()
    loader = iter(feed.images(todo)) if layout.tp_rank == 0 else None
    if layout.tp_size == 1:
        yield from loader
        return
    group = layout.mesh["tp"].get_group()
    for _ in feed.batches(todo):
        pair = next(loader) if loader is not None else (None, None)
        yield tuple(distributed.broadcast_from_first(t, group, feed.settings.device) for t in pair)


def _gathers_weights(backbone) -> bool:
    """FSDP2 gathers every block's weights from all data-parallel ranks at each forward, so
    those ranks must run as many forwards as each other, whatever share of shards each has."""
    # A model sharded by FSDP2 was wrapped by code that imported it; where none did, importing
    # it here (DTensor, sympy: about a CPU-second of every run) could only answer no.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(getattr(backbone, "model", None), fsdp.FSDPModule)


def _batch_count(shards, indices: list[int], batch_size: int) -> int:
    return sum(-(-len(shards[i]) // batch_size) for i in indices)


def _idle_forward(backbone, request: FeatureRequest, settings: ExtractSettings):
    """A forward whose output is dropped: a rank with fewer batches keeps FSDP2's gathers in
    step with the others."""
    size = backbone.info.preprocess.size
    images = torch.zeros(1, 3, size, size)
    _forward(backbone, images, torch.zeros(1, dtype=torch.long), request, settings)


def _run_loader(loader, backbone, feed: Feed, todo, request, folder) -> dict[int, dict]:
    """Compute the ``todo`` shards; each is written and let go when there is a cache (the
    returned dict then maps its index to None), and kept in memory when there is none. A
    decoded shard's views go to the pixel cache, when there is one."""
    computed, pending, views, shard_pos = {}, [], [], 0
    layout, shards, settings = distributed.current(), feed.shards, feed.settings
    total = sum(len(shards[i]) for i in todo)
    enabled = settings.progress and layout.main
    with ProgressBar(enabled, total, f"features {backbone.info.name}", status="rate") as advance:
        for host, images, labels in on_device(loader, settings.device):
            pending.append(_forward(backbone, images, labels, request, settings))
            views.append(host)
            advance(len(labels))
            if sum(len(p["labels"]) for p in pending) == len(shards[todo[shard_pos]]):
                shard = _merge(pending)
                if folder is not None and layout.writer:
                    place, source = (
                        _place(folder, todo[shard_pos], shards),
                        feed.source(todo[shard_pos]),
                    )
                    files.save_shard(folder, place, shard, source=source)
                feed.keep(todo[shard_pos], views, shard["labels"])
                computed[todo[shard_pos]] = shard if folder is None else None
                pending, views, shard_pos = [], [], shard_pos + 1
    return computed


def _place(folder: Path, index: int, shards: list[list[int]]) -> files.Place:
    start = index * len(shards[0])  # every shard but the last is full
    return files.Place(folder.name, index, start, start + len(shards[index]))


def _forward(backbone, images, labels, request: FeatureRequest, settings: ExtractSettings) -> dict:
    """One batch's features; a batch that runs out of memory is done in smaller pieces."""
    labels = torch.as_tensor(labels)

    def piece(start: int, stop: int) -> dict:
        return _forward_once(backbone, images[start:stop], labels[start:stop], request, settings)

    pieces = settings.limit.pieces(piece, len(labels), "feature extraction")
    return pieces[0] if len(pieces) == 1 else _merge(pieces)


def _forward_once(backbone, images, labels, request, settings: ExtractSettings) -> dict:
    device = torch.device(settings.device)
    frames = _clip_frames(images, request)
    if frames:
        images = images.flatten(0, 1)  # (B, T, C, H, W) → (B·T, C, H, W)
    with (
        torch.inference_mode(),
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.dtype == "bf16"),
    ):
        feats = backbone.extract(
            images.to(device, non_blocking=True),
            layers=request.layers,
            pool=request.pool,
            dense=request.dense,
        )
    storage = STORAGE[settings.cache_dtype]
    pooled = feats.pooled.to(storage).cpu()
    if frames:
        pooled = pooled.unflatten(0, (-1, frames))
    out = {"pooled": pooled, "labels": torch.as_tensor(labels)}
    for layer, grid in enumerate(feats.grids or []):
        # contiguous, as a cache read returns it: kernels pick algorithms by memory layout
        out[f"grid.{layer}"] = grid.to(storage).cpu().contiguous()
    return out


def _clip_frames(images: torch.Tensor, request: FeatureRequest) -> int | None:
    """Frames per clip of a batch, checked against the request; None for images."""
    if images.dim() == 4 and request.frames is None:
        return None
    frames = images.shape[1] if images.dim() == 5 else None
    if frames is None or frames != request.frames:
        got = f"clips of {frames} frames" if frames else "images"
        want = f"clips of {request.frames} frames" if request.frames else "images"
        raise EvalkitError(f"the dataset yields {got}, the task asked for {want}")
    if request.dense:
        raise EvalkitError("dense features of video clips are not supported: use pooled features")
    return frames


def _merge(parts: list[dict]) -> dict:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _write_meta(folder: Path, info, split: str, request, settings, n: int):
    if (folder / META).exists() or not distributed.current().main:
        return
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "backbone": info.name,
        "backbone_key": backbone_key(info, settings.dtype),
        "split": split,
        "request": asdict(request),
        "dtype": settings.dtype,
        "n": n,
        "shard_size": settings.shard_size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_json(folder / META, meta)
