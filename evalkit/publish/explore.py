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
prints (``spec_labels``). Long lists are paged (``PAGE`` images a page) and the filters are
pre-rendered pages, so a page of a 50,000-image set costs what a page of 384 does.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.core.results import dataset_label, run_spec, spec_labels
from evalkit.errors import EvalkitError
from evalkit.publish.board_reading import Cell, folder_rows, output_files, relative_ids, task_label

PAGE = 60  # images on one page: about 60 × 4 KB of thumbnails and 30 KB of HTML
MISTAKES = 30  # most confident mistakes shown per setup
CONFUSED = 10  # class pairs shown per setup
EXAMPLES = 4  # example images per confused class pair
BIN_MISTAKES = 8  # most confident mistakes shown per confidence bin
WORST = 600  # a dense setup's worst images shown (ten pages)
THUMB = 128  # thumbnails fit in THUMB × THUMB pixels
QUALITY = 80  # JPEG quality of the thumbnails
DEFAULT_PAIRS_UP_TO = 4  # setups on a board up to which every pair is drawn; else the top two
FLIPS = {  # kind → (title, whether A is right, whether B is right)
    "right-to-wrong": ("right → wrong (A right, B wrong)", True, False),
    "wrong-to-right": ("wrong → right (A wrong, B right)", False, True),
}


@dataclass(eq=False)  # hashed by identity: a page set per setup
class Setup:
    """One run spec of a board: its label, headline value and one per-image file."""

    board: str
    label: str
    value: float
    higher_is_better: bool
    file: Path
    seeds: int
    rows: list[dict] = field(repr=False, default_factory=list)
    index: int = 0  # its place on the board, naming its page


# --- finding the setups and their files ------------------------------------------------------


def boards(paths, task: str | None = None) -> dict[str, list[Setup]]:
    """Board (task and data) → its setups that kept per-image outputs, best first on the
    board's headline metric (the first the task reports). Each setup shows its lowest seed's
    file, the one every setup has."""
    rows = folder_rows(paths)
    labels = spec_labels(rows)
    headline: dict[str, str] = {}
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if task is not None and row["task"] != task:
            continue
        board = task_label(row["task"], dataset_label(row))
        if headline.setdefault(board, row["metric"]) == row["metric"]:
            grouped[(board, run_spec(row))].append(row)
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


# --- per-image outputs in one shape for every family -----------------------------------------


def columns_of(path: Path) -> set[str]:
    """The columns of a per-image file, read from its schema alone."""
    import pyarrow.parquet as pq

    return set(pq.read_schema(path).names)


def right_or_wrong(path: Path) -> bool:
    """Whether a per-image file says per image right or wrong (else it keeps scores: dense)."""
    return bool({"correct", "correct_share"} & columns_of(path))


def outputs(path: Path):
    """A setup's per-image file as one frame for every family, indexed by image key: ``image``
    (the id as saved), ``truth``, ``guess`` (what the card prints), ``right``, ``score`` (how
    sure a mistake was, for ordering; NaN where nothing says) and ``predicted`` (the class a
    mistake went to, or None where the file names none: few-shot)."""
    import pandas as pd

    frame = pd.read_parquet(path)
    columns = set(frame.columns)
    if {"category", "decision", "correct"} <= columns:
        shaped = _human(frame)
    elif "correct_share" in columns:
        shaped = _few_shot(frame)
    elif "correct" in columns:
        shaped = _classification(frame)
    else:
        raise EvalkitError(
            f"{path.name} holds no per-image right or wrong: explore shows classification-type "
            "tasks and model-vs-human (dense tasks: evalkit errors)"
        )
    ids = frame["image"].astype(str).tolist()
    if "set" in columns and frame["image"].duplicated().any():  # one stimulus in two sets
        ids = [f"{s}:{i}" for s, i in zip(frame["set"], ids, strict=True)]
    shaped.insert(0, "image", frame["image"].astype(str).to_numpy())
    shaped.index = relative_ids(ids)  # absolute ids of old files pair with today's relative ones
    return shaped


