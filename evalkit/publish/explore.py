"""The images behind the numbers (``evalkit explore RESULTS --out DIR``): a static site, opened
from disk with nothing fetched and no server, that shows per task and pair of setups the images
that flipped each way, each setup's most confident mistakes and its most confused class pairs,
as thumbnails written beside the pages (one small JPEG per image, shared by every page).

It reads the per-image files ``--save-predictions`` keeps (docs/results.md, "Looking at the
images"): classification-type heads (linear probe, kNN, few-shot, zero-shot, LiT), calibration
(also its mistakes by confidence bin, each bin's accuracy beside its confidence),
model-vs-human (also each cue-conflict stimulus's shape or texture decision) and the dense
tasks, segmentation and depth, whose files keep a score per image and no right or wrong (each
setup's worst images on the board's headline metric). Setups are named by the labels every view
prints (``repeat_labels``). Long lists are paged (``PAGE`` images a page) and the filters are
pre-rendered pages, so a page of a 50,000-image set costs what a page of 384 does.

This module finds the boards and their setups and writes the site, a board at a time, and its
index; the pages are made in ``explore_pages`` (what every page shares), ``explore_outputs``
(per-image files in one shape), ``explore_classification`` (mistakes and pairs),
``explore_calibration``, ``explore_cue_conflict`` and ``explore_dense``.
"""

from __future__ import annotations

import html
import itertools
import math
import re
from collections import defaultdict
from pathlib import Path

from evalkit.core.labels import dataset_label, repeat_key, repeat_labels
from evalkit.errors import EvalkitError
from evalkit.publish.board_reading import Cell, folder_rows, output_files, task_label
from evalkit.publish.explore_calibration import calibration_page, confidence_bins_of
from evalkit.publish.explore_classification import setup_page, write_pair
from evalkit.publish.explore_cue_conflict import cue_decisions, write_cue_conflict
from evalkit.publish.explore_dense import write_dense_board
from evalkit.publish.explore_outputs import FLIPS, joined, outputs, right_or_wrong
from evalkit.publish.explore_pages import Setup, Table, Thumbnails, board_section, link, page

DEFAULT_PAIRS_UP_TO = 4  # setups on a board up to which every pair is drawn; else the top two


def write_site(paths, out: Path, *, task=None, pair=(None, None), data_root=None) -> Path:
    """The whole site under ``out``: ``index.html``, a folder per board, ``thumbs/``. ``pair``
    names setups A and B by their labels; ``data_root`` is where relative image ids lie when
    the rows do not say."""
    found = boards(paths, task)
    if not found:
        raise EvalkitError(
            f"no per-image outputs{f' of {task}' if task else ''} under "
            f"{', '.join(map(str, paths))}: rerun with evalkit run ... --save-predictions"
        )
    if any(pair):  # the boards that hold both; if none does, the first says which it holds
        holding = {k: v for k, v in found.items() if set(pair) <= {s.label for s in v}}
        found = holding or dict([next(iter(found.items()))])
    rows = [row for setups in found.values() for s in setups for row in s.rows]
    roots = ([Path(data_root)] if data_root else []) + data_roots(rows)
    out.mkdir(parents=True, exist_ok=True)
    thumbs = Thumbnails(out, roots)
    sections = [write_board(out, setups, pairs(setups, *pair), thumbs) for setups in found.values()]
    (out / "index.html").write_text(index_page(sections, thumbs, roots), encoding="utf-8")
    return out / "index.html"


def index_page(sections: list[str], thumbs: Thumbnails, roots: list[Path]) -> str:
    body = [
        "<p>Per task, each setup's mistakes and, for each pair of setups, the images one got "
        "right and the other wrong; calibration's mistakes by confidence, cue-conflict's shape "
        "and texture decisions, and the dense tasks' worst images. Setups are named as every "
        "evalkit view names them.</p>",
        *sections,
    ]
    if missing := thumbs.missing():
        looked = ", ".join(str(root) for root in roots) or "no data root (pass --data-root)"
        body.append(
            f"<p><em>{missing} of {len(thumbs.made)} images shown have no readable file "
            f"(looked at each id as an absolute path and under: {html.escape(looked)}); a grey "
            "box stands in for each.</em></p>"
        )
    return page("evalkit explore", body, "")


def boards(paths, task: str | None = None) -> dict[str, list[Setup]]:
    """Board (task and data) → its setups that kept per-image outputs, best first on the
    board's headline metric (the first the task reports). Each setup shows its lowest seed's
    file, the one every setup has."""
    rows = folder_rows(paths)
    labels = repeat_labels(rows)
    headline: dict[str, str] = {}
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if task is not None and row["task"] != task:
            continue
        board = task_label(row["task"], dataset_label(row))
        if headline.setdefault(board, row["metric"]) == row["metric"]:
            grouped[(board, repeat_key(row))].append(row)
    found: dict[str, list[Setup]] = defaultdict(list)
    for (board, spec), members in grouped.items():
        setup = _setup(board, labels[spec], members)
        if setup is not None:
            found[board].append(setup)
    for setups in found.values():
        setups.sort(key=lambda s: -s.value if s.higher_is_better else s.value)
        for place, setup in enumerate(setups):
            setup.index = place
    return dict(sorted(found.items()))


