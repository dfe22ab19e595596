"""The one seed rule: every random draw in evalkit comes from a job's seed through here.

A job has one root seed (``--seed``). Anything random inside it — a batch order, a caption
pick, an augmentation, a corruption's noise, a parameter's initial value — draws from
``derived_seed(seed, name, *parts)``: the first 8 bytes of SHA-256 of ``"seed:name:part…"``
read little-endian, as a 63-bit integer. Every draw has a name (``"head-batches"``,
``"mixup", step``), so two draws never share a stream by accident — a head's initial
weights and its batch order, or a batch's pick and its mixup coefficient, once came from
one seed and so from one stream — and the value is the same on every Python version,
platform and process (Python's ``hash`` of a tuple is not). A draw without a name is
refused. ``SEED_RULE`` numbers the rule: rule 1 let a draw take the root seed unnamed; rows,
random initial weights and trained ladders record the rule, so numbers drawn under another
are never taken for this one's.

Libraries that draw from torch's global generator (timm's and open_clip's initialisation,
torchvision's random transforms, dropout) are seeded only through ``seeded``, which restores
the global state on exit, or ``seed_global`` where the draws happen later, item by item.
"""

from __future__ import annotations

import contextlib
import hashlib

SEED_RULE = 2  # 1: a draw could take the root seed unnamed; 2: every draw is named


def derived_seed(seed: int, name: str, *parts) -> int:
    """The seed of the draw ``name`` (with ``parts``, e.g. a step) within root ``seed``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a draw needs a name (a non-empty string), got {name!r}")
    text = ":".join(str(p) for p in (seed, name, *parts))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator(seed: int, name: str, *parts):
    """A CPU ``torch.Generator`` for the draw ``name`` (see ``derived_seed``)."""
    import torch

    return torch.Generator().manual_seed(derived_seed(seed, name, *parts))


def numpy_generator(seed: int, name: str, *parts):
    """A NumPy ``Generator`` for the draw ``name`` (see ``derived_seed``)."""
    import numpy as np

    return np.random.default_rng(derived_seed(seed, name, *parts))


def seed_global(seed: int, name: str, *parts) -> None:
    """Seed torch's global generator for draws made by code that takes no generator (a
    library's initialisation, an augmentation pipeline applied item by item)."""
    import torch

    torch.manual_seed(derived_seed(seed, name, *parts))


@contextlib.contextmanager
def seeded(seed: int, name: str, *parts):
    """Run the block with torch's global generator seeded for the draw ``name`` and restore
    the generator afterwards, so what the block draws depends on the seed alone and what runs
    after it is untouched."""
    import torch

    with torch.random.fork_rng():
        seed_global(seed, name, *parts)
        yield


def seeded_build(factory, seed: int, name: str, *parts):
    """``factory()`` built under ``seeded``: a module whose initial weights come from the seed
    and the draw's name alone, not from whatever the global generator went through before."""
    with seeded(seed, name, *parts):
        return factory()
