"""PNG plots of the training ablations (effect-table rows 1–4): curves per run and a summary
per variant, drawn with matplotlib's non-interactive backend."""

from __future__ import annotations

from pathlib import Path


def stability_plot(runs: dict[str, dict[float, dict]], path: Path) -> Path:
    """Three panels: the loss and the max attention logit over steps (one line per variant and
    LR), and the final loss against the LR per variant. ``runs[variant][lr]`` holds ``steps``,
    ``loss``, ``max_logit`` (curves) and ``final`` (a number)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    for ax, title, x in ((loss_ax, "training loss", "step"), (logit_ax, "max attention logit", "step"),
                         (lr_ax, "final loss vs learning rate", "learning rate")):  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7)
    lr_ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
