"""``evalkit explore``'s cue-conflict page (``model-vs-human``, ``shape-bias``; docs/protocols.md,
"Shape bias and human alignment"): which cue, shape or texture, decided each cue-conflict
stimulus, and the shape bias they make, overall and per shape category.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from evalkit.publish.board_reading import relative_ids
from evalkit.publish.explore_outputs import columns_of
from evalkit.publish.explore_pages import Setup, Thumbnails, figure, link, page, write_paged

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
