"""The one seed rule: every random draw in evalkit comes from a job's seed through here.

A job has one root seed (``--seed``). Anything random inside it — a batch order, a caption
pick, an augmentation, a corruption's noise, a parameter's initial value — draws from
``derived_seed(seed, *parts)``: the first 8 bytes of SHA-256 of ``"seed:part:part…"`` read
little-endian, as a 63-bit integer. The parts name the draw (``"epoch", 3``), so two draws
never share a stream by accident, and the value is the same on every Python version,
platform and process (Python's ``hash`` of a tuple is not). With no parts the root seed is
used as it is, so ``generator(seed)`` is ``torch.Generator().manual_seed(seed)``.

Libraries that draw from torch's global generator (timm's and open_clip's initialisation,
torchvision's random transforms, dropout) are seeded only through ``seeded``, which restores
the global state on exit, or ``seed_global`` where the draws happen later, item by item.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch


def derived_seed(seed: int, *parts) -> int:
    """The seed of the draw named by ``parts`` within root ``seed`` (``seed`` itself when no
    part is given)."""
    if not parts:
        return int(seed)
    text = ":".join(str(p) for p in (seed, *parts))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator(seed: int, *parts) -> torch.Generator:
    """A CPU generator for the draw named by ``parts`` (see ``derived_seed``)."""
    return torch.Generator().manual_seed(derived_seed(seed, *parts))


def seed_global(seed: int, *parts) -> None:
    """Seed torch's global generator for draws made by code that takes no generator (an
    augmentation pipeline applied item by item)."""
    torch.manual_seed(derived_seed(seed, *parts))


@contextlib.contextmanager
def seeded(seed: int, *parts):
    """Run the block with torch's global generator seeded for ``parts`` and restore the
    generator afterwards, so what the block draws depends on the seed alone and what runs
    after it is untouched."""
    with torch.random.fork_rng():
        seed_global(seed, *parts)
        yield


def seeded_build(factory, seed: int, *parts):
    """``factory()`` built under ``seeded``: a module whose initial weights come from the seed
    alone, not from whatever the global generator went through before."""
    with seeded(seed, *parts):
        return factory()
