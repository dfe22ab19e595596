"""The leaderboard rendered: Markdown, JSON and one self-contained HTML page (a ranks figure,
the critical-difference diagram, accuracy-versus-fairness curves), the row builders the
terminal table uses, and dated snapshots with their index. Computed once by
``evalkit.publish.leaderboard``; every format reads the same board."""

from __future__ import annotations

import html
import json
from pathlib import Path


def snapshot(board: dict, folder: Path) -> Path:
    """A dated copy of the board — ``DIR/<date>/leaderboard.html`` and ``.json`` (a second one
    the same day is ``<date>T<time>``) — and ``DIR/index.html`` listing every snapshot, newest
    first, so a team's board keeps its history. Each page stands alone (nothing fetched)."""
    import time

    from evalkit.storage.writes import replacing

    name = time.strftime("%Y-%m-%d")
    if (folder / name).exists():
        name = time.strftime("%Y-%m-%dT%H%M%S")
    target = folder / name
    target.mkdir(parents=True, exist_ok=True)
    for file, text in (("leaderboard.html", page(board)), ("leaderboard.json", as_json(board))):
        with replacing(target / file) as tmp:
            tmp.write_text(text, encoding="utf-8")
    with replacing(folder / "index.html") as tmp:
        tmp.write_text(snapshot_index(folder), encoding="utf-8")
    return target


def snapshot_index(folder: Path) -> str:
    """The index page of the snapshots under ``folder``: one line each, newest first, with the
    leader of its overall board."""
    items = []
    for dated in sorted(
        (p for p in folder.iterdir() if (p / "leaderboard.json").exists()), reverse=True
    ):
        board = json.loads((dated / "leaderboard.json").read_text(encoding="utf-8"))
        ranked = [e for e in board.get("overall", []) if e.get("mean_rank") is not None]
        leader = f" — first overall: {html.escape(ranked[0]['backbone'])}" if ranked else ""
        tasks = len(board.get("tasks", []))
        link = html.escape(f"{dated.name}/leaderboard.html")
        items.append(
            f'<li><a href="{link}">{html.escape(dated.name)}</a>: {tasks} task(s){leader}</li>'
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>evalkit leaderboard snapshots</title><style>{PAGE_STYLE}</style></head>"
        f"<body><h1>Leaderboard snapshots</h1><ul>{''.join(items)}</ul></body></html>\n"
    )


OVERALL_HEADER = ["mean rank", "tier", "rank interval", "P(first)", "backbone", "tasks", "missing"]


def overall_rows(board: dict) -> list[list[str]]:
    """The overall table, every format: a complete setup's mean rank, the 95% interval of its
    place and P(first) over resampled tasks; a setup that lacks tasks, what it lacks."""
    rows = []
    for entry in board["overall"]:
        interval = entry.get("rank_interval")
        rows.append(
            [
                _mean_rank(entry),
                str(entry.get("tier", "–")),
                f"[{interval[0]:g}, {interval[1]:g}]" if interval else "–",
                f"{entry['p_first']:.2f}" if "p_first" in entry else "–",
                entry["backbone"],
                str(entry["tasks"]),
                ", ".join(entry["missing"]) or "–",
            ]
        )
    return rows


def task_header(task: dict) -> list[str]:
    arrow = "↑" if task["higher_is_better"] else "↓"
    return [
        "rank",
        "tier",
        "backbone",
        f"{task['metric']} {arrow}",
        "job seeds (sd)",
        "n",
        "right",
        "outputs",
    ]


def task_rows(task: dict) -> list[list[str]]:
    """One task's table, every format: rank, tier (not significantly different from the
    tier's leader), the value with its image-level interval, the seeds and their spread."""
    return [
        [
            _rank(cell["rank"]),
            str(cell.get("tier", "–")),
            cell["backbone"],
            cell["shown"],
            _seeds(cell),
            str(cell.get("n") or "–"),
            "–" if cell.get("right") is None else str(cell["right"]),
            ", ".join(h[:12] for h in cell.get("outputs", [])) or "–",
        ]
        for cell in task["cells"]
    ]


def _seeds(cell: dict) -> str:
    seeds, spread = cell.get("seeds", 1), cell.get("seed_sd")
    return f"{seeds} (sd {spread:.2f})" if spread is not None else str(seeds)