def _classification(frame):
    import numpy as np
    import pandas as pd

    truth = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    guess = frame["prediction_name"] if "prediction_name" in frame else frame["prediction"]
    if "top5_probabilities" in frame:
        score = np.array([p[0] if len(p) else np.nan for p in frame["top5_probabilities"]])
    elif "confidence" in frame:
        score = frame["confidence"].to_numpy(float)
    else:  # older files: raw scores only, which are not a confidence to print
        score = np.full(len(frame), np.nan)
    shown = [
        f"{g} ({s:.2f})" if np.isfinite(s) else str(g) for g, s in zip(guess, score, strict=True)
    ]
    return pd.DataFrame(
        {
            "truth": truth.astype(str).to_numpy(),
            "guess": shown,
            "right": frame["correct"].astype(bool).to_numpy(),
            "score": score,
            "predicted": guess.astype(str).to_numpy(),
        }
    )


def _few_shot(frame):
    """Few-shot keeps whether each draw's probe was right: an image counts as right when more
    than half its draws were, and a mistake is surer the more draws missed it."""
    import pandas as pd

    truth = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    share = frame["correct_share"].astype(float)
    draws = [len(d) for d in frame["correct_by_seed"]] if "correct_by_seed" in frame else None
    shown = [
        f"{round(s * n)}/{n} draws right" if draws else f"{s:.0%} of draws right"
        for s, n in zip(share, draws or [0] * len(share), strict=True)
    ]
    return pd.DataFrame(
        {
            "truth": truth.astype(str).to_numpy(),
            "guess": shown,
            "right": (share > 0.5).to_numpy(),
            "score": (1.0 - share).to_numpy(),
            "predicted": [None] * len(frame),
        }
    )


def _human(frame):
    import numpy as np
    import pandas as pd

    sets = frame["set"].astype(str) if "set" in frame else [""] * len(frame)
    return pd.DataFrame(
        {
            "truth": frame["category"].astype(str).to_numpy(),
            "guess": [
                f"{d} ({s})" if s else str(d) for d, s in zip(frame["decision"], sets, strict=True)
            ],
            "right": frame["correct"].astype(bool).to_numpy(),
            "score": np.full(len(frame), np.nan),  # a decision carries no confidence
            "predicted": frame["decision"].astype(str).to_numpy(),
        }
    )


def joined(a, b):
    """The images both setups scored, in A's order, with each side's columns suffixed."""
    return a.merge(b, how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))


def flips(both, kind: str):
    _, a_right, b_right = FLIPS[kind]
    return both[(both["right_a"] == a_right) & (both["right_b"] == b_right)]


def mistakes(frame):
    """A setup's mistakes, surest first (file order where nothing says how sure)."""
    wrong = frame[~frame["right"]]
    return wrong.sort_values("score", ascending=False, kind="stable", na_position="last")


def confused(frame, top: int = CONFUSED):
    """(true class, predicted class, images) of the most frequent mistakes."""
    wrong = frame[~frame["right"] & frame["predicted"].notna()]
    counts = wrong.groupby(["truth", "predicted"], sort=False).size()
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return [
        (truth, predicted, wrong[(wrong["truth"] == truth) & (wrong["predicted"] == predicted)])
        for (truth, predicted), _ in ordered
    ]


# --- thumbnails --------------------------------------------------------------------------------


def image_file(image: str, key: str, roots: list[Path]) -> Path | None:
    """Where an image's file is: its id as an absolute path, else the id (or its path under
    the ids' shared folder) under each root; None when none is a file."""
    candidates = [Path(image)] if Path(image).is_absolute() else []
    for root in roots:
        candidates += [root / image.lstrip("/"), root / key]
    return next((path for path in candidates if path.is_file()), None)


