"""``evalkit explore``'s pages for the dense tasks, segmentation and depth (docs/protocols.md,
"ADE20k segmentation" and "Monocular depth"), whose per-image files keep a score per image and
no right or wrong: each setup's worst images on the board's headline metric.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.publish.board_reading import relative_ids
from evalkit.publish.explore_outputs import columns_of
from evalkit.publish.explore_pages import (
    Setup,
    Table,
    Thumbnails,
    board_section,
    figure,
    write_paged,
)

WORST = 600  # a dense setup's worst images shown (ten pages)


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
