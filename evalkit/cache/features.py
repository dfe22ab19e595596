"""Batched feature extraction with a content-addressed, crash-safe on-disk cache.

An entry's key is the hash of ``feature_spec``: everything that changes the features (the
backbone's name, options, weights content id, preprocessing and dtype, the feature libraries'
versions, layers, pooling, dataset identity, split and subset). An entry is a folder of
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

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evalkit import distributed
from evalkit.batching import BatchLimit
from evalkit.cache.pixels import PixelStore, pixel_store, subset_key
from evalkit.data.clips import split_status
from evalkit.data.feeding import (
    decoded_ahead,
    independent_reads,
    loader_options,
    loader_workers,
    on_device,
    read_in_threads,
    read_threads,
)
from evalkit.data.resolve import pixels_setting
from evalkit.errors import EvalkitError, warn_once
from evalkit.progress import ProgressBar
from evalkit.storage import shards as files
from evalkit.storage.identity import library_versions, read_json, spec_key, write_json

FORMAT_VERSION = 4  # 2: checksummed shards, keys from feature_spec; 3: shards know their place;
# 4: a key names only the libraries that run its backbone
STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WORKER_PREFIX = "evalkit.errors.EvalkitError: "
META = "meta.json"


@dataclass(frozen=True)
class FeatureRequest:
    layers: tuple[int, ...] = (-1,)
    pool: str = "cls"
    dense: bool = False
    frames: int | None = None  # frames per clip for video datasets; None for images

    def key_material(self) -> dict:
        """What enters the cache key (``frames`` only when set, so image keys stay stable)."""
        material = asdict(self)
        if self.frames is None:
            del material["frames"]
        return material


@dataclass(frozen=True)
class ExtractSettings:
    cache_dir: Path | None = None  # None: no cache (--no-cache)
    batch_size: int = 64
    workers: int | None = None  # None: worker processes only when the data is large
    device: str = "cpu"
    dtype: str = "fp32"  # fp32 | bf16 (autocast)
    cache_dtype: str = "fp32"  # what features are stored and returned in: fp32 | bf16 | fp16
    shard_size: int = 1024
    progress: bool = True
    verify_cache: bool = False  # re-read every cached shard, whatever its stamp
    read_only: bool = False  # the cache is read, never written: what it lacks stays in memory
    # the batch that fits: halved on an out-of-memory error, kept for the run's later batches
    limit: BatchLimit = field(default_factory=BatchLimit, compare=False, repr=False)

    @property
    def writable_cache(self) -> Path | None:
        """Where a task may keep what it computes (checkpoints, classifiers); None when the
        cache is off or read-only."""
        return None if self.read_only else self.cache_dir


class FeatureSet:
    """The features of one split: a view over its shards — dicts in memory when nothing is
    cached, else verified shard files read one at a time when asked for.

    Features come in the dtype they are stored in (``ExtractSettings.cache_dtype``); tasks
    compute in float32 or wider. ``labels`` (N,) is always in memory. ``take(indices)`` and ``chunks()`` hold at most one
    shard beyond what they return; ``pooled`` ((N, D), or (N, T, D) for clips of T frames) and
    ``grids`` (per layer (N, D, h, w), dense only) concatenate the whole split, for tasks whose
    split fits in memory."""

    def __init__(self, parts: list, *, from_cache=False, dataset_id=""):
        self.parts = parts  # per shard: a dict of tensors, or the Path of a verified file
        part_labels = [files.read_labels(p) for p in parts]
        self.labels = torch.cat(part_labels).long() if parts else torch.empty(0, dtype=torch.long)
        sizes = [len(labels) for labels in part_labels]
        self.starts = torch.tensor([0, *sizes]).cumsum(0)[:-1] if parts else torch.zeros(0)
        self.from_cache, self.dataset_id = from_cache, dataset_id
        self.extracted = 0  # rows computed for this call rather than read from the cache
        self._held: tuple[int, dict] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def keys(self) -> list[str]:
        return _part_keys(self.parts[0]) if self.parts else ["pooled"]

    def shard(self, index: int) -> dict:
        part = self.parts[index]
        if isinstance(part, dict):
            return part
        if self._held is None or self._held[0] != index:
            self._held = (index, files.read_shard(part))
        return self._held[1]

    def chunks(self, key: str = "pooled"):
        """Each shard's ``key`` tensor in order: the split without holding it whole."""
        for index in range(len(self.parts)):
            yield self.shard(index)[key]

    def take(self, indices, key: str = "pooled", read=None) -> torch.Tensor:
        """Rows ``indices`` (in that order), reading only the shards that hold them; ``read``
        (a shard's index → its ``key`` tensor) stands in for reading a shard, e.g. a cache."""
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if not len(idx):
            return torch.empty(0, 0)
        read = read or (lambda index: self.shard(index)[key])
        shard_of = self._shard_of(idx)
        out = None
        for index in shard_of.unique().tolist():
            mask = shard_of == index
            rows = read(index)[idx[mask] - self.starts[index]]
            if out is None:
                out = rows.new_empty((len(idx), *rows.shape[1:]))
            out[mask] = rows
        return out

    def by_shard(self, indices, key: str = "pooled"):
        """(rows, indices) per shard for sorted ``indices``: each shard read once, in order."""
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        shard_of = self._shard_of(idx)
        for index in shard_of.unique().tolist():
            mine = idx[shard_of == index]
            yield self.shard(index)[key][mine - self.starts[index]], mine

    def _shard_of(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.starts, idx, right=True) - 1

    @property
    def pooled(self) -> torch.Tensor:
        return torch.cat(list(self.chunks("pooled"))) if self.parts else torch.empty(0, 0)

    @property
    def grids(self) -> list[torch.Tensor]:
        layers = sorted(k for k in self.keys() if k.startswith("grid."))
        return [torch.cat(list(self.chunks(k))) for k in layers]