class Thumbnails:
    """One small JPEG per image under ``OUT/thumbs``, made the first time a page shows the
    image and reused by every other page; an image whose file is missing or unreadable gets a
    placeholder, counted so the index can say so."""

    def __init__(self, out: Path, roots: list[Path]):
        self.folder = out / "thumbs"
        self.roots = roots
        self.made: dict[str, tuple[str, int, int] | None] = {}

    def of(self, image: str, key: str) -> tuple[str, int, int] | None:
        """(file name under thumbs/, width, height), or None for a placeholder."""
        if image not in self.made:
            file = image_file(image, key, self.roots)
            self.made[image] = None if file is None else self._written(file)
        return self.made[image]

    def missing(self) -> int:
        return sum(made is None for made in self.made.values())

    def _written(self, file: Path) -> tuple[str, int, int] | None:
        from PIL import Image

        name = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:20] + ".jpg"
        try:
            with Image.open(file) as opened:
                small = opened.convert("RGB")
                small.thumbnail((THUMB, THUMB))
        except (OSError, ValueError, Image.DecompressionBombError):
            return None  # not an image PIL reads: a placeholder, never a failed site
        self.folder.mkdir(parents=True, exist_ok=True)
        small.save(self.folder / name, "JPEG", quality=QUALITY)
        return name, small.width, small.height


# --- pages -------------------------------------------------------------------------------------

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:76em;padding:0 1em;"
    "color:#222}table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;"
    "padding:.25em .6em;text-align:left}th{background:#f3f3f3}td.n{text-align:right}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:.7em}"
    ".card{margin:0;border:1px solid #ddd;border-radius:4px;padding:.4em;font-size:12px;"
    "min-width:0;overflow-wrap:anywhere}.card img{display:block;margin:0 auto .3em}"
    ".missing{box-sizing:border-box;width:128px;height:96px;margin:0 auto .3em;padding:.5em;"
    "background:#eee;color:#555;display:flex;align-items:center;text-align:center}"
    ".ok{color:#064}.bad{color:#a00}.id{color:#666}nav{margin:.8em 0}nav a{margin-right:.7em}"
    "p,li,td{overflow-wrap:anywhere}"
)


def page(title: str, body: list[str], up: str) -> str:
    """A whole page, style inline, nothing fetched; ``up`` leads back to the site's root."""
    home = f'<nav><a href="{up}index.html">all tasks</a></nav>' if up else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{home}<h1>{html.escape(title)}</h1>{''.join(body)}</body></html>\n"
    )


def card(row, answers: list[tuple[str, str]], thumbs: Thumbnails, up: str) -> str:
    """One image: its thumbnail (or a placeholder), true class, each setup's answer marked
    right or wrong, and its id. ``answers``: (who, column suffix) per setup."""
    image = row.image if "image" in row._fields else row.image_a
    lines = [f"<b>true:</b> {html.escape(str(getattr(row, 'truth' + answers[0][1])))}"]
    for who, suffix in answers:
        right = getattr(row, "right" + suffix)
        mark = ("ok", "✓") if right else ("bad", "✗")
        text = html.escape(f"{who}{getattr(row, 'guess' + suffix)}")
        lines.append(f'<span class="{mark[0]}">{mark[1]} {text}</span>')
    return figure(image, row.Index, lines, thumbs, up)


def figure(image: str, key: str, lines: list[str], thumbs: Thumbnails, up: str) -> str:
    """A card: the image's thumbnail (or a placeholder), the caption's ``lines`` (HTML,
    escaped by the caller) and the image's id."""
    made = thumbs.of(image, key)
    if made is None:
        picture = '<div class="missing">image file not found</div>'
    else:
        name, width, height = made
        src = html.escape(f"{up}thumbs/{name}")
        picture = f'<img src="{src}" width="{width}" height="{height}" alt="{html.escape(image)}">'
    caption = "<br>".join([*lines, f'<span class="id">{html.escape(str(key))}</span>'])
    return f'<figure class="card">{picture}<figcaption>{caption}</figcaption></figure>'


