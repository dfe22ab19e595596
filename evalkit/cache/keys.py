"""The keys of feature-cache entries: an entry's key is the hash of ``feature_spec``, everything
that changes the features (the backbone's name, options, weights content id, preprocessing and
dtype, the feature libraries' versions, layers, pooling, dataset identity, split and subset, the
storage dtype, the device type and the shard size); ``backbone_key`` names the entries of one
backbone setup.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evalkit.cache.pixels import subset_key
from evalkit.cache.settings import FeatureRequest
from evalkit.storage.identity import library_versions, spec_key

FORMAT_VERSION = 4  # 2: checksummed shards, keys from feature_spec; 3: shards know their place;
# 4: a key names only the libraries that run its backbone


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
