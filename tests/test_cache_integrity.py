"""A cached shard answers only for its own entry and place; damage under a kept stamp is found
by `evalkit cache verify` and `run --verify-cache`; a full disk is one line."""

import errno
import json
import os
import shutil

import pytest
import torch

from evalkit.cache.extraction import extract_features
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.cli import main
from evalkit.data import DataConfig
from evalkit.data.resolve import open_dataset
from evalkit.errors import EvalkitError
from evalkit.storage import shards
from evalkit.storage.identity import file_stamp


def _extract(backbone, data_cache, cache, pool="cls"):
    dataset = open_dataset(
        "imagenet",
        "val",
        DataConfig(source="embedded", cache=data_cache, pixels="decode"),
        transform=backbone.transform(),
    )
    # the views decoded each time: a shard computed from kept views also names them (its
    # source), and these tests swap shards of equal size between entries
    settings = ExtractSettings(cache_dir=cache, shard_size=128, progress=False)
    return extract_features(
        backbone, dataset, request=FeatureRequest(pool=pool), settings=settings, split="val"
    )


def _entry(cache, pool_of_entry):
    """The entry folder whose meta says ``pool``."""
    for folder in (cache / "features").iterdir():
        if json.loads((folder / "meta.json").read_text())["request"]["pool"] == pool_of_entry:
            return folder
    raise AssertionError(pool_of_entry)


def _age(path):
    """Old enough that its stamp is vouched for in verified.json."""
    old = path.stat().st_mtime_ns - 60 * 10**9
    os.utime(path, ns=(old, old))


def test_a_shard_copied_from_another_entry_is_recomputed(fake, data_cache, tmp_path, capsys):
    clean = _extract(fake, data_cache, tmp_path).pooled
    _extract(fake, data_cache, tmp_path, pool="mean")
    mine, other = _entry(tmp_path, "cls"), _entry(tmp_path, "mean")
    shutil.copy2(other / "shard-00001.safetensors", mine / "shard-00001.safetensors")
    again = _extract(fake, data_cache, tmp_path)
    assert torch.equal(again.pooled, clean) and not again.from_cache
    err = " ".join(capsys.readouterr().err.split())
    assert "shard-00001.safetensors are unusable (written for" in err


def test_a_shard_moved_to_another_index_is_recomputed(fake, data_cache, tmp_path, capsys):
    clean = _extract(fake, data_cache, tmp_path).pooled
    folder = _entry(tmp_path, "cls")
    shutil.copy2(folder / "shard-00000.safetensors", folder / "shard-00001.safetensors")
    assert torch.equal(_extract(fake, data_cache, tmp_path).pooled, clean)
    assert "written for" in capsys.readouterr().err


def test_a_consistent_shard_the_manifest_does_not_list_is_recomputed(
    fake, data_cache, tmp_path, capsys
):
    clean = _extract(fake, data_cache, tmp_path).pooled
    folder = _entry(tmp_path, "cls")
    place = shards.places(folder.name, len(clean), 128)[2]
    forged = shards.read_shard(shards.shard_path(folder, 2))
    forged["pooled"] = forged["pooled"] + 1  # its own sum and place are right
    shards.save_shard(folder, place, forged)
    assert torch.equal(_extract(fake, data_cache, tmp_path).pooled, clean)
    assert "not the shard the entry's manifest lists" in " ".join(capsys.readouterr().err.split())


