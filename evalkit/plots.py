"""PNG plots of the training ablations (effect-table rows 1–4): curves per run and a summary
per variant; reliability diagrams (calibration); accuracy under a demographic-parity
constraint (fairness). Drawn with matplotlib's non-interactive backend."""

from __future__ import annotations

import statistics
from pathlib import Path

from evalkit.metrics import pooled


def pyplot():
    """matplotlib's pyplot on the non-interactive backend (imported when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 100, tight: bool = False) -> Path:
    """Lay ``fig`` out, write it as ``path`` (folders made) and release it; ``tight`` grows
    the picture to hold every artist (labels drawn beyond the axes)."""
    if not tight:  # a tight box is measured on the artists themselves
        fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))
    pyplot().close(fig)
    return Path(path)


def stability_plot(runs: dict[str, dict[float, dict]], path: Path) -> Path:
    """Three panels: the loss and the max attention logit over steps (one line per variant and
    LR), and the final loss against the LR per variant. ``runs[variant][lr]`` holds ``steps``,
    ``loss``, ``max_logit`` (curves) and ``final`` (a number)."""
    plt = pyplot()

    fig, (loss_ax, logit_ax, lr_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    for variant, by_lr in runs.items():
        style = "-" if variant == "qk_norm" else "--"
        for lr, run in sorted(by_lr.items()):
            label = f"{variant.replace('_', ' ')}, lr {lr:g}"
            loss_ax.plot(run["steps"], run["loss"], style, label=label)
            logit_ax.plot(run["steps"], run["max_logit"], style, label=label)
        lrs = sorted(by_lr)
        lr_ax.plot(
            lrs, [by_lr[lr]["final"] for lr in lrs], style + "o", label=variant.replace("_", " ")
        )
    logit_ax.set_yscale("log")
    lr_ax.set_xscale("log")
    for ax, title, x in (
        (loss_ax, "training loss", "step"),
        (logit_ax, "max attention logit", "step"),
        (lr_ax, "final loss vs learning rate", "learning rate"),
    ):
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7)
    lr_ax.legend(fontsize=8)
    return save_figure(fig, path)


def throughput_plot(
    rates: dict[str, list[float]], losses: dict[str, float], title: str, path: Path
) -> Path:
    """Two panels: images/s of each variant (median bar, every timed round as a dot) and the
    loss each reached after the same budget."""
    plt = pyplot()

    names = list(rates)
    fig, (speed_ax, loss_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    medians = [statistics.median(rates[n]) for n in names]
    speed_ax.bar(names, medians, color=["tab:blue", "tab:orange"][: len(names)], alpha=0.7)
    for i, name in enumerate(names):
        speed_ax.plot([i] * len(rates[name]), rates[name], "k.", alpha=0.6)
    speed_ax.set_title(f"{title}: training images/s")
    loss_ax.bar(
        names, [losses[n] for n in names], color=["tab:blue", "tab:orange"][: len(names)], alpha=0.7
    )
    loss_ax.set_title("loss after the same steps")
    for ax in (speed_ax, loss_ax):
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def lr_scaling_plot(
    finals: dict[str, dict[str, float]], widths: dict[str, int], path: Path
) -> Path:
    """Final loss against model width, one line per learning-rate policy (``finals[size]
    [policy]``: "kept" at the base LR, "lowered" with width)."""
    plt = pyplot()

    sizes = sorted(finals, key=widths.get)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for policy, style in (("kept", "o-"), ("lowered", "s--")):
        ax.plot(
            [widths[s] for s in sizes],
            [finals[s][policy] for s in sizes],
            style,
            label=f"LR {policy}",
        )
    for size in sizes:
        ax.annotate(
            size,
            (widths[size], finals[size]["kept"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xlabel("width")
    ax.set_ylabel("final training loss")
    ax.set_title("QK-norm: keep the learning rate vs lower it with size")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def reliability_plot(diagrams: dict, path: Path) -> Path:
    """Reliability diagrams: accuracy against mean confidence per bin (bars, the diagonal is
    perfect calibration) with each bin's count written above it; ``diagrams`` maps a label to
    an ``evalkit.metrics.Reliability``. With more than one corrupted set, the clean one and all
    corrupted sets pooled are drawn."""
    plt = pyplot()
    panels = {"clean": diagrams["clean"]}
    corrupted = [d for label, d in diagrams.items() if label != "clean"]
    if corrupted:
        panels[f"ImageNet-C, {len(corrupted)} sets pooled"] = pooled(corrupted)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6), squeeze=False)
    for ax, (label, bins) in zip(axes[0], panels.items(), strict=True):
        width = 1 / len(bins.counts)
        centres = [(b + 0.5) * width for b in range(len(bins.counts))]
        heights = [0 if n == 0 else a for a, n in zip(bins.accuracy, bins.counts, strict=True)]
        ax.bar(centres, heights, width=width * 0.95, alpha=0.7, label="accuracy")
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        for x, h, n in zip(centres, heights, bins.counts, strict=True):
            if n:
                ax.text(x, h + 0.01, str(n), ha="center", fontsize=6, rotation=90)
        ax.set(
            xlim=(0, 1),
            ylim=(0, 1.15),
            xlabel="confidence",
            ylabel="accuracy",
            title=f"{label}: ECE {bins.ece:.3f}",
        )
        ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def parity_plot(series: dict[str, dict[float, float]], target: str, path: Path) -> Path:
    """Accuracy against the demographic-parity level it was constrained to, one curve per
    backbone (``series[backbone][level] = accuracy``); the fairness evaluation's figure."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for backbone, by_level in sorted(series.items()):
        levels = sorted(by_level)
        ax.plot(levels, [by_level[lv] for lv in levels], "o-", label=backbone)
    ax.set(
        xlabel="demographic-parity level ε (largest selection-rate gap allowed)",
        ylabel="test accuracy (expected)",
        title=f"CelebA {target}: accuracy under the constraint",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def critical_difference_plot(mean_ranks: dict[str, float], cliques: list[list[str]], path: Path):
    """The leaderboard's critical-difference diagram: setups on an axis of mean rank over the
    tasks (1 on the left), the better half labelled on the left and the worse half on the
    right, a bar on a line of its own under each group no test separates; saved with every
    label inside the picture."""
    plt = pyplot()
    order = sorted(mean_ranks, key=mean_ranks.get)
    middle = (len(order) + 1) // 2
    low, high = 1.0, max(max(mean_ranks.values()), 2.0)
    fig, ax = plt.subplots(figsize=(7, 1.4 + 0.3 * (middle + len(cliques))))
    for i, name in enumerate(order):
        row = -(len(cliques) * 0.25 + 0.6 + 0.4 * (i if i < middle else len(order) - 1 - i))
        end, align = (low - 0.1, "right") if i < middle else (high + 0.1, "left")
        ax.plot([mean_ranks[name]] * 2 + [end], [0, row, row], color="#224466", lw=1)
        label = f"{name} ({mean_ranks[name]:.2f})"
        ax.text(end, row, f" {label} " if align == "left" else f"{label} ", va="center", ha=align)
    for k, clique in enumerate(cliques):
        values = [mean_ranks[name] for name in clique]
        ax.plot([min(values), max(values)], [-0.25 - 0.25 * k] * 2, color="#cc5522", lw=4)
    ax.set_xlim(low - 0.1, high + 0.1)
    ax.set_xlabel("mean rank over the tasks (1 is best); each bar: setups no test separates")
    ax.set_yticks([])
    ax.set_ylim(top=0)
    ax.xaxis.set_ticks_position("top")  # the rank axis on top, setups hanging from it
    ax.xaxis.set_label_position("top")
    for side in ("left", "right", "bottom"):
        ax.spines[side].set_visible(False)
    return save_figure(fig, path, tight=True)
