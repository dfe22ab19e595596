"""The effect table's Markdown, JSON and picture (docs/protocols.md, "Effect table"), written
from the records ``evalkit.reproduction.reproduce`` measures: per row the paper's values and effect, ours
with its interval and the seeds it averages, how the row ends (``resolve.resolution_text``:
agrees, disagrees or no effect larger than ±X, with its MDE), the departures from the paper,
and the seconds it cost; the picture sets the paper's effect and ours side by side."""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.reproduction.resolve import resolution_text

VERDICTS = {True: "yes", False: "no", None: "n/a"}


def write_table(summary: dict, out: Path):
    """``effects-<scale>.json``, ``.md`` and ``.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"effects-{summary['scale']}"
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = header(summary) + [row_line(r) for r in summary["rows"]]
    picture = effects_picture(summary["rows"], out / f"{name}.png")
    if picture:
        lines += ["", f"![The paper's effect and ours, as relative changes]({picture.name})"]
    lines += departures_section(summary["rows"]) + pictures_section(summary["rows"])
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def header(summary: dict) -> list[str]:
    models = (
        f"Ladder {' → '.join(summary['ladder'])}"
        if any(summary["ladder"])
        else "The paper's models (our setup column names the backbones)"
    )
    return [
        f"# The effect table at scale `{summary['scale']}`",
        "",
        f"{models}. Compute: ladder {summary['ladder_seconds']:.0f} s "
        f"+ rows {summary['rows_seconds']:.0f} s = {summary['compute_seconds']:.0f} s (each "
        f"counted when it ran; the last invocation took {summary['wall_seconds']:.0f} s, reusing "
        f"what was done). {produced_by(summary)}",
        "",
        "Our effect is signed so that positive is the better direction, with its 95% interval "
        "(the test items' standard error, and the seeds' spread where a row has several: then "
        "Student's t on seeds − 1 degrees of freedom, not ±1.96). Each "
        "row ends as: agrees or disagrees with the paper, when its interval leaves out zero; "
        "else no effect larger than ±X, X the far end of the interval (an effect beyond it is "
        "ruled out at the interval's level). Each also says the smallest effect its test "
        "detects 80% of the time. Rows resolved by `--resolve` were measured again with more "
        "seeds, each look held to its share of the 5% level (α/(k(k+1)) at look k), and show "
        "that look's interval. Marked rows (†) depart from the paper as listed below the table."
        + resolve_line(summary),
        "",
        "| # | what changed | where | metric | paper values | paper effect | our setup | "
        "our values | our effect [interval] | seeds | verdict | s |",
        "|" + "---|" * 12,
    ]


def resolve_line(summary: dict) -> str:
    resolved = [r for r in summary["rows"] if r.get("sequential")]
    if not resolved:
        return ""
    spent = sum(r["sequential"]["seconds"] for r in resolved)
    return f" Rows measured again by `--resolve`: {rows_text(resolved)}, {spent:.0f} s of seeds."


def produced_by(summary: dict) -> str:
    """Which commands measured which rows (one command: just it)."""
    runs = summary.get("invocations") or [
        {"command": f"evalkit reproduce --scale {summary['scale']}", "rows": []}
    ]
    if len(runs) == 1:
        return f"Produced by `{runs[0]['command']}`."
    listed = "; ".join(f"`{i['command']}` (rows {', '.join(map(str, i['rows']))})" for i in runs)
    return f"Rows produced by {listed}."


def rows_text(records: list[dict]) -> str:
    return ", ".join(str(r["row"]) for r in records)


def row_line(r: dict) -> str:
    effect = "–" if r["our_effect"] is None else f"{r['our_effect']:+.3g}"
    if r.get("interval"):
        low, high = r["interval"]
        effect += f" [{low:+.3g}, {high:+.3g}]"
    seeds = ", ".join(sorted({str(k) for k in r.get("seeds", {}).values()})) or "–"
    mark = " †" if r.get("departures") else ""
    return (
        f"| {r['row']}{mark} | {r['changed']} | {r['where']} | {r['metric']} | {r['paper']} | "
        f"{r['paper_effect']} | {r['setup']} | {r['ours']} | {effect} | {seeds} | "
        f"{verdict_text(r)} | {r['seconds']:.0f} |"
    )


def verdict_text(r: dict) -> str:
    """The row's end (``resolution_text``) and its note; a within-noise note is not repeated
    beside the margin that replaces it."""
    parts = [n for n in r["note"].split("; ") if n]
    if r["agrees"] is None:
        parts = [n for n in parts if not n.startswith("within")]
    return resolution_text(r) + (f" ({'; '.join(parts)})" if parts else "")


def departures_section(records: list[dict]) -> list[str]:
    lines = [f"- † row {r['row']}: {text}" for r in records for text in r.get("departures", [])]
    return ["", "## Departures from the paper", "", *lines] if lines else []


def pictures_section(records: list[dict]) -> list[str]:
    """Markdown embedding each row's copied curves and diagrams under the row's heading."""
    lines = []
    for r in records:
        if r.get("pictures"):
            lines += ["", f"### Row {r['row']}: {r['changed']} ({r['where']})", ""]
            lines += [f"![row {r['row']}]({name})" for name in r["pictures"]]
    return ["", "## Curves and diagrams", *lines] if lines else []


COLOURS = {True: "tab:green", False: "tab:red", None: "tab:grey"}


def effects_picture(records: list[dict], path: Path) -> Path | None:
    """Every row on its own line: the paper's effect and ours as relative changes in the
    paper's favourable direction (ours with its 95% interval, coloured by the verdict); a row
    without such a number shows its verdict in words."""
    if not records:
        return None
    from evalkit.plots import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(8.5, 0.45 * len(records) + 1.4))
    labels = []
    for y, r in enumerate(reversed(records)):
        labels.append(
            f"{r['row']}. {r['where'] if r['changed'].startswith('scale') else r['changed']}"
        )
        rel = r.get("relative") or {}
        if rel.get("paper") is None or rel.get("ours") is None:
            ax.text(
                0,
                y,
                f"no number to compare: {VERDICTS[r['agrees']]}",
                va="center",
                fontsize=8,
                color=COLOURS[r["agrees"]],
            )
            continue
        ax.plot(
            100 * rel["paper"], y + 0.15, "D", color="tab:blue", label="paper" if y == 0 else None
        )
        if rel.get("interval"):
            low, high = (100 * v for v in rel["interval"])
            ax.plot([low, high], [y - 0.15] * 2, "-", color=COLOURS[r["agrees"]], lw=2)
        ax.plot(100 * rel["ours"], y - 0.15, "o", color=COLOURS[r["agrees"]])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_ylim(-0.7, len(records) - 0.3)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("relative change, % (positive: the paper's better direction; symlog beyond ±10%)")
    ax.set_title(
        "Paper (◆) and ours (●, interval): green agrees, red disagrees, grey no effect beyond "
        "its interval",
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