def notes(board: dict) -> list[str]:
    lines = [
        f"pairs: paired tests on the same images, p-values {board['correction']}; "
        f"significant at {board['level']:g}; a tier holds the setups not significantly "
        "different from its leader (a run down the ranks from its leader to the first setup "
        "separated from it)",
        "over all tasks: complete setups only; rank interval and P(first) from a two-level "
        "bootstrap: the suite's tasks and, within each, its images",
        f"suite fingerprint {board.get('suite', '–')}: "
        + ", ".join(f"{t['task']} {t.get('fingerprint', '–')}" for t in board["tasks"]),
    ]
    if (across := board.get("across_tasks")) is not None:
        groups = "; ".join(", ".join(c) for c in across["cliques"]) or "none"
        lines.append(
            f"across tasks ({across['test']}): setups no test separates — {groups}; an overall "
            "tier runs down the mean-rank order from its leader to the first setup separated "
            "from it"
        )
        if across.get("note"):
            lines.append(f"across tasks: {across['note']}")
    if (test := board.get("friedman")) is not None:
        lines.append(
            f"Friedman over {test['tasks']} tasks and {test['setups']} setups: "
            f"chi² = {test['statistic']:.3g}, p = {test['p']:.3g}"
            + (" (the overall order may be noise)" if test["p"] > board["level"] else "")
        )
    if any("draws)" in cell["shown"] for task in board["tasks"] for cell in task["cells"]):
        lines.append(SPREADS)
    lines += [
        f"failed cell: {f['task']} × {f['backbone']} (seed {f['seed']}): {f['error']}"
        for f in board["failed"]
    ]
    return lines


# Two spreads sit side by side in a task's table; a reader must not take one for the other.
SPREADS = (
    "spreads: 'job seeds (sd)' counts the runs differing only in --seed and their standard "
    "deviation; a value's own '(sd/k draws)' is the standard deviation over the task's k draws "
    "within one job (few-shot's training subsets), not over job seeds"
)


def _accuracy(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def point(value: float | None, interval) -> str:
    """A curve's point with its 95% interval over test images, where there is one."""
    if value is None or not interval:
        return _accuracy(value)
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def _rank(rank: float) -> str:
    return f"{rank:g}"


def _mean_rank(entry: dict) -> str:
    """A complete setup's mean rank; one that lacks a task has none (``–``)."""
    return "–" if entry["mean_rank"] is None else f"{entry['mean_rank']:.2f}"


def _pipes(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(board: dict) -> str:
    parts = ["# Leaderboard", "", *_pipes(OVERALL_HEADER, overall_rows(board))]
    for task in board["tasks"]:
        parts += ["", f"## {task['task']}", "", *_pipes(task_header(task), task_rows(task))]
        parts += [""] + [f"- {p['a']} vs {p['b']}: {p['verdict']}" for p in task["pairs"]]
    for task, lines in board["curves"].items():
        levels = sorted({level for by in lines.values() for level in by})
        parts += ["", f"## {task}: accuracy under demographic parity", ""]
        parts += ["| backbone | " + " | ".join(f"ε={lv:g}" for lv in levels) + " |"]
        parts += ["|---|" + "---|" * len(levels)]
        bands = board.get("curve_intervals", {}).get(task, {})
        parts += [
            f"| {b} | "
            + " | ".join(point(by.get(lv), bands.get(b, {}).get(lv)) for lv in levels)
            + " |"
            for b, by in lines.items()
        ]
    return "\n".join([*parts, "", *(f"_{note}_" for note in notes(board)), ""])


def as_json(board: dict) -> str:
    """Valid JSON: a number that is not finite is null, never a bare ``NaN``."""
    from evalkit.core.results import finite

    return json.dumps(finite(board), indent=2, default=float, allow_nan=False) + "\n"


PAGE_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em}"
    "th{background:#f3f3f3}.sig{color:#064}.ns{color:#777}svg text{font-size:12px}"
)