def _part_keys(part) -> list[str]:
    if isinstance(part, dict):
        return list(part)
    from safetensors import safe_open

    with safe_open(str(part), framework="pt") as f:
        return list(f.keys())


def backbone_spec(info, dtype: str) -> dict:
    """Everything about a backbone that changes its features: name, weights content id, every
    constructor option, preprocessing, compute dtype and the versions of the libraries that run
    it. The device type is added by ``feature_spec``."""
    return {
        "name": info.name,
        "weights": info.weights_id,
        "options": info.options,
        "preprocess": info.preprocess.as_dict(),
        "dtype": dtype,
        "libraries": library_versions(info.name),
    }


def backbone_key(info, dtype: str) -> str:
    """The key of ``backbone_spec``: entries computed by one backbone setup share it."""
    return spec_key(backbone_spec(info, dtype), length=16)


def cached_bytes(root: Path, key: str) -> int:
    """Bytes of the complete feature entries of the backbone setup of ``key`` under ``root``:
    what a job of that setup will read rather than write."""
    return sum(
        entry["bytes"]
        for entry in list_cache(root)
        if entry["area"] == "features" and entry.get("backbone_key") == key and entry["complete"]
    )


def feature_spec(
    info,
    request: FeatureRequest,
    *,
    dtype: str,
    dataset_id: str,
    split: str,
    subset: Sequence[int] | None,
    shard_size: int = 1024,
    storage: str = "fp32",
    device: str = "cpu",
) -> dict:
    """The one description of what produces a set of cached features (and how they are cut
    into shards: an entry's shards must all have the same boundaries). The device type is
    part of it: a GPU's kernels (cuDNN convolutions, fused attention) differ from a CPU's in
    the last bits, and a probe fitted to one set must not silently read the other."""
    return {
        "shard_size": shard_size,
        "device": torch.device(device).type,
        "format": FORMAT_VERSION,
        "backbone": backbone_spec(info, dtype),
        "request": request.key_material(),
        "storage": storage,
        "dataset": dataset_id,
        "split": split,
        "subset": subset_key(subset),
    }


def cache_key(info, request: FeatureRequest, **spec) -> str:
    """The folder name of a cache entry: the key of its ``feature_spec``."""
    return spec_key(feature_spec(info, request, **spec))


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


