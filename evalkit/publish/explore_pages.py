"""What every page of ``evalkit explore``'s site is made of: a setup (one run of a board
and its per-image file), the thumbnails shared by every page, the page itself (style inline,
nothing fetched), image cards, paging (``PAGE`` cards a page, pre-rendered, so a page of a
50,000-image set costs what a page of 384 does) and a board's table on the index.
"""

from __future__ import annotations

import hashlib
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 60  # images on one page: about 60 × 4 KB of thumbnails and 30 KB of HTML


THUMB = 128  # thumbnails fit in THUMB × THUMB pixels


QUALITY = 80  # JPEG quality of the thumbnails


@dataclass(eq=False)  # hashed by identity: a page set per setup
class Setup:
    """One run of a board: its label, headline value and one per-image file."""

    board: str
    label: str
    value: float
    higher_is_better: bool
    file: Path
    seeds: int
    rows: list[dict] = field(repr=False, default_factory=list)
    index: int = 0  # its place on the board, naming its page


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


def link(href: str, text) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(str(text))}</a>'


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