def page(board: dict) -> str:
    """One HTML page, nothing fetched: the overall table, the ranks figure (inline SVG), then
    each task's table and pairs."""
    body = [
        "<h1>Leaderboard</h1>",
        *(
            [
                f'<p><a href="{html.escape(board["explore"])}">The images behind the pairs</a> '
                "(which images flipped between two setups, each setup's most confident mistakes)</p>"
            ]
            if board.get("explore")
            else []
        ),
        ranks_figure(board),
        _table_html(OVERALL_HEADER, overall_rows(board)),
        cd_figure(board.get("across_tasks")),
    ]
    for task in board["tasks"]:
        body.append(f"<h2>{html.escape(task['task'])}</h2>")
        body.append(_table_html(task_header(task), task_rows(task)))
        items = [
            f'<li class="{"sig" if p.get("significant") else "ns"}">'
            f"{html.escape(p['a'])} vs {html.escape(p['b'])}: {html.escape(p['verdict'])}</li>"
            for p in task["pairs"]
        ]
        body.append(f"<ul>{''.join(items)}</ul>")
    for task, lines in board["curves"].items():
        body.append(f"<h2>{html.escape(task)}: accuracy under demographic parity</h2>")
        body.append(curves_figure(lines, board.get("curve_intervals", {}).get(task, {})))
    body += [f"<p><em>{html.escape(note)}</em></p>" for note in notes(board)]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>evalkit leaderboard</title><style>{PAGE_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    lines = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>"


FONT = 'font-family="sans-serif" font-size="13"'  # the figures' text, sized below by it
CHAR = 7.6  # the widest average advance of a 13 px sans-serif character, in px


def text_width(text: str) -> float:
    """How wide ``text`` is drawn at ``FONT`` (an upper estimate: a label is never cut)."""
    return CHAR * len(text) + 8


def ranks_figure(board: dict) -> str:
    """Each backbone's rank on every task (small dots) and its mean rank (a large one), rank 1
    on the left; the names' column as wide as the longest name."""
    names = [e["backbone"] for e in board["overall"]]
    most = max((len(t["cells"]) for t in board["tasks"]), default=1)
    left = max(220, max((text_width(n) for n in names), default=0) + 16)
    width, row_height = left + 420, 28
    height = row_height * len(names) + 60

    def x(rank: float) -> float:
        return left + (rank - 1) / max(most - 1, 1) * (width - left - 20)

    marks = []
    for i, entry in enumerate(board["overall"]):
        y = 30 + i * row_height
        marks.append(
            f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{html.escape(entry["backbone"])}</text>'
        )
        for task in board["tasks"]:
            for cell in task["cells"]:
                if cell["backbone"] == entry["backbone"]:
                    marks.append(f'<circle cx="{x(cell["rank"]):.1f}" cy="{y}" r="3" fill="#9ab"/>')
        if entry["mean_rank"] is not None:
            mean = x(entry["mean_rank"])
            marks.append(f'<circle cx="{mean:.1f}" cy="{y}" r="7" fill="#246"/>')
    ticks = "".join(
        f'<text x="{x(r):.1f}" y="{height - 26}" text-anchor="middle">{r}</text>'
        for r in range(1, most + 1)
    )
    ticks += (
        f'<text x="{(left + width - 20) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
        "rank (1 is best)</text>"
        f'<circle cx="12" cy="{height - 10}" r="3" fill="#9ab"/>'
        f'<text x="20" y="{height - 6}">rank on one task</text>'
        f'<circle cx="132" cy="{height - 10}" r="7" fill="#246"/>'
        f'<text x="144" y="{height - 6}">mean rank (complete setups)</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" {FONT} '
        'role="img" aria-label="ranks per task (small) and mean rank (large), 1 is best">'
        f"{''.join(marks)}{ticks}</svg>"
    )


CD_MEANING = (
    "Each setup hangs from its mean rank over the tasks (1 is best). A bar joins setups that "
    "no test across the tasks ({test}) separates at the board's level; each bar is its own "
    "group, drawn on its own line, and setups not joined by any bar were found to differ."
)


def cd_figure(across: dict | None) -> str:
    """The critical-difference diagram: the complete setups on an axis of mean rank (1 on the
    left), the better half labelled to the left of the axis and the worse half to the right
    (so no label runs off the figure), a bar on a line of its own under each clique no test
    over the tasks separates, and a sentence saying what a bar means; empty without one."""
    if not across:
        return ""
    ranks = across["mean_ranks"]
    low, high = 1.0, max(max(ranks.values()), 2.0)
    order = sorted(ranks, key=ranks.get)
    labels = {name: f"{name} ({ranks[name]:.2f})" for name in order}
    margin = max(text_width(label) for label in labels.values()) + 24
    width, axis = 2 * margin + 280, 280
    top = 44 + 10 * len(across["cliques"])
    middle = (len(order) + 1) // 2  # the better half labelled left, the worse right
    height = top + 18 * middle + 10

    def x(rank: float) -> float:
        return margin + (rank - low) / (high - low) * axis

    marks = [f'<line x1="{x(low):.1f}" y1="30" x2="{x(high):.1f}" y2="30" stroke="#222"/>']
    for tick in range(1, int(high) + 1):
        marks.append(f'<text x="{x(tick):.1f}" y="22" text-anchor="middle">{tick}</text>')
    for i, name in enumerate(order):
        y = top + 18 * (i if i < middle else len(order) - 1 - i)
        end, anchor = (margin - 6, "end") if i < middle else (margin + axis + 6, "start")
        xr = x(ranks[name])
        marks.append(
            f'<polyline points="{xr:.1f},30 {xr:.1f},{y} {end:.1f},{y}" fill="none" stroke="#246"/>'
        )
        marks.append(
            f'<text x="{end + (-4 if anchor == "end" else 4):.1f}" y="{y + 4}" '
            f'text-anchor="{anchor}">{html.escape(labels[name])}</text>'
        )
    for k, clique in enumerate(across["cliques"]):
        y = 40 + 10 * k
        xs = [x(ranks[name]) for name in clique]
        marks.append(
            f'<line x1="{min(xs):.1f}" y1="{y}" x2="{max(xs):.1f}" y2="{y}" stroke="#c52" '
            'stroke-width="4" stroke-linecap="round"/>'
        )
    meaning = CD_MEANING.format(test=across["test"])
    return (
        "<h2>Across tasks</h2>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" {FONT} '
        'role="img" aria-label="critical-difference diagram: mean rank over the tasks, bars join '
        f'setups no test separates">{"".join(marks)}</svg>'
        f'<p class="note">{html.escape(meaning)}</p>'
        + (f'<p class="note">{html.escape(across["note"])}</p>' if across.get("note") else "")
    )


COLOURS = ("#246", "#c52", "#396", "#a3a", "#b90", "#18a", "#777", "#e74")


def curves_figure(lines: dict, bands: dict | None = None) -> str:
    """Accuracy (y) against the parity level ε (x), a line and a legend entry per backbone,
    each point with a whisker over its 95% interval where it has one."""
    bands = bands or {}
    levels = sorted({level for by in lines.values() for level in by})
    ends = [e for by in bands.values() for band in by.values() if band for e in band]
    values = [v for by in lines.values() for v in by.values()] + ends
    low, high = min(values), max(values)
    width, height, left, top, bottom = 640, 300, 60, 20, 40
    span_x, span_y = max(levels[-1] - levels[0], 1e-9), max(high - low, 1e-9)

    def point(level: float, value: float) -> str:
        x = left + (level - levels[0]) / span_x * (width - left - 180)
        y = top + (high - value) / span_y * (height - top - bottom)
        return f"{x:.1f},{y:.1f}"

    marks = []
    for i, (backbone, by) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(point(level, value) for level, value in sorted(by.items()))
        marks.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for level, band in bands.get(backbone, {}).items():
            if band:
                (x1, y1), (x2, y2) = (point(level, end).split(",") for end in band)
                marks.append(
                    f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" stroke-width="1"/>'
                )
        marks.append(
            f'<text x="{width - 170}" y="{top + 16 * i + 4}" fill="{colour}">'
            f"{html.escape(backbone)}</text>"
        )
    axis = (
        f'<text x="{left}" y="{height - 8}">ε from {levels[0]:g} to {levels[-1]:g} →</text>'
        f'<text x="4" y="{top + 4}">{high:.3f}</text><text x="4" y="{height - bottom}">{low:.3f}</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'aria-label="test accuracy against the demographic-parity level, one line per backbone">'
        f"{''.join(marks)}{axis}</svg>"
    )


FORMATTERS = {"terminal": markdown, "markdown": markdown, "json": as_json, "html": page}
