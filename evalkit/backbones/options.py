"""How a backbone is built: the options every adapter accepts, and the constructor options
(``--model-arg``) each family declares.

Constructor options may shape the architecture (image size, depth, pooling, drop rates) and
nothing else. Weights come in through ``--weights PATH`` only, read as safetensors or with
``torch.load(weights_only=True)`` and named in every row by their content id: an option that
makes a constructor read a file, a URL, a hub id or a cache folder (open_clip's
``pretrained_image_path``, timm's ``checkpoint_path``…) could unpickle arbitrary code and would
change the weights behind the cache key's back, so it is refused by name.
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any

# Names that load, locate or fetch weights, whatever the library: pretrained*, *checkpoint*,
# *weights*, *_path, cache_dir, hub ids, URLs, files, load switches.
LOADER_OPTION = re.compile(
    r"pretrained|checkpoint|weights|filename|(^|_)(path|file|dir|url|uri)$|(^|_)(hub|cache|load)(_|$)"
)


@dataclass(frozen=True)
class BackboneOptions:
    weights: str | None = None  # local checkpoint path
    pretrained: bool = False  # the published weights the name's tag names, from the hub cache
    seed: int = 0  # random-init seed when no weights are given
    device: str = "cpu"
    dtype: str = "fp32"  # parameter dtype where the adapter honours it (vit22b: bf16 halves memory)
    random_init: bool = False  # allow random weights where an adapter refuses them by default
    fsdp: bool = False  # vit22b: shard parameters over the data-parallel axis (FSDP2)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. img_size, depth (tests)
    revision: str | None = None  # the hub revision of --pretrained weights (name@REVISION)


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """``--model-arg key=value`` pairs → constructor kwargs; values read as bool, int, float or
    (otherwise) text: ``qk_norm=false``, ``img_size=384``, ``pool=gap``."""
    from evalkit.errors import EvalkitError

    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise EvalkitError(f"--model-arg expects key=value, got {pair!r}")
        out[key] = _literal(raw)
    return out


def _literal(raw: str):
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def declared_options(build) -> frozenset[str]:
    """The constructor options a family's ``build`` accepts: its ``model_options`` attribute,
    or its module's ``MODEL_OPTIONS``; a family that declares none accepts none."""
    declared = getattr(build, "model_options", None)
    if declared is None:
        declared = getattr(sys.modules.get(build.__module__), "MODEL_OPTIONS", ())
    return frozenset(declared)


def check_model_options(family: str, declared: frozenset[str], kwargs: dict[str, Any]) -> None:
    """Refuse, in one line, any option that loads weights or that ``family`` does not declare."""
    from evalkit.errors import EvalkitError, did_you_mean

    for key in kwargs:
        if LOADER_OPTION.search(key.lower()):
            raise EvalkitError(
                f"--model-arg {key} would make the {family} constructor load weights, which "
                "evalkit never lets a constructor do (it could unpickle code, and the rows would "
                "not know the weights): pass the checkpoint file with --weights PATH"
            )
        if key not in declared:
            hint = did_you_mean(key, sorted(declared))
            if not hint.startswith("did you mean"):
                hint = "they take " + (", ".join(sorted(declared)) or "none")
            raise EvalkitError(f"{family} backbones take no --model-arg {key!r}: {hint}")


@contextlib.contextmanager
def rejected_options(name: str, kwargs: dict[str, Any]):
    """A constructor that rejects a ``--model-arg`` value (timm looks ``act_layer`` up in a
    table and raises ``KeyError``, others ``TypeError`` or ``ValueError``) ends in one line
    naming the options; without options its exception is a bug and goes through."""
    from evalkit.errors import EvalkitError

    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever the constructor raised about its input
        if not kwargs:
            raise
        given = " ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EvalkitError(
            f"{name} rejected --model-arg {given} ({type(exc).__name__}: {detail}): "
            "check each value against the model's constructor"
        ) from None