def grid(frame, answers, thumbs: Thumbnails, up: str, render=None) -> str:
    """``frame``'s images as cards: ``card`` with ``answers``, or ``render(row, thumbs, up)``."""
    cards = (
        render(row, thumbs, up) if render else card(row, answers, thumbs, up)
        for row in frame.itertuples()
    )
    return f'<div class="grid">{"".join(cards)}</div>'


def legend(a: Setup, b: Setup) -> str:
    return (
        f"<p><b>A</b> = {html.escape(a.label)}; <b>B</b> = {html.escape(b.label)}. "
        f"Each image shows its true class and each setup's top answer (✓ right, ✗ wrong).</p>"
    )


def pager(stem: str, number: int, count: int) -> str:
    """Links to the first, previous, next and last pages of ``stem-p<N>.html``."""
    links = []
    for name, target in (("first", 1), ("previous", number - 1), ("next", number + 1)):
        if 1 <= target <= count and target != number:
            links.append(f'<a href="{stem}-p{target}.html">{name}</a>')
    if number < count:
        links.append(f'<a href="{stem}-p{count}.html">last</a>')
    return f"<nav>page {number} of {count} ({PAGE} images a page) {''.join(links)}</nav>"


def write_paged(
    folder: Path, stem: str, title: str, frame, context: tuple, up: str = "../../", render=None
) -> int:
    """``frame``'s images as pages of ``PAGE`` cards, ``stem-p1.html`` onwards, ``up`` from the
    site's root (cards by ``render``, else ``card`` with the context's answers); the count."""
    intro, answers, thumbs = context
    count = max(1, math.ceil(len(frame) / PAGE))
    for number in range(1, count + 1):
        chunk = frame.iloc[(number - 1) * PAGE : number * PAGE]
        nav = pager(stem, number, count)
        cards = grid(chunk, answers, thumbs, up, render)
        body = [*intro, f"<p>{len(frame)} images.</p>", nav, cards]
        (folder / f"{stem}-p{number}.html").write_text(
            page(title, [*body, nav], up), encoding="utf-8"
        )
    return count


PAIR_ANSWERS = [("A: ", "_a"), ("B: ", "_b")]


def write_pair(folder: Path, pair: tuple[Setup, Setup], both, thumbs: Thumbnails) -> dict:
    """A pair's pages: its summary (``index.html``), each kind of flip paged over all classes
    and over each true class (``classes.html`` lists them); the flip counts."""
    a, b = pair
    folder.mkdir(parents=True, exist_ok=True)
    classes = sorted(set(both["truth_a"]))
    by_class: dict[str, dict[str, int]] = defaultdict(dict)
    counts = {}
    for kind, (title, _, _) in FLIPS.items():
        chosen = flips(both, kind)
        counts[kind] = len(chosen)
        back = f"<p>{link('index.html', 'back to the pair')}</p>"
        context = ([legend(a, b), back], PAIR_ANSWERS, thumbs)
        write_paged(folder, f"{kind}-all", f"{title}: every class", chosen, context)
        for name, members in chosen.groupby("truth_a", sort=False):
            number = classes.index(name)
            by_class[name][kind] = len(members)
            write_paged(
                folder, f"{kind}-c{number}", f"{title}: true class {name}", members, context
            )
    (folder / "classes.html").write_text(classes_page(pair, classes, by_class), encoding="utf-8")
    (folder / "index.html").write_text(pair_page(pair, both, counts), encoding="utf-8")
    return counts


def link(href: str, text) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(str(text))}</a>'


