"""``evalkit explore``'s calibration page (``imagenet-ece``, ``imagenet-c-ece``; docs/protocols.md,
"Calibration"): a setup's images in the confidence bins its ECE uses, each bin's accuracy beside
its mean confidence, and each bin's most confident mistakes.
"""

from __future__ import annotations

import html
from pathlib import Path

from evalkit.publish.explore_outputs import columns_of, mistakes
from evalkit.publish.explore_pages import Setup, Thumbnails, grid, link, page

BIN_MISTAKES = 8  # most confident mistakes shown per confidence bin


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
