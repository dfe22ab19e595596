"""The classification-type pages of ``evalkit explore``: each setup's own mistakes, surest first,
and its most confused class pairs; each pair of setups' flips (the images one got right and the
other wrong), paged over all classes and over each true class.
"""

from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path

from evalkit.publish.explore_outputs import FLIPS, flips, mistakes
from evalkit.publish.explore_pages import Setup, Thumbnails, grid, link, page, write_paged

MISTAKES = 30  # most confident mistakes shown per setup


CONFUSED = 10  # class pairs shown per setup


EXAMPLES = 4  # example images per confused class pair


PAIR_ANSWERS = [("A: ", "_a"), ("B: ", "_b")]


def confused(frame, top: int = CONFUSED):
    """(true class, predicted class, images) of the most frequent mistakes."""
    wrong = frame[~frame["right"] & frame["predicted"].notna()]
    counts = wrong.groupby(["truth", "predicted"], sort=False).size()
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return [
        (truth, predicted, wrong[(wrong["truth"] == truth) & (wrong["predicted"] == predicted)])
        for (truth, predicted), _ in ordered
    ]


def legend(a: Setup, b: Setup) -> str:
    return (
        f"<p><b>A</b> = {html.escape(a.label)}; <b>B</b> = {html.escape(b.label)}. "
        f"Each image shows its true class and each setup's top answer (✓ right, ✗ wrong).</p>"
    )


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