def pair_page(pair: tuple[Setup, Setup], both, counts: dict[str, int]) -> str:
    """A pair's summary: how many images each agreed or flipped on, with the flips' pages."""
    a, b = pair
    right_a, right_b = both["right_a"], both["right_b"]
    rows = [
        ("images both scored", "scored", len(both), ""),
        ("both right", "both-right", int((right_a & right_b).sum()), ""),
        ("both wrong", "both-wrong", int((~right_a & ~right_b).sum()), ""),
    ]
    rows += [(FLIPS[k][0], k, counts[k], link(f"{k}-all-p1.html", "show")) for k in FLIPS]
    cells = "".join(
        f'<tr><td>{html.escape(name)}</td><td class="n" id="{key}">{value}</td><td>{show}</td></tr>'
        for name, key, value, show in rows
    )
    body = [
        legend(a, b),
        f"<table><tbody>{cells}</tbody></table>",
        f"<p>The flips by true class: {link('classes.html', 'every class')}. Each setup's "
        f"own mistakes: {link(f'../setup-{a.index}.html', 'A')}, "
        f"{link(f'../setup-{b.index}.html', 'B')}.</p>",
    ]
    return page(f"{a.label} vs {b.label} on {a.board}", body, "../../")


def classes_page(pair: tuple[Setup, Setup], classes: list[str], by_class: dict) -> str:
    """Each true class with flips, and links to its flips of each kind."""
    lines = []
    for number, name in enumerate(classes):
        if name not in by_class:
            continue
        counts = [(kind, by_class[name].get(kind, 0)) for kind in FLIPS]
        links = "".join(
            f'<td class="n">{link(f"{kind}-c{number}-p1.html", n) if n else 0}</td>'
            for kind, n in counts
        )
        lines.append(f"<tr><td>{html.escape(name)}</td>{links}</tr>")
    head = "".join(f"<th>{html.escape(FLIPS[kind][0])}</th>" for kind in FLIPS)
    body = [
        legend(*pair),
        f"<p>{link('index.html', 'back to the pair')}. Classes without flips are left out.</p>",
        f"<table><thead><tr><th>true class</th>{head}</tr></thead>"
        f"<tbody>{''.join(lines)}</tbody></table>",
    ]
    return page(f"flips by class: {pair[0].label} vs {pair[1].label}", body, "../../")


def mistakes_title(frame) -> str:
    if frame["predicted"].isna().all():
        return (
            "images most draws got wrong (an image is wrong when at most half its draws were right)"
        )
    if frame["score"].isna().all():
        return "mistakes (the file records no confidence: in file order)"
    return "most confident mistakes (the top answer's probability in brackets)"


def setup_page(setup: Setup, frame, thumbs: Thumbnails) -> str:
    """One setup's own mistakes: the surest, then its most confused class pairs with
    example images."""
    wrong = mistakes(frame)
    answers = [("", "")]
    body = [
        f"<p>{len(frame)} images, {len(wrong)} wrong; shown from {html.escape(setup.file.name)}"
        f"{' (its lowest seed of ' + str(setup.seeds) + ')' if setup.seeds > 1 else ''}.</p>",
        f"<h2>{html.escape(mistakes_title(frame))}</h2>",
        grid(wrong.head(MISTAKES), answers, thumbs, "../"),
    ]
    pairs_found = confused(frame)
    if pairs_found:
        body.append("<h2>most confused class pairs</h2>")
    for truth, predicted, members in pairs_found:
        heading = f"true {truth} → answered {predicted}: {len(members)} images"
        body += [
            f"<h3>{html.escape(heading)}</h3>",
            grid(members.head(EXAMPLES), answers, thumbs, "../"),
        ]
    return page(f"{setup.label} on {setup.board}", body, "../")


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


@dataclass
class Table:
    """A board's table on the index: per setup (by its place) its cells under ``heads`` and
    its other pages (name, href under the board's folder); ``page`` names each setup's own."""

    heads: list[str]
    cells: dict[int, list]
    views: dict[int, list[tuple[str, str]]]
    page: str = "setup-{}.html"