def _setup(board: str, label: str, rows: list[dict]) -> Setup | None:
    cell = Cell(rows[0]["backbone"], 0.0, "", rows)
    files = [path for path in output_files(cell) if path.exists()]
    if not files:
        return None
    values = [r["value"] for r in rows if isinstance(r.get("value"), (int, float))]
    value = sum(values) / len(values) if values else math.nan
    higher = bool(rows[0].get("higher_is_better", True))
    return Setup(board, label, value, higher, files[0], len(output_files(cell)), rows)


def pairs(setups: list[Setup], a: str | None, b: str | None) -> list[tuple[Setup, Setup]]:
    """The pairs to draw: the one named (``--a``/``--b``), else every pair of a small board,
    else its top two."""
    if a or b:
        by_label = {s.label: s for s in setups}
        missing = [name for name in (a, b) if name not in by_label]
        if missing:
            raise EvalkitError(
                f"no setup {missing[0]!r} with per-image outputs on {setups[0].board}: expected "
                f"one of {', '.join(map(repr, by_label))} (both --a and --b)"
            )
        return [(by_label[a], by_label[b])]
    if len(setups) <= DEFAULT_PAIRS_UP_TO:
        return list(itertools.combinations(setups, 2))
    return [(setups[0], setups[1])]


def data_roots(rows: list[dict]) -> list[Path]:
    """The dataset roots rows record: a ``data_root``, a dataset's ``root``, the folder of a
    ``folder:`` data set, or where this machine keeps each data set a row names (``a+b`` for
    a task that reads two: model-vs-human's stimuli beside its ImageNet probe)."""
    roots = []
    for row in rows:
        recorded = row.get("dataset") if isinstance(row.get("dataset"), dict) else {}
        named = str((row.get("config") or {}).get("dataset") or "")
        for root in (row.get("data_root"), recorded.get("root")):
            if root:
                roots.append(Path(root))
        if named.startswith("folder:"):
            roots.append(Path(named.removeprefix("folder:")))
        if recorded.get("name") and not named.startswith("folder:"):
            for name in str(recorded["name"]).split("+"):  # a task that reads two sets
                roots += _configured_root(name, bool(recorded.get("stand_in")))
    return list(dict.fromkeys(roots))


def _configured_root(name: str, stand_in: bool) -> list[Path]:
    """Where this machine keeps data set ``name``: the stand-in in the cache (written again,
    the same images, if it was removed), a real set under ``$EVALKIT_DATA``; none when that
    is not set or the kind is not known here."""
    from evalkit.data import DataConfig
    from evalkit.data.resolve import data_kind, dataset_root
    from evalkit.storage.identity import cache_root

    config = DataConfig(source="embedded" if stand_in else "auto", cache=cache_root())
    try:
        return [dataset_root(data_kind(name), config)]
    except (EvalkitError, KeyError, ValueError):
        return []


def slug(text: str) -> str:
    """A file name for a board: letters, digits, dots and dashes only."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "board"


def write_board(out: Path, setups: list[Setup], drawn: list, thumbs: Thumbnails) -> str:
    """A board's pages (each drawn pair's, each setup's of them) and its section of the
    index."""
    folder = out / slug(setups[0].board)
    folder.mkdir(parents=True, exist_ok=True)
    if not right_or_wrong(setups[0].file):  # dense: a score per image, no flips
        return write_dense_board(folder, setups, thumbs)
    shown = list(dict.fromkeys(s for pair in drawn for s in pair)) or setups
    frames = {s.index: outputs(s.file) for s in shown}
    cells, views = {}, {}
    for setup in shown:
        frame = frames[setup.index]
        text = setup_page(setup, frame, thumbs)
        (folder / f"setup-{setup.index}.html").write_text(text, encoding="utf-8")
        cells[setup.index] = [len(frame), int((~frame["right"]).sum())]
        views[setup.index] = extra_views(folder, setup, frame, thumbs)
    items = []
    for a, b in drawn:
        pair_folder = folder / f"{a.index}-vs-{b.index}"
        counts = write_pair(pair_folder, (a, b), joined(frames[a.index], frames[b.index]), thumbs)
        href = f"{folder.name}/{pair_folder.name}/index.html"
        flipped = ", ".join(f"{n} {FLIPS[kind][0]}" for kind, n in counts.items())
        items.append(f"<li>{link(href, f'{a.label} vs {b.label}')}: {html.escape(flipped)}</li>")
    table = Table(["images", "wrong"], cells, views)
    return board_section(folder.name, shown, table, items)


def extra_views(folder: Path, setup: Setup, frame, thumbs: Thumbnails) -> list[tuple[str, str]]:
    """A setup's pages beyond its mistakes, where its file holds what they show: calibration's
    mistakes by confidence bin, cue-conflict's shape and texture decisions; (name, href)."""
    views = []
    bins = confidence_bins_of(setup.file)
    if bins:
        name = f"calibration-{setup.index}.html"
        text = calibration_page(setup, frame, bins, thumbs)
        (folder / name).write_text(text, encoding="utf-8")
        views.append(("by confidence", name))
    cues = cue_decisions(setup.file)
    if cues is not None:
        views.append(("shape or texture", write_cue_conflict(folder, setup, cues, thumbs)))
    return views
