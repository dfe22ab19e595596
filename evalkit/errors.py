"""User-facing errors: one line that says what was expected and how to fix it.

The CLI prints an ``EvalkitError`` as ``error: <message>`` and exits with code 2; every other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import sys


class EvalkitError(Exception):
    """A problem with the user's input (names, data, weights, options), not with evalkit."""


def did_you_mean(name: str, choices, listing: str | None = "evalkit ls tasks") -> str:
    """A short hint naming the closest valid choices, or all of them when few (or when there
    is no ``listing``: the command that lists them)."""
    choices = list(choices)
    starting = [c for c in sorted(choices) if name and c.startswith(name)]
    close = list(
        dict.fromkeys(starting + difflib.get_close_matches(name, choices, n=3, cutoff=0.5))
    )[:3]
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if len(choices) <= 12 or listing is None:
        return "choose from " + ", ".join(sorted(choices))
    return f"run `{listing}` to see the choices"


EXTRAS = {  # an optional package's top module → the evalkit extra that installs it
    "open_clip": "clip",
    "datasets": "hf",
    "av": "video",
    "submitit": "cluster",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "sqlalchemy": "mlflow",
    "alembic": "mlflow",
    "tensorboard": "tensorboard",
    "huggingface_hub": "hub",
}


def install_hint(module: str | None) -> str | None:
    """``pip install 'evalkit[clip]'`` for a missing optional ``module``; None for others."""
    extra = EXTRAS.get((module or "").partition(".")[0])
    return f"pip install 'evalkit[{extra}]'" if extra else None


def warn(message: str):
    """One line on stderr for something evalkit recovered from by itself."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


_WARNED: set = set()


def warn_once(about, message: str):
    """``warn``, once per process for each ``about`` (a switch-off said every batch is noise)."""
    if about not in _WARNED:
        _WARNED.add(about)
        warn(message)
