"""Which rows are repeats of one run and what every view calls it. Rows are grouped by repeat key —
task, backbone, weights id, backbone options, settings and data — and two runs of one backbone
never merge: each is labelled with what sets it apart (its weights id, the options and settings
that differ). A cell's key matches failure and study records to the rows of the same cell.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict

from evalkit.core.results import Row
from evalkit.errors import EvalkitError
from evalkit.seeds import SEED_RULE


def cell_key(cell: dict) -> tuple:
    """A cell as failure records and study records name it (task, backbone, seed, the weights
    file given, the backbone options), comparable with ``row_cell``."""
    options = json.dumps(cell.get("options") or {}, sort_keys=True, default=str)
    return (
        cell.get("task"),
        cell.get("backbone"),
        cell.get("seed", 0),
        cell.get("weights"),
        options,
    )


def row_cell(row: Row) -> tuple:
    """The ``cell_key`` of the cell a row belongs to (its weights file read back from
    ``weights_source``)."""
    source = str(row.get("weights_source") or "")
    weights = source.removeprefix("local file ") if source.startswith("local file ") else None
    return cell_key({**row, "options": row.get("backbone_options"), "weights": weights})


def weights_group(row: Row) -> str:
    """Which weights a row came from, for grouping: the weights id, except that random weights
    (whose id follows the seed) form one group, so their seeds aggregate."""
    return "random init" if row.get("random_init") else row.get("weights_id", "")


def repeat_key(row: Row) -> tuple:
    """What makes rows comparable: task, backbone, weights, backbone options, settings and the
    data, and the seed rule its draws followed (``evalkit.seeds``; rule 1 where a row records
    none). Rows differing in anything else (seed, time, machine) are repeats of one run, and
    share this key; a stand-in number and a real one never aggregate, nor do two seed rules."""
    backbone, weights, options = setup_key(row)
    config, data = row.get("config_hash", ""), dataset_label(row)
    return (row["task"], backbone, weights, options, config, data, row.get("seed_rule", 1))


def dataset_label(row: Row) -> str:
    """The data a row was computed on, as views name it: the dataset (``imagenet``,
    ``folder:/data/flowers``) and ``(stand-in)`` for evalkit's embedded stand-in; rows that do
    not record it name their ``dataset`` setting or nothing."""
    recorded = row.get("dataset")
    if isinstance(recorded, dict):
        name = recorded.get("name") or "no dataset"
        return name + (" (stand-in)" if recorded.get("stand_in") else "")
    return str((row.get("config") or {}).get("dataset") or "")


def setup_key(row: Row) -> tuple:
    """The model setup a number belongs to, whatever its task: the backbone, its weights (the
    weights id, or random init, whose seeds aggregate) and its constructor options."""
    options = json.dumps(row.get("backbone_options") or {}, sort_keys=True, default=str)
    return (row["backbone"], weights_group(row), options)


def setup_labels(rows: list[Row]) -> dict[tuple, str]:
    """Model setup → its one label in every view: the backbone alone, or with what sets it
    apart from the other setups of that backbone among ``rows`` (``fake [img_size=64]``, a
    weights id), and ``(random init)`` when its weights are random. Chosen over all the rows
    at once, never per task, so one setup has one label and two setups never share one."""
    return {
        key: setup_label(key[0], parts, random) for key, (parts, random) in _setups(rows).items()
    }


def _setups(rows: list[Row]) -> dict[tuple, tuple[list[str], bool]]:
    """Model setup → (what sets it apart from its backbone's other setups, random init)."""
    by_backbone: dict[str, dict[tuple, Row]] = defaultdict(dict)
    for row in rows:
        by_backbone[row["backbone"]].setdefault(setup_key(row), row)
    found = {}
    for setups in by_backbone.values():
        options = _differing([r.get("backbone_options") or {} for r in setups.values()])
        several_weights = len({weights_group(r) for r in setups.values()}) > 1
        for key, row in setups.items():
            own = row.get("backbone_options") or {}
            parts = [f"{k}={_short(own[k])}" for k in options if k in own]
            if several_weights and not row.get("random_init"):
                parts.append(f"weights {_short(str(row.get('weights_id', '')))}")
            found[key] = (parts, bool(row.get("random_init")))
        labels = {key: setup_label(key[0], *found[key]) for key in setups}
        for key in setups:  # parts cut alike: the options themselves tell them apart
            if list(labels.values()).count(labels[key]) > 1:
                found[key][0].append(f"options {key[2]}")
    return found


def setup_label(name: str, parts: list[str], random_init: bool) -> str:
    """``name [part, part] (random init)``: the one way every view writes a setup."""
    text = name + (f" [{', '.join(parts)}]" if parts else "")
    return text + (" (random init)" if random_init else "")


UNLABELLED_SETTINGS = ("dataset",)  # views show the data beside the label (column or board)


def repeat_labels(rows: list[Row]) -> dict[tuple, str]:
    """Repeat key (``repeat_key``) → how views name the run: its setup's label (``setup_labels``) with the task
    settings it ran away from the task's defaults, where that setup ran the task in more than
    one way (``timm/x [pool=mean]`` beside plain ``timm/x``). Chosen per task over every data
    set at once, so a setup's default run has one label on every board, whatever runs beside
    it; runs that still look alike on one data set get their settings hash, and runs drawn
    under an older seed rule beside runs of this one say which."""
    setups = _setups(rows)
    rules = {row.get("seed_rule", 1) for row in rows}
    variants: dict[tuple, dict[tuple, Row]] = defaultdict(dict)
    for row in rows:  # the task as registered: views may rename it per data set
        task = (row.get("config") or {}).get("name") or row["task"]
        variants[(task, setup_key(row))][repeat_key(row)] = row
    labels = {}
    for (task, setup), specs in variants.items():
        parts, random_init = setups[setup]
        settings = [k for k in _differing([r.get("config") or {} for r in specs.values()])]
        settings = [k for k in settings if k not in UNLABELLED_SETTINGS]
        defaults = task_defaults(task) if settings else {}
        if defaults:  # a setting this version no longer has names no run apart
            settings = [k for k in settings if k in defaults]
        for spec, row in specs.items():
            own = row.get("config") or {}
            shown = [
                k for k in settings if defaults is None or _text(own.get(k)) != defaults.get(k)
            ]
            labels[spec] = setup_label(
                setup[0], parts + [f"{k}={_short(own.get(k))}" for k in shown], random_init
            )
            if len(rules) > 1 and spec[6] != SEED_RULE:  # beside runs drawn as this version draws
                labels[spec] += f" [seed rule {spec[6]}]"
        _tell_apart(labels, specs)
    return labels


@functools.cache
def task_defaults(task: str) -> dict[str, str] | None:
    """The settings ``task`` runs with when none is given, each as JSON text; None for a
    task this installation does not know (its rows then name every setting that differs)."""
    from evalkit.core.catalog import resolve_task

    try:
        config = resolve_task(task).config()
    except (EvalkitError, ImportError):
        return None
    return {key: _text(value) for key, value in config.items()}


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _differing(dicts: list[dict]) -> list[str]:
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({_text(d.get(k)) for d in dicts}) > 1]


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:21] + "..."


def _tell_apart(labels: dict[tuple, str], specs: dict[tuple, Row]):
    """Specs of one data set whose visible differences do not separate them (settings
    recorded the same under different hashes) get their settings hash too."""
    seen: dict[tuple, int] = defaultdict(int)
    for spec in specs:
        seen[(labels[spec], spec[5])] += 1
    for spec in specs:
        if seen[(labels[spec], spec[5])] > 1:
            labels[spec] += f" [settings {spec[4][:8]}]"
