"""Where the Hugging Face hub's cache is and whether the hub can be reached: shared by hub
backbones (``evalkit.backbones.hub``) and hub datasets (``--set dataset=hf:ORG/NAME@REV``)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path


def hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout`` seconds."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def quiet_network():
    """Without a network the hub client and urllib3 log every retry (a screenful); the one
    line evalkit raises says all of it."""
    names = ("huggingface_hub", "urllib3", "requests", "httpx")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
