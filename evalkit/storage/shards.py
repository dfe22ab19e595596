"""The feature cache's files: shards that answer only for their own place, and their checks.

A shard (``shard-00000.safetensors`` …) is one slice of a cache entry's rows. Its metadata
names the entry's key, its index and its row range, and its checksum covers those together
with every tensor's name, dtype, shape and bytes. So a shard is trusted only where it was
written: a file copied in from another entry or another index fails the check like a damaged
one (it is reported, deleted and recomputed). A finished entry's ``manifest.json`` also lists
every shard's checksum, so a swapped file is caught even when its own metadata is consistent.

The checksum is XXH3-128 (about 8 GB/s here, SHA-256's rate is 1.2): it is there to find
damage (a truncated, rewritten, rotted or swapped file), not a forger, who could rewrite the
sum as easily as the tensors. Shards written before it carry a SHA-256 under its own key and
are checked by it, so an existing cache stays valid.

Checking reads a shard whole. A warm cache skips that: a shard that passed is recorded in
``verified.json`` by its (size, modification time, inode), and is read whole again only when
that stamp changes. The warm path still reads every shard's header (a few hundred bytes): its
place and checksum must be the ones the entry and its manifest expect, so a shard swapped in
with its stamp kept (``touch -r`` after a copy) is caught without hashing the file. Damage
that keeps both stamp and header (bit rot) in a feature shard is found by ``evalkit cache
verify`` or ``evalkit run --verify-cache``, which re-read every shard whatever its stamp.
Decoded views (``evalkit.cache.pixels``) are not trusted by stamp: ``load_checked`` sums each
one as it is read, since a damaged view would become a new backbone's features.

Only damage a check proves is deleted. A shard this user may not read (another user's in a
shared cache, mode 0600) is ``Unreadable``: reported with its owner, used by no one here and
left as it is; ``may_write`` keeps a run from writing into an entry that holds one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from evalkit.errors import EvalkitError, warn, warn_once
from evalkit.storage.identity import file_stamp, read_json, write_json
from evalkit.storage.writes import not_readable, replaceable, replacing, writable

CHECKSUM = "evalkit_xxh3_128"
LEGACY_CHECKSUM = "evalkit_sha256"  # shards written before XXH3: checked by their own sum
PLACE = "evalkit_place"
SOURCE = "evalkit_source"  # the cached shard a derived shard was computed from
COMPUTED = "evalkit_computed_at"  # when it was computed (seconds since the epoch)
MANIFEST = "manifest.json"
VERIFIED = "verified.json"  # shards whose checksum matched, by stamp
DAMAGED = "damaged.json"  # shards found damaged and removed, with when: derived ones follow
DIGESTS = {CHECKSUM: xxhash.xxh3_128, LEGACY_CHECKSUM: hashlib.sha256}  # in the order looked for
KNOWN_KEYS = {*DIGESTS, PLACE, SOURCE, COMPUTED}


@dataclass(frozen=True)
class Place:
    """Where a shard belongs: entry key, index in the entry, rows [start, stop) of it."""

    entry: str
    index: int
    start: int
    stop: int

    def text(self) -> str:
        return f"{self.entry}|{self.index}|{self.start}:{self.stop}"


def places(entry: str, n: int, shard_size: int) -> list[Place]:
    """The places of an entry of ``n`` rows cut every ``shard_size`` rows."""
    starts = range(0, n, shard_size)
    return [Place(entry, i, s, min(s + shard_size, n)) for i, s in enumerate(starts)]


def shard_path(folder: Path, index: int) -> Path:
    return Path(folder) / f"shard-{index:05d}.safetensors"


class CorruptShard(Exception):
    """A cached shard that cannot be trusted: unreadable, truncated, not matching its sum,
    or written for another entry, index or row range."""


class Unreadable(Exception):
    """A cached file this user may not read (``not_readable``): not damage, so never deleted."""


def shard_checksum(shard: dict[str, torch.Tensor], place: Place, kind: str = CHECKSUM) -> str:
    """The ``kind`` sum (``CHECKSUM`` or ``LEGACY_CHECKSUM``) over the shard's place and every
    tensor's name, dtype, shape and bytes."""
    digest = DIGESTS[kind]()
    digest.update(f"{place.text()}\n".encode())
    for name in sorted(shard):
        tensor = shard[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        if tensor.numel():  # the tensor's own memory, hashed without a copy
            digest.update(tensor.view(torch.uint8).numpy())
    return digest.hexdigest()


def _stored_sum(metadata: dict) -> tuple[str, str | None]:
    """(kind, value) of the checksum a shard's header holds (XXH3, or the SHA-256 of a shard
    written before it); (``CHECKSUM``, None) for a header with neither."""
    return next(((k, metadata[k]) for k in DIGESTS if k in metadata), (CHECKSUM, None))


def _refuse_newer(path: Path, metadata: dict):
    """A header with no sum this version knows, but other evalkit keys, was written by a newer
    evalkit: deleting it as damaged would destroy that version's work in a shared cache."""
    if _stored_sum(metadata)[1] is not None:
        return
    unknown = sorted(k for k in metadata if k.startswith("evalkit_") and k not in KNOWN_KEYS)
    if unknown:
        raise EvalkitError(
            f"{path} was written by a newer evalkit (its header holds {', '.join(unknown)}): "
            "upgrade evalkit to read this cache, or give this one its own --cache-dir"
        )


def save_shard(folder: Path, place: Place, shard: dict, source: str | None = None):
    """Write a shard under a temporary name and rename it into place: a shard on disk is
    whole. A full disk is one line; the partial file is removed, finished shards stay.
    ``source`` names the cached shard it was computed from (``pixels/<key>/shard-….``), so
    that damage found there later removes it too (``derived_from_damaged``)."""
    from safetensors.torch import save_file

    shard = {k: v.contiguous() for k, v in shard.items()}
    metadata = {CHECKSUM: shard_checksum(shard, place), PLACE: place.text()}
    metadata[COMPUTED] = repr(time.time())
    if source is not None:
        metadata[SOURCE] = source
    with replacing(shard_path(folder, place.index)) as tmp:
        save_file(shard, str(tmp), metadata=metadata)


def read_shard(path: Path) -> dict:
    """A shard already verified in this run: read without checking its sum again."""
    from safetensors.torch import load_file

    return load_file(str(path))


def read_labels(part) -> torch.Tensor:
    if isinstance(part, dict):
        return part["labels"]
    from safetensors import safe_open

    with safe_open(str(part), framework="pt") as f:
        return f.get_tensor("labels")


def stored_checksum(path: Path) -> str | None:
    """The checksum in a shard's header (the header alone is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return _stored_sum(f.metadata() or {})[1]


def load_shard(path: Path, place: Place, listed: str | None = None) -> dict:
    """The shard's tensors, checked against its checksum, its place and ``listed`` (the
    manifest's checksum for this index, when there is one)."""
    from safetensors import safe_open

    if (problem := not_readable(path)) is not None:
        raise Unreadable(problem)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            shard = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not iterable
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways
        raise CorruptShard(f"unreadable: {type(exc).__name__}") from exc
    _refuse_newer(path, metadata)
    if metadata.get(PLACE) != place.text():
        raise CorruptShard(f"written for {metadata.get(PLACE)!r}, not {place.text()!r}")
    kind, expected = _stored_sum(metadata)
    if expected is None or shard_checksum(shard, place, kind) != expected:
        raise CorruptShard("checksum mismatch")
    if listed is not None and listed != expected:
        raise CorruptShard("not the shard the entry's manifest lists")
    if any(len(t) != place.stop - place.start for t in shard.values()):
        raise CorruptShard(f"holds a different number of rows than {place.start}:{place.stop}")
    return shard


def verify_shards(
    folder: Path,
    wanted: Iterable[Place],
    *,
    recheck: bool = False,
    advance=None,
    read_only: bool = False,
) -> list[Path]:
    """Check the shards of ``wanted`` that are on disk; a bad one is warned about and deleted
    (with the manifest) so that it is recomputed. Without ``recheck`` a shard whose stamp is in
    ``verified.json`` is not read again. ``advance(1)`` is called per shard on disk. Returns
    the shards not to use: the bad ones, and those this user may not read (reported, kept).
    ``read_only``: nothing is deleted or written (a read-only cache)."""
    folder = Path(folder)
    verified = read_json(folder / VERIFIED)
    on_disk = [p for p in wanted if shard_path(folder, p.index).exists()]
    unknown = unchecked_shards(folder, on_disk, recheck=recheck)
    checked = _checked_in_parallel(folder, unknown, read_only)
    bad, skipped = [], []
    for place in on_disk:
        path = shard_path(folder, place.index)
        if isinstance(checked.get(place), Unreadable):
            skipped.append(path)
        elif place in checked:
            verified[path.name] = checked[place]
            if checked[place] is None and (read_only or not path.exists()):
                bad.append(path)
        if advance is not None:
            advance(1)
    if not read_only:
        _forget_damaged(folder, bad, verified)
    return bad + skipped


def _forget_damaged(folder: Path, bad: list[Path], verified: dict):
    """Drop the manifest of an entry that lost shards, mark them damaged, and record the
    stamps of the sound ones (a memo: where it cannot be written they are checked again)."""
    if bad:
        (folder / MANIFEST).unlink(missing_ok=True)
        mark_damaged(folder, [path.name for path in bad])
    with contextlib.suppress(OSError, EvalkitError):
        write_json(folder / VERIFIED, {k: v for k, v in verified.items() if v})


def mark_damaged(folder: Path, names: list[str]):
    """Record that the shards ``names`` of an entry were found damaged and removed, and when:
    whatever was computed from them before then is as damaged as they were."""
    found = read_json(Path(folder) / DAMAGED)
    write_json(Path(folder) / DAMAGED, found | {name: time.time() for name in names})


def derived_from_damaged(root: Path, folder: Path, wanted: Iterable[Place]) -> list[Path]:
    """The shards of ``folder`` computed from a cached shard (their ``SOURCE``) that was
    later found damaged: computed before that damage was found, they may carry it. Read from
    headers only, and only when some source entry records damage."""
    if not any(Path(root).glob(f"*/*/{DAMAGED}")):
        return []
    derived = []
    for place in wanted:
        path = shard_path(folder, place.index)
        source, computed = _source_of(path) if path.exists() else (None, 0.0)
        if source is None:
            continue
        entry, _, name = source.rpartition("/")
        found = read_json(Path(root) / entry / DAMAGED).get(name)
        if found is not None and found >= computed:
            derived.append(path)
    return derived


def _source_of(path: Path) -> tuple[str | None, float]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:  # noqa: BLE001 - an unreadable shard is the checksum check's to report
        return None, 0.0
    return metadata.get(SOURCE), float(metadata.get(COMPUTED, 0.0))


def drop_derived(folder: Path, derived: list[Path]):
    """Remove shards computed from damaged ones (with the entry's manifest), and record it."""
    for path in derived:
        warn(f"cached features {path} were computed from a damaged cached shard: recomputing them")
        path.unlink(missing_ok=True)
    (Path(folder) / MANIFEST).unlink(missing_ok=True)
    mark_damaged(folder, [path.name for path in derived])


def shard_index(path: Path) -> int:
    return int(Path(path).stem.removeprefix("shard-"))


def _header_matches(path: Path, place: Place, listed: dict) -> bool:
    """The shard's header names this place, and the checksum the manifest lists (if any)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:  # noqa: BLE001 - an unreadable header is checked in full, and fails there
        return False
    expected = listed.get(str(place.index))
    return metadata.get(PLACE) == place.text() and expected in (None, _stored_sum(metadata)[1])


def unchecked_shards(folder: Path, wanted: Iterable[Place], recheck: bool = False) -> list[Place]:
    """The shards of ``wanted`` on disk that have not passed a full check since they last
    changed (by their stamp in ``verified.json``), or whose header is not the one their place
    and the entry's manifest expect: every one of them with ``recheck``."""
    folder = Path(folder)
    verified, listed = read_json(folder / VERIFIED), _listed(folder)

    def known(place: Place) -> bool:
        path = shard_path(folder, place.index)
        stamp = file_stamp(path)
        return (
            stamp is not None
            and verified.get(path.name) == stamp
            and _header_matches(path, place, listed)
        )

    on_disk = [p for p in wanted if shard_path(folder, p.index).exists()]
    return [p for p in on_disk if recheck or not known(p)]


def load_checked(
    folder: Path, place: Place, read_only: bool = False, what: str = "features"
) -> dict | None:
    """The shard at ``place``, read and checked in full, for a reader that checks each shard
    as it uses it (the pixel cache, on every read). None when it is damaged, which is reported
    and handled as ``verify_shards`` handles it (removed with the manifest and marked damaged;
    only reported in a read-only cache), or when this user may not read it (reported, kept).
    ``what`` the shard holds names it in the warning."""
    folder, path = Path(folder), shard_path(folder, place.index)
    try:
        return load_shard(path, place, _listed(folder).get(str(place.index)))
    except Unreadable as exc:
        _report_unreadable(path, exc, what)
    except CorruptShard as exc:
        _report_damaged(path, exc, read_only, what)
        if not read_only:
            (folder / MANIFEST).unlink(missing_ok=True)
            mark_damaged(folder, [path.name])
    return None


def _listed(folder: Path) -> dict:
    """Each shard's checksum as the entry's manifest lists it (empty before it is complete)."""
    return read_json(Path(folder) / MANIFEST).get("checksums", {})


AGAIN = {"features": "recomputing them", "views": "decoding their images again"}


def _report_damaged(path: Path, problem: CorruptShard, read_only: bool, what: str = "features"):
    warn(f"cached {what} {path} are unusable ({problem}): {AGAIN[what]}")
    if not read_only:
        path.unlink(missing_ok=True)


def _report_unreadable(path: Path, problem: Unreadable, what: str = "features"):
    warn_once(
        ("unreadable", path),
        f"cached {what} {path} are skipped, {problem}: {AGAIN[what]} here; it is left as it is",
    )


def may_write(folder: Path) -> bool:
    """Whether this process may change the entry at ``folder``: create files in it, and read
    and replace each of its files. One holding another user's files that this user may not
    read or replace (a private umask, a sticky shared folder) is read where it can be and
    never written: what it lacks is computed and not kept, and nothing of it is deleted."""
    folder = Path(folder)
    if not os.path.exists(folder):  # it is made in the nearest folder there is (or cannot be)
        return writable(next(p for p in folder.parents if os.path.exists(p)))
    try:
        names = [p for p in folder.iterdir() if not p.name.startswith(".")]
    except OSError:
        return False
    return writable(folder) and all(
        replaceable(p) and not_readable(p) is None for p in names if p.is_file()
    )


def searchable(folder: Path, what: str = "features") -> bool:
    """Whether the entry at ``folder`` exists and its files can be looked at; another user's
    private folder cannot, which is reported (its ``what`` are then computed here)."""
    folder = Path(folder)
    hidden = next((p for p in folder.parents if not os.access(p, os.X_OK)), None)
    if hidden is None and not folder.exists():
        return False
    if hidden is None and os.access(folder, os.R_OK | os.X_OK):
        return True
    place = hidden or folder
    _report_unreadable(place, Unreadable(not_readable(place) or "permission denied"), what)
    return False


def _checked_in_parallel(folder: Path, places: list[Place], read_only: bool):
    """Each of ``places``' stamp after a full check (None: unusable, or too fresh to vouch
    for; ``Unreadable``: this user may not read it). The shards are read and hashed on torch's threads at once (hashing releases the
    interpreter); the warnings of bad ones come after, in the shards' order."""
    from concurrent.futures import ThreadPoolExecutor

    listed = _listed(folder)

    def check(place: Place) -> str | CorruptShard | Unreadable | None:
        path = shard_path(folder, place.index)
        try:
            load_shard(path, place, listed.get(str(place.index)))
            return file_stamp(path) or (read_only and "fresh")
        except (CorruptShard, Unreadable) as exc:
            return exc

    with ThreadPoolExecutor(
        max_workers=max(1, min(torch.get_num_threads(), len(places), 8))
    ) as pool:
        results = dict(zip(places, pool.map(check, places), strict=True))
    for place, result in results.items():
        if isinstance(result, Unreadable):
            _report_unreadable(shard_path(folder, place.index), result)
        elif isinstance(result, CorruptShard):
            _report_damaged(shard_path(folder, place.index), result, read_only)
            results[place] = None
    return results


def write_manifest(folder: Path, wanted: list[Place], n: int):
    """Mark an entry complete, listing each shard's checksum (read from its header)."""
    sums = {str(p.index): stored_checksum(shard_path(folder, p.index)) for p in wanted}
    write_json(Path(folder) / MANIFEST, {"shards": len(wanted), "n": n, "checksums": sums})