def board_section(folder: str, shown: list[Setup], table: Table, items: list[str]) -> str:
    lines = "".join(
        f'<tr><td class="n">{s.index + 1}</td>'
        f"<td>{link(f'{folder}/{table.page.format(s.index)}', s.label)}"
        + "".join(f" · {link(f'{folder}/{href}', name)}" for name, href in table.views[s.index])
        + f'</td><td class="n">{s.value:.2f}</td>'
        + "".join(f'<td class="n">{html.escape(str(cell))}</td>' for cell in table.cells[s.index])
        + "</tr>"
        for s in shown
    )
    metric = html.escape(shown[0].rows[0]["metric"])
    heads = "".join(f"<th>{html.escape(head)}</th>" for head in table.heads)
    return (
        f"<h2>{html.escape(shown[0].board)}</h2><table><thead><tr><th>place</th><th>setup "
        f"(its images)</th><th>{metric}</th>{heads}</tr></thead>"
        f"<tbody>{lines}</tbody></table>"
        + (f"<p>Pairs (A vs B):</p><ul>{''.join(items)}</ul>" if items else "")
    )


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


# --- calibration: the surest mistakes of each confidence bin ----------------------------------


def confidence_bins_of(path: Path) -> int:
    """How many equal-width confidence bins a calibration file's ECE used; 0 for any other
    file."""
    import pandas as pd

    if not {"confidence", "bins", "correct"} <= columns_of(path):
        return 0
    bins = pd.read_parquet(path, columns=["bins"])["bins"]
    return int(bins.iloc[0]) if len(bins) else 0


def by_confidence(frame, bins: int) -> list[dict]:
    """Each non-empty bin of top-1 confidence, binned as the task's ECE bins it (``bins``
    equal-width, an edge in the bin below), surest bin first: its range, images, accuracy,
    mean confidence and its mistakes, surest first."""
    from evalkit.metrics import confidence_bins

    index = confidence_bins(frame["score"].to_numpy(float), bins)
    found = []
    for number in sorted(set(index.tolist()), reverse=True):
        members = frame[index == number]
        found.append(
            {
                "bin": number,
                "range": (number / bins, (number + 1) / bins),
                "images": len(members),
                "accuracy": float(members["right"].mean()),
                "confidence": float(members["score"].mean()),
                "mistakes": mistakes(members),
            }
        )
    return found


def calibration_page(setup: Setup, frame, bins: int, thumbs: Thumbnails) -> str:
    """A calibration setup's images by confidence bin: each bin's accuracy against its mean
    confidence (the ECE they add up to), then each bin's most confident mistakes."""
    found = by_confidence(frame, bins)
    ece = sum(b["images"] * abs(b["accuracy"] - b["confidence"]) for b in found) / len(frame)
    rows, sections = [], []
    for b in found:
        (low, high), number = b["range"], b["bin"]
        gap = 100 * (b["accuracy"] - b["confidence"])
        said = f"{'over' if gap < 0 else 'under'}-confident by {abs(gap):.1f} points"
        wrong = len(b["mistakes"])
        rows.append(
            f'<tr><td>{low:.2f}–{high:.2f}</td><td class="n">{b["images"]}</td>'
            f'<td class="n" id="accuracy-{number}">{100 * b["accuracy"]:.1f}%</td>'
            f'<td class="n">{100 * b["confidence"]:.1f}%</td><td>{said}</td>'
            f'<td class="n">{link(f"#bin-{number}", wrong) if wrong else 0}</td></tr>'
        )
        if wrong:
            heading = (
                f"confidence {low:.2f}–{high:.2f}: {b['images']} images, accuracy "
                f"{100 * b['accuracy']:.1f}% vs confidence {100 * b['confidence']:.1f}% "
                f"({said}); its {min(wrong, BIN_MISTAKES)} surest of {wrong} mistakes"
            )
            sections += [
                f'<h2 id="bin-{number}">{html.escape(heading)}</h2>',
                grid(b["mistakes"].head(BIN_MISTAKES), [("", "")], thumbs, "../"),
            ]
    body = [
        f"<p>{len(frame)} images in {bins} equal-width bins of top-1 confidence, as the task's "
        f"ECE bins them (without temperature scaling); ECE from these bins "
        f'<b id="ece">{ece:.4f}</b>. Each mistake shows its true class and the class it '
        "answered with its confidence.</p>",
        "<table><thead><tr><th>confidence</th><th>images</th><th>accuracy</th>"
        "<th>mean confidence</th><th>accuracy vs confidence</th><th>mistakes</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>",
        *sections,
    ]
    return page(f"{setup.label} on {setup.board}: mistakes by confidence", body, "../")