@dataclass
class Feed:
    """Where a split's images come from: decoded by the loader, or read from the pixel cache
    for the shards it holds (``cached``)."""

    dataset: object
    shards: list[list[int]]
    settings: ExtractSettings
    pixels: PixelStore | None = None
    cached: set[int] = field(default_factory=set)

    def order(self, todo: list[int]) -> list[int]:
        """Shards whose views are cached first, then those to decode (looked for only when
        there is something to compute; each is checked as it is read)."""
        if todo and self.pixels is not None:
            self.cached = self.pixels.ready()
        return [i for i in todo if i in self.cached] + [i for i in todo if i not in self.cached]

    def batches(self, todo: list[int]) -> list[list[int]]:
        size = self.settings.batch_size
        return [
            self.shards[i][j : j + size] for i in todo for j in range(0, len(self.shards[i]), size)
        ]

    def images(self, todo: list[int]):
        """(images, labels) of the ``todo`` shards' batches, in that order: without worker
        processes, read and decoded by a thread a few batches ahead of the forward."""
        decode = self.batches([i for i in todo if i not in self.cached])
        workers = loader_workers(self.settings.workers, self.settings.device, len(decode))
        batches = self._batches(todo, decode, workers)
        return batches if workers else decoded_ahead(batches)

    def _batches(self, todo: list[int], decode: list[list[int]], workers: int):
        size = self.settings.batch_size
        for index in (i for i in todo if i in self.cached):
            shard = self.pixels.read(index)
            if shard is None:  # damaged (reported and removed): its images are decoded
                self.cached.discard(index)
                yield from self._decoded(self.batches([index]), workers=0)
                continue
            for start in range(0, len(shard["labels"]), size):
                yield shard["images"][start : start + size], shard["labels"][start : start + size]
        if decode:
            yield from self._decoded(decode, workers)

    def _decoded(self, batches: list[list[int]], workers: int):
        """The batches decoded by worker processes, or in this process: by several threads
        where the reader allows it, else in turn."""
        options = loader_options(self.settings.device, workers)
        if workers or not independent_reads(self.dataset):
            return torch.utils.data.DataLoader(self.dataset, batch_sampler=batches, **options)
        decoded = read_in_threads(self.dataset, batches, read_threads())
        return map(_pinned, decoded) if options["pin_memory"] else decoded

    def source(self, index: int) -> str | None:
        """The cached shard the views of shard ``index`` were read from (None: decoded from
        the image files, whose identity is in the entry's key)."""
        if index not in self.cached:
            return None
        folder = self.pixels.folder
        return f"{folder.parent.name}/{folder.name}/{files.shard_path(folder, index).name}"

    def keep(self, index: int, images: list[torch.Tensor], labels: torch.Tensor):
        """Keep a decoded shard's views for the next backbone (on the rank that writes)."""
        if self.pixels is not None and index not in self.cached and distributed.current().writer:
            self.pixels.save(index, torch.cat(images), labels)


def _pinned(batch: list) -> list:
    """A collated batch with its tensors in pinned memory, as the loader pins them."""
    return [item.pin_memory() if isinstance(item, torch.Tensor) else item for item in batch]


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


# What the cache keeps: decoded views (pixels.py), and features, some computed from those views
# (so views are verified first, and features derived from a damaged view follow it).
AREAS = ("pixels", "features")


def list_cache(root: Path) -> list[dict]:
    """One dict per cache entry (features, then decoded views): key, area, backbone (the
    views': their size and decoder), split, n, shards on disk, complete, bytes."""
    entries = []
    folders = [f for area in AREAS for f in sorted((Path(root) / area).glob("*"))]
    for folder in folders:
        meta = read_json(folder / META)  # {}: none yet, or another user's private entry
        if not meta:
            continue
        on_disk = list(folder.glob("shard-*.safetensors"))
        entries.append(
            {
                "key": folder.name,
                "area": folder.parent.name,
                **meta,
                "shards": len(on_disk),
                "complete": (folder / files.MANIFEST).exists(),
                "bytes": sum(f.stat().st_size for f in on_disk),
            }
        )
    return entries


def verify_cache(
    root: Path, *, backbone: str | None = None, progress: bool = True, read_only: bool = False
) -> list[dict]:
    """Re-read every shard of every entry (or of ``backbone``'s) against its checksum, place
    and the manifest, whatever its stamp; a bad shard is deleted (unless ``read_only``), so
    the next run recomputes it, and so is every feature shard computed from a view found bad
    (views are verified first). One dict per entry: key, backbone, split, shards checked, bad."""
    entries = [e for e in list_cache(root) if backbone in (None, e["backbone"])]
    total = sum(e["shards"] for e in entries)
    report = []
    with ProgressBar(progress, total, "verify cache", unit="shard") as advance:
        for entry in entries:
            folder = Path(root) / entry["area"] / entry["key"]
            if "shard_size" not in entry:  # written before shards knew their place
                report.append({**entry, "checked": 0, "bad": entry["shards"], "old": True})
                advance(entry["shards"])
                continue
            wanted = files.places(entry["key"], entry["n"], entry["shard_size"])
            bad = files.verify_shards(
                folder, wanted, recheck=True, advance=advance, read_only=read_only
            )
            derived = files.derived_from_damaged(Path(root), folder, wanted)
            if derived and not read_only:
                files.drop_derived(folder, derived)
            bad = set(bad) | set(derived)
            report.append({**entry, "checked": entry["shards"], "bad": len(bad), "old": False})
    return report


def clear_cache(root: Path, *, backbone: str | None = None) -> int:
    removed = 0
    for entry in list_cache(root):
        if backbone is None or entry["backbone"] == backbone:
            shutil.rmtree(Path(root) / entry["area"] / entry["key"])
            removed += 1
    return removed