def _rot_keeping_stamp(path):
    """Change bytes inside a tensor, keeping size, modification time and inode."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-40:-30] = bytes(b ^ 0x55 for b in data[-40:-30])
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_stamp(path) == f"{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"


def test_cache_verify_finds_damage_that_kept_its_stamp(fake, data_cache, tmp_path, capsys):
    clean = _extract(fake, data_cache, tmp_path).pooled
    folder = _entry(tmp_path, "cls")
    for shard in folder.glob("shard-*"):
        _age(shard)
    _extract(fake, data_cache, tmp_path)  # vouches for every stamp
    victim = folder / "shard-00002.safetensors"
    count = len(list(tmp_path.glob("*/*/shard-*")))  # the features' and the decoded views'

    _rot_keeping_stamp(victim)
    assert not torch.equal(_extract(fake, data_cache, tmp_path).pooled, clean)  # the trade-off
    assert main(["cache", "verify", "--cache-dir", str(tmp_path), "--quiet"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{count} shards checked, 1 damaged" in out and not victim.exists()
    assert torch.equal(_extract(fake, data_cache, tmp_path).pooled, clean)
    assert main(["cache", "verify", "--cache-dir", str(tmp_path), "--quiet"]) == 0


def test_run_verify_cache_finds_damage_that_kept_its_stamp(cli_env, tmp_path, capsys):
    def run(out, *extra):
        argv = [
            "run",
            "--task",
            "imagenet-linear",
            "--backbone",
            "fake",
            "--data",
            "embedded",
            "--quiet",
            "--cache-dir",
            str(tmp_path / "c"),
            "--out",
            str(tmp_path / out),
        ]
        assert main([*argv, *extra]) == 0
        rows = [json.loads(line) for line in (tmp_path / out / "imagenet-linear.jsonl").open()]
        return {r["metric"]: r["value"] for r in rows}

    clean = run("clean")
    for shard in (tmp_path / "c" / "features").glob("*/shard-*"):
        _age(shard)
    assert run("vouched") == clean
    [victim, *_] = sorted((tmp_path / "c" / "features").glob("*/shard-*"))
    _rot_keeping_stamp(victim)
    assert run("checked", "--verify-cache") == clean
    assert "unusable (checksum mismatch)" in " ".join(capsys.readouterr().err.split())


def test_verify_all_rehashes_memoised_content_ids(tmp_path, capsys):
    from evalkit.storage.identity import content_id

    weights = tmp_path / "w.bin"
    weights.write_bytes(b"a" * 1000)
    _age(weights)
    first = content_id(weights, memo_dir=tmp_path / "identity")
    _rot_keeping_stamp(weights)
    assert content_id(weights, memo_dir=tmp_path / "identity") == first  # memo by stamp
    assert main(["cache", "verify", "--all", "--cache-dir", str(tmp_path), "--quiet"]) == 1
    assert "1 changed under a kept stamp" in " ".join(capsys.readouterr().out.split())
    assert content_id(weights, memo_dir=tmp_path / "identity") != first


def test_a_full_disk_while_writing_a_shard_is_one_line(fake, data_cache, tmp_path, monkeypatch):
    import safetensors.torch

    written = []

    def fill_up(tensors, filename, metadata=None):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(filename)
        real(tensors, filename, metadata=metadata)

    real = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file", fill_up)
    with pytest.raises(EvalkitError, match="no space left on the device writing .*shard-00001"):
        _extract(fake, data_cache, tmp_path)
    folder = _entry(tmp_path, "cls")
    assert sorted(p.name for p in folder.iterdir() if "shard" in p.name) == [
        "shard-00000.safetensors"
    ]  # the finished shard is kept, no partial file left


def test_a_shard_swapped_in_under_its_stamp_is_caught_on_the_warm_path(
    fake, data_cache, tmp_path, capsys
):
    """Another entry's shard written over this one in place, size, inode and modification
    time kept (``cat other > mine; touch -r``): the header says whose it is."""
    clean = _extract(fake, data_cache, tmp_path).pooled
    _extract(fake, data_cache, tmp_path, pool="mean")
    mine, other = _entry(tmp_path, "cls"), _entry(tmp_path, "mean")
    for shard in mine.glob("shard-*"):
        _age(shard)
    _extract(fake, data_cache, tmp_path)  # vouches for every stamp
    victim = mine / "shard-00001.safetensors"
    stat = victim.stat()
    swapped = (other / "shard-00001.safetensors").read_bytes()
    assert len(swapped) == stat.st_size
    with open(victim, "r+b") as f:
        f.write(swapped)
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_stamp(victim) == f"{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    again = _extract(fake, data_cache, tmp_path)
    assert torch.equal(again.pooled, clean)
    assert "shard-00001.safetensors are unusable (written for" in " ".join(
        capsys.readouterr().err.split()
    )


def _rot_labels_keeping_stamp(path):
    """Overwrite a shard's label array with a huge class index, keeping its stamp."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little")
    start, stop = json.loads(data[8 : 8 + header])["labels"]["data_offsets"]
    data[8 + header + start : 8 + header + stop] = b"\x7f" * (stop - start)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_damaged_labels_under_a_kept_stamp_are_one_line(cli_env, tmp_path, capsys):
    """Labels rotted to an out-of-range class (read without their checksum, as a vouched
    stamp allows) must not reach a task: not a wrong number, not a 3-TB allocation."""
    argv = [
        "run",
        "--task",
        "imagenet-knn",
        "--backbone",
        "fake",
        "--data",
        "embedded",
        "--quiet",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    for shard in (tmp_path / "c" / "features").glob("*/shard-*"):
        _age(shard)
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0  # vouches for every stamp
    [victim, *_] = sorted((tmp_path / "c" / "features").glob("*/shard-*"))
    _rot_labels_keeping_stamp(victim)
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "c2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds labels that are not the data set's" in err[0], err


def _bytes_summed(shard: dict, place: shards.Place) -> list[bytes]:
    """What a shard's checksum covers, spelled out here: its place, then each tensor's name,
    dtype, shape and bytes in name order."""
    parts = [f"{place.text()}\n".encode()]
    for name in sorted(shard):
        tensor = shard[name].contiguous()
        parts += [f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode()]
        parts += [tensor.view(torch.uint8).numpy().tobytes()]
    return parts


def _one_shard(folder, header_sum=None):
    """A two-tensor shard at index 0 of entry ``e``; ``header_sum`` rewrites its header's sum
    as an older evalkit wrote it (``evalkit_sha256``)."""
    from safetensors.torch import save_file

    place = shards.Place("e", 0, 0, 4)
    shard = {"pooled": torch.arange(12.0).view(4, 3), "labels": torch.tensor([3, 1, 4, 1])}
    shards.save_shard(folder, place, shard)
    if header_sum is not None:
        header = {shards.LEGACY_CHECKSUM: header_sum, shards.PLACE: place.text()}
        save_file(shard, str(shards.shard_path(folder, 0)), metadata=header)
    return place, shard


def test_a_shard_sum_is_xxhash_xxh3_128_of_its_place_and_tensors(tmp_path):
    import xxhash

    place, shard = _one_shard(tmp_path)
    expected = xxhash.xxh3_128(b"".join(_bytes_summed(shard, place))).hexdigest()
    assert shards.stored_checksum(shards.shard_path(tmp_path, 0)) == expected
    loaded = shards.load_shard(shards.shard_path(tmp_path, 0), place, listed=expected)
    assert all(torch.equal(loaded[k], shard[k]) for k in shard)


def test_a_shard_written_with_the_older_sha256_sum_is_checked_by_it(tmp_path):
    import hashlib

    place, shard = _one_shard(tmp_path)
    old_sum = hashlib.sha256(b"".join(_bytes_summed(shard, place))).hexdigest()
    _one_shard(tmp_path, header_sum=old_sum)
    path = shards.shard_path(tmp_path, 0)
    assert shards.stored_checksum(path) == old_sum
    assert torch.equal(shards.load_shard(path, place, listed=old_sum)["labels"], shard["labels"])
    _one_shard(tmp_path, header_sum="0" * 64)  # an older shard whose tensors changed
    with pytest.raises(shards.CorruptShard, match="checksum mismatch"):
        shards.load_shard(path, place)


@pytest.mark.parametrize("legacy", [False, True])
def test_one_changed_byte_fails_either_sum(tmp_path, legacy):
    import hashlib

    place, shard = _one_shard(tmp_path)
    if legacy:
        _one_shard(tmp_path, hashlib.sha256(b"".join(_bytes_summed(shard, place))).hexdigest())
    path = shards.shard_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's bytes; the header is untouched
    path.write_bytes(bytes(data))
    with pytest.raises(shards.CorruptShard, match="checksum mismatch"):
        shards.load_shard(path, place)


def test_a_shard_summed_by_a_newer_evalkit_is_refused_and_kept(tmp_path):
    """Deleting it as damaged would destroy a newer version's work in a shared cache."""
    from safetensors.torch import save_file

    place, shard = _one_shard(tmp_path)
    path = shards.shard_path(tmp_path, 0)
    header = {"evalkit_blake3": "ab" * 16, shards.PLACE: place.text()}
    save_file(shard, str(path), metadata=header)
    with pytest.raises(EvalkitError, match="written by a newer evalkit .*evalkit_blake3"):
        shards.verify_shards(tmp_path, [place])
    assert path.exists()