# --- cue-conflict: each stimulus decided by its shape or its texture ---------------------------

CUES = {  # decided by → (title, mark class)
    "shape": ("decided by shape", "ok"),
    "texture": ("decided by texture", "bad"),
    "neither": ("neither shape nor texture", "id"),
}


def cue_decisions(path: Path):
    """A model-vs-human file's cue-conflict stimuli whose shape and texture differ (the shape
    bias leaves the others out), each with ``shape``, ``texture``, ``decision`` and ``cue``
    (what decided it: shape, texture or neither), indexed by image key; None when the file
    holds none."""
    import numpy as np
    import pandas as pd

    if not {"set", "category", "texture", "decision"} <= columns_of(path):
        return None
    frame = pd.read_parquet(path, columns=["image", "set", "category", "texture", "decision"])
    frame = frame[(frame["set"] == "cue-conflict") & (frame["category"] != frame["texture"])]
    if frame.empty:
        return None
    decision = frame["decision"].astype(str).to_numpy()
    shape, texture = frame["category"].astype(str).to_numpy(), frame["texture"].astype(str)
    cue = np.where(
        decision == shape, "shape", np.where(decision == texture.to_numpy(), "texture", "neither")
    )
    shaped = pd.DataFrame(
        {
            "image": frame["image"].astype(str).to_numpy(),
            "shape": shape,
            "texture": texture.to_numpy(),
            "decision": decision,
            "cue": cue,
        }
    )
    shaped.index = relative_ids(shaped["image"].tolist())
    return shaped.sort_values(["shape", "texture"], kind="stable")


def cue_card(row, thumbs: Thumbnails, up: str) -> str:
    title, mark = CUES[row.cue]
    lines = [
        f"<b>shape:</b> {html.escape(row.shape)}",
        f"<b>texture:</b> {html.escape(row.texture)}",
        f'<span class="{mark}">answered {html.escape(row.decision)}: {html.escape(title)}</span>',
    ]
    return figure(row.image, row.Index, lines, thumbs, up)


def shape_bias_of(cues) -> float:
    shape, texture = (int((cues["cue"] == cue).sum()) for cue in ("shape", "texture"))
    return shape / (shape + texture) if shape + texture else math.nan


def write_cue_conflict(folder: Path, setup: Setup, cues, thumbs: Thumbnails) -> str:
    """A setup's cue-conflict page (its href): how many stimuli each cue decided and the shape
    bias they make, overall and per shape category, with each cue's stimuli paged."""
    stem = f"cue-{setup.index}"
    back = f"<p>{link(f'{stem}.html', 'back to the shape and texture decisions')}</p>"
    counts = {}
    for cue, (title, _) in CUES.items():
        chosen = cues[cues["cue"] == cue]
        counts[cue] = len(chosen)
        context = ([back], [], thumbs)
        heading = f"{setup.label} on {setup.board}: {title}"
        write_paged(folder, f"{stem}-{cue}", heading, chosen, context, "../", cue_card)
    summary = "".join(
        f'<tr><td>{html.escape(title)}</td><td class="n" id="{cue}">{counts[cue]}</td>'
        f"<td>{link(f'{stem}-{cue}-p1.html', 'show')}</td></tr>"
        for cue, (title, _) in CUES.items()
    )
    per = []
    for shape, members in cues.groupby("shape", sort=True):
        n = {cue: int((members["cue"] == cue).sum()) for cue in CUES}
        bias = shape_bias_of(members)
        per.append(
            f"<tr><td>{html.escape(shape)}</td>"
            + "".join(f'<td class="n">{n[cue]}</td>' for cue in CUES)
            + f'<td class="n">{"–" if math.isnan(bias) else f"{bias:.3f}"}</td></tr>'
        )
    bias = shape_bias_of(cues)
    body = [
        f"<p>{len(cues)} cue-conflict stimuli whose shape and texture are different categories; "
        "each answered with its shape's category, its texture's, or another. Shape bias = "
        f'shape / (shape + texture) = <b id="shape-bias">'
        f"{'–' if math.isnan(bias) else f'{bias:.3f}'}</b>.</p>",
        f"<table><tbody>{summary}</tbody></table>",
        "<h2>by shape category</h2><table><thead><tr><th>shape</th>"
        + "".join(f"<th>{html.escape(title)}</th>" for title, _ in CUES.values())
        + f"<th>shape bias</th></tr></thead><tbody>{''.join(per)}</tbody></table>",
    ]
    (folder / f"{stem}.html").write_text(
        page(f"{setup.label} on {setup.board}: shape or texture", body, "../"), encoding="utf-8"
    )
    return f"{stem}.html"


# --- dense tasks: each setup's worst images ----------------------------------------------------


def scored(path: Path, metric: str, higher_is_better: bool):
    """A dense setup's images, worst first on ``metric`` (the board's headline, one value per
    image in its file), with ``image`` and ``score``, indexed by image key."""
    import pandas as pd

    if metric not in columns_of(path):
        raise EvalkitError(
            f"{path.name} keeps no per-image {metric!r}: rerun with evalkit run ... "
            "--save-predictions to write the per-image scores"
        )
    frame = pd.read_parquet(path, columns=["image", metric])
    shaped = pd.DataFrame(
        {"image": frame["image"].astype(str).to_numpy(), "score": frame[metric].to_numpy(float)}
    )
    shaped.index = relative_ids(shaped["image"].tolist())
    return shaped.sort_values(
        "score", ascending=higher_is_better, kind="stable", na_position="last"
    )


def write_dense_board(folder: Path, setups: list[Setup], thumbs: Thumbnails) -> str:
    """A dense board's pages: each setup's ``WORST`` worst images on the headline metric,
    worst first, paged; its section of the index."""
    metric = setups[0].rows[0]["metric"]
    cells, views = {}, {}
    for setup in setups:
        frame = scored(setup.file, metric, setup.higher_is_better)
        order = "lowest" if setup.higher_is_better else "highest"

        def render(row, thumbs, up, metric=metric, frame=frame):
            rank = frame.index.get_loc(row.Index) + 1
            lines = [f"<b>{html.escape(metric)}</b> {row.score:.4g}", f"worst #{rank}"]
            return figure(row.image, row.Index, lines, thumbs, up)

        intro = [
            f"<p>Each image's own {html.escape(metric)} (as its per-image file keeps it), "
            f"{order} first: the {min(WORST, len(frame))} images of {len(frame)} this setup "
            "does worst on.</p>"
        ]
        title = f"{setup.label} on {setup.board}: worst images by {metric}"
        stem = f"worst-{setup.index}"
        write_paged(folder, stem, title, frame.head(WORST), (intro, [], thumbs), "../", render)
        worst = frame["score"].iloc[0] if len(frame) else math.nan
        cells[setup.index], views[setup.index] = [len(frame), f"{worst:.4g}"], []
    table = Table(["images", f"worst image's {metric}"], cells, views, "worst-{}-p1.html")
    return board_section(folder.name, setups, table, [])


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
