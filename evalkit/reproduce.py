"""``evalkit reproduce``: the paper's 12-row effect table, measured (docs/protocols.md, "Effect
table"; the paper's numbers are in each task's module).

Each row names what changed, the paper's values and effect, and the runs that measure the same
change here: the four ablation tasks train their own small models; the scaling rows compare two
sizes of a pretraining ladder of the built-in family (``evalkit pretrain``: the smaller stands
in for ViT-e, the larger for ViT-22B) on the embedded stand-ins. Every value in the table comes
from a result row written by ``evalkit run``; a row whose effect does not point the paper's way
says so, and a row that cannot be compared says why. Runs go to ``<out>/runs-<scale>/`` and the
ladder to the cache, so a rerun (also after a crash) reuses everything already finished.

Scales: ``tiny`` (CPU-sized settings, embedded data) and ``smoke`` (the same rows with a few
steps each: it checks the machinery, its numbers mean nothing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError

LARGE, SMALL = "large", "small"
# Parameters of the paper's models (Table 1 and the models compared), for the scaling plot.
PAPER_PARAMS = {"ViT-L/32": 0.31e9, "ViT-G": 1.84e9, "ViT-e": 3.9e9, "ViT-22B": 21.74e9}


@dataclass(frozen=True)
class Scale:
    name: str
    ladder: tuple[str, str] = ("ti", "s")  # (stands in for ViT-e, for ViT-22B)
    pretrain_steps: int = 200
    ablation_steps: int = 150
    lrs: str = "1e-3,3e-1"
    head_steps: int = 150
    finetune_steps: int = 100
    image_size: int = 64  # dense tasks (a multiple of the ladder's patch, 8)
    student: str = "test"

    def settings(self) -> dict[str, tuple[str, ...]]:
        """Settings per task at this scale."""
        steps, dense = f"steps={self.ablation_steps}", f"image_size={self.image_size}"
        return {
            "qk-norm-stability": (f"lrs={self.lrs}", steps),
            "qk-norm-lr": (steps, "sizes=test,ti"),
            "bias-efficiency": ("size=test", "image=32", steps, "rounds=3"),
            "parallel-efficiency": ("size=test", "image=32", steps, "rounds=3"),
            "lit-objectnet": (f"steps={self.head_steps}",),
            "ade20k-1/16": ("finetune=true", f"finetune_steps={self.finetune_steps}", dense),
            "ade20k-1/1": ("finetune=true", f"finetune_steps={self.finetune_steps}", dense),
            "waymo-depth-dpt": (f"steps={self.head_steps}", dense),
            "waymo-depth-linear": (f"steps={self.head_steps}", dense),
            "kinetics400": (f"steps={self.head_steps}",),
            "imagenet-c-ece": ("severities=1,3,5",),
            "distill-imagenet": (f"student={self.student}", f"steps={self.head_steps}"),
        }


SCALES = {
    "tiny": Scale("tiny"),
    "smoke": Scale(
        "smoke",
        ladder=("test", "test"),
        pretrain_steps=4,
        ablation_steps=4,
        head_steps=4,
        finetune_steps=2,
        image_size=32,
    ),  # fmt: skip
}


@dataclass(frozen=True)
class Measure:
    """One run: a task on the ablations' own models (``none``) or a ladder size."""

    task: str
    on: str = "none"  # none | small | large


Values = dict[str, dict[str, float]]  # measure name → metric → value
Outcome = tuple[str, float | None, bool | None, str]  # our values, our effect, agrees, note


@dataclass(frozen=True)
class EffectRow:
    number: int
    changed: str
    where: str
    metric: str
    paper: str
    paper_effect: str
    measures: dict[str, Measure]
    judge: Callable[[Values], Outcome]
    setup: str = ""
    # (paper model, value) of the two models compared, and our metric, for the scaling plot
    paper_points: tuple = ()
    plotted: str = ""


def scaling(task: str, metric: str, *, lower_is_better: bool = False):
    """Measures and judge of a scaling row: the larger ladder size against the smaller."""
    measures = {SMALL: Measure(task, SMALL), LARGE: Measure(task, LARGE)}

    def judge(values: Values) -> Outcome:
        small, large = values[SMALL][metric], values[LARGE][metric]
        effect = (small - large) if lower_is_better else (large - small)
        text = f"{small:.3g} → {large:.3g}"
        return text, effect, effect > 0, "" if effect > 0 else "the larger model is not better here"

    return measures, judge


def _stability(values: Values) -> Outcome:
    row = values["ablation"]
    highest = max(float(k.split("lr=")[1]) for k in row if k.startswith("max_attention_logit/"))
    without = row[f"max_attention_logit/no_qk_norm/lr={highest:g}"]
    with_qk = row[f"max_attention_logit/qk_norm/lr={highest:g}"]
    ratio = without / with_qk if with_qk else float("inf")
    text = f"max logit at lr {highest:g}: {without:.3g} without, {with_qk:.3g} with QK-norm"
    return text, ratio, ratio >= 10, "" if ratio >= 10 else "logits did not grow 10× without it"


def _keep_lr(values: Values) -> Outcome:
    gains = {k.split("/")[1]: v for k, v in values["ablation"].items() if k.startswith("gain/")}
    text = ", ".join(f"{size}: {gain:+.3f}" for size, gain in gains.items())
    worst = min(gains.values())
    return (f"loss(lowered) − loss(kept): {text}", worst, worst >= 0,
            "" if worst >= 0 else "a lowered LR trained better at some size")  # fmt: skip


def _speedup(first: str, second: str):
    def judge(values: Values) -> Outcome:
        row = values["ablation"]
        speedup = row["speedup"]
        losses = f"final loss {row[f'final_loss/{first}']:.3f} vs {row[f'final_loss/{second}']:.3f}"
        note = "" if speedup > 1 else f"{first} was not faster on this device"
        return f"{speedup:.3f}× images/s ({losses})", speedup - 1, speedup > 1, note

    return judge


def _ade_full(values: Values) -> Outcome:
    small, large = values[SMALL]["miou"], values[LARGE]["miou"]
    note = ("not comparable: the paper's effect is ViT-22B against ViT-G at full data; "
            "ours is the ladder's larger size against its smaller")  # fmt: skip
    return f"{small:.3g} → {large:.3g}", large - small, None, note


def _depth(values: Values) -> Outcome:
    gains = {head: values[f"{SMALL}-{head}"]["mse"] - values[f"{LARGE}-{head}"]["mse"]
             for head in ("dpt", "linear")}  # fmt: skip
    text = ", ".join(f"{h}: {values[f'{SMALL}-{h}']['mse']:.3g} → {values[f'{LARGE}-{h}']['mse']:.3g}"
                     for h in gains)  # fmt: skip
    agrees = all(g > 0 for g in gains.values())
    return (
        text,
        min(gains.values()),
        agrees,
        "" if agrees else "MSE did not fall with size for every head",
    )


def _distill(values: Values) -> Outcome:
    row = values["distill"]
    gain = row["gain"]
    text = (f"teacher {row['top1/teacher']:.3g}, distilled {row['top1/distilled']:.3g}, "
            f"label-only {row['top1/label_only']:.3g}")  # fmt: skip
    return (
        text,
        gain,
        gain > 0,
        "" if gain > 0 else "the distilled student did not beat the label-only one",
    )


def rows() -> list[EffectRow]:
    """The paper's effect table, each row with the runs that measure it here."""
    lin, lin_judge = scaling("imagenet-linear", "top1")
    lit, lit_judge = scaling("lit-objectnet", "top1")
    ade, ade_judge = scaling("ade20k-1/16", "miou")
    video, video_judge = scaling("kinetics400", "top1")
    ece, ece_judge = scaling("imagenet-c-ece", "ece/mean", lower_is_better=True)
    depth = {f"{size}-{head}": Measure(f"waymo-depth-{head}", size)
             for size in (SMALL, LARGE) for head in ("dpt", "linear")}  # fmt: skip
    ablation = {"ablation": Measure("qk-norm-stability")}
    return [
        EffectRow(1, "add QK-LayerNorm", "~8B ViT", "max attention logit",
                  "without: diverged after a few thousand steps", "stable with it", ablation,
                  _stability, "small ViT, LR sweep, with/without QK-norm"),
        EffectRow(2, "keep LR 1e-3 with QK-norm", "up to ViT-L", "final loss",
                  "(not public)", "quality holds with scale", {"ablation": Measure("qk-norm-lr")},
                  _keep_lr, "ladder test, ti: LR kept vs lowered with width"),
        EffectRow(3, "no QKV / LayerNorm biases", "ViT-22B", "images/s",
                  "+3% utilisation", "faster, same quality", {"ablation": Measure("bias-efficiency")},
                  _speedup("without", "with"), "vit22b/test, interleaved timing"),
        EffectRow(4, "parallel attention + MLP", "ViT-22B", "images/s", "~15% faster",
                  "faster, same quality", {"ablation": Measure("parallel-efficiency")},
                  _speedup("parallel", "sequential"), "vit22b/test, interleaved timing"),
        EffectRow(5, "scale ViT-e → ViT-22B", "ImageNet linear probe", "top-1",
                  "89.26 → 89.51", "+0.25", lin, lin_judge,
                  paper_points=(("ViT-e", 89.26), ("ViT-22B", 89.51)), plotted="top1"),
        EffectRow(6, "scale LiT-e → LiT-22B", "ObjectNet zero-shot", "top-1", "84.9 → 87.6",
                  "+2.7", lit, lit_judge, paper_points=(("ViT-e", 84.9), ("ViT-22B", 87.6)),
                  plotted="top1"),
        EffectRow(7, "scale ViT-G → ViT-22B", "ADE20k 1/16, fine-tuned", "mIoU", "42.4 → 44.7",
                  "+2.3", ade, ade_judge, paper_points=(("ViT-G", 42.4), ("ViT-22B", 44.7)),
                  plotted="miou"),
        EffectRow(8, "scale ViT-G → ViT-22B", "ADE20k 1/1, fine-tuned", "mIoU", "55.6 → 54.9",
                  "−0.7 (ViT-22B behind)", scaling("ade20k-1/1", "miou")[0], _ade_full,
                  paper_points=(("ViT-G", 55.6), ("ViT-22B", 54.9)), plotted="miou"),
        EffectRow(9, "scale ViT-e → ViT-22B", "Waymo depth (DPT, linear)", "MSE",
                  "DPT 0.024 → 0.021, linear 0.053 → 0.039", "lower", depth, _depth),
        EffectRow(10, "scale ViT-e → ViT-22B", "Kinetics-400, frozen", "top-1", "86.5 → 88.0",
                  "+1.5", video, video_judge, paper_points=(("ViT-e", 86.5), ("ViT-22B", 88.0)),
                  plotted="top1"),
        EffectRow(11, "scale ViT-L/32 → ViT-22B", "ImageNet-C calibration", "ECE",
                  "0.05 → 0.01 (fine-tuned, 384 px)", "lower", ece, ece_judge,
                  "frozen probe, temperature not applied",
                  paper_points=(("ViT-L/32", 0.05), ("ViT-22B", 0.01)), plotted="ece/mean"),
        EffectRow(12, "distil from ViT-22B", "ImageNet, ViT-B/16 student", "top-1",
                  "86.7 → 88.6", "+1.9", {"distill": Measure("distill-imagenet", LARGE)},
                  _distill, "ladder teacher, tiny student, consistent teaching"),
    ]  # fmt: skip


@dataclass
class Reproduction:
    scale: Scale
    out: Path = Path("results/paper")
    cache: Path | None = None
    progress: bool = False
    ladder: dict[str, str] = field(default_factory=dict)  # size → weights path
    params: dict[str, int] = field(default_factory=dict)  # size → parameters

    @property
    def runs(self) -> Path:
        return self.out / f"runs-{self.scale.name}"

    def pretrain_ladder(self) -> float:
        """The ladder's checkpoints (trained once; a rerun reuses them); returns the seconds
        the ladder took when it was trained."""
        from evalkit.data import DataConfig
        from evalkit.identity import cache_root
        from evalkit.training.loop import Schedule
        from evalkit.training.pretrain import PretrainSpec, pretrain

        root = Path(self.cache or cache_root())
        sizes = tuple(dict.fromkeys(self.scale.ladder))
        spec = PretrainSpec(sizes=sizes, out=root / "reproduce" / f"ladder-{self.scale.name}",
                            schedule=Schedule(steps=self.scale.pretrain_steps, batch_size=64,
                                              warmup=max(1, self.scale.pretrain_steps // 10)),
                            progress=self.progress)  # fmt: skip
        summaries = pretrain(spec, DataConfig(source="embedded", cache=root))
        self.ladder = {s["size"]: s["weights"] for s in summaries}
        self.params = {s["size"]: s["params"] for s in summaries}
        return sum(s["seconds"] for s in summaries)

    def measure(self, measure: Measure) -> tuple[dict[str, float], float]:
        """The metrics of one run (rows reused when on disk) and its seconds of compute."""
        import evalkit

        options = {"overrides": self.scale.settings().get(measure.task, ()), "data": "embedded",
                   "out": self.runs, "progress": self.progress, "cache_dir": self.cache}  # fmt: skip
        if measure.on == "none":
            rows = evalkit.run(measure.task, (), **options)
        else:
            size = self.scale.ladder[0 if measure.on == SMALL else 1]
            rows = evalkit.run(measure.task, f"vit22b/{size}", weights=self.ladder[size], **options)
        seconds = max((r["provenance"]["wall_s"] for r in rows), default=0.0)
        return {r["metric"]: r["value"] for r in rows}, seconds

    def row(self, effect: EffectRow) -> dict:
        values, seconds = {}, 0.0
        for name, measure in effect.measures.items():
            values[name], spent = self.measure(measure)
            seconds += spent
        ours, value, agrees, note = effect.judge(values)
        plot = {}
        if effect.paper_points:
            plot = {"paper": [[PAPER_PARAMS[m], v] for m, v in effect.paper_points],
                    "ours": [[self.params[self.scale.ladder[i]], values[which][effect.plotted]]
                             for i, which in enumerate((SMALL, LARGE))],
                    "metric": effect.plotted}  # fmt: skip
        return {"row": effect.number, "plot": plot, "changed": effect.changed, "where": effect.where,
                "metric": effect.metric, "paper": effect.paper, "paper_effect": effect.paper_effect,
                "setup": effect.setup or f"ladder {self.scale.ladder[0]} → {self.scale.ladder[1]}",
                "ours": ours, "our_effect": value, "agrees": agrees, "note": note,
                "seconds": round(seconds, 1)}  # fmt: skip


def reproduce(scale: str, *, only=None, out=Path("results/paper"), cache=None,
              progress=False, echo=print) -> list[dict]:  # fmt: skip
    """Measure every row (or the numbers in ``only``), write the table, return its records."""
    if scale not in SCALES:
        raise EvalkitError(f"unknown scale {scale!r}: choose from {', '.join(SCALES)}")
    effects = [r for r in rows() if not only or r.number in only]
    if not effects:
        raise EvalkitError(f"no effect-table rows {sorted(only)}: rows are 1 to 12")
    job = Reproduction(SCALES[scale], Path(out), cache, progress)
    start = time.perf_counter()
    ladder_s = job.pretrain_ladder() if any(m.on != "none" for r in effects
                                           for m in r.measures.values()) else 0.0  # fmt: skip
    records = []
    for effect in effects:
        echo(f"row {effect.number}: {effect.changed} ({effect.where})")
        records.append(job.row(effect))
    rows_s = round(sum(r["seconds"] for r in records), 1)
    summary = {"scale": scale, "ladder": list(SCALES[scale].ladder), "ladder_seconds": ladder_s,
               "rows_seconds": rows_s, "compute_seconds": round(ladder_s + rows_s, 1),
               "wall_seconds": round(time.perf_counter() - start, 1), "rows": records}  # fmt: skip
    write(summary, Path(out))
    return records


def write(summary: dict, out: Path):
    """``effects-<scale>.json`` and ``.md`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"effects-{summary['scale']}"
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    header = ("| # | what changed | where | metric | paper values | paper effect | our setup | "
              "our values | our effect | agrees? | s |")  # fmt: skip
    lines = [f"# The effect table at scale `{summary['scale']}`", "",
             f"Ladder {' → '.join(summary['ladder'])}. Compute: ladder {summary['ladder_seconds']:.0f} s "
             f"+ rows {summary['rows_seconds']:.0f} s = {summary['compute_seconds']:.0f} s (each "
             f"counted when it ran; this invocation took {summary['wall_seconds']:.0f} s, reusing "
             f"what was done). Produced by `evalkit reproduce --scale {summary['scale']}`.", "",
             header, "|" + "---|" * 11]  # fmt: skip
    for r in summary["rows"]:
        agrees = {True: "yes", False: "no", None: "n/a"}[r["agrees"]]
        effect = "–" if r["our_effect"] is None else f"{r['our_effect']:+.3g}"
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(f"| {r['row']} | {r['changed']} | {r['where']} | {r['metric']} | {r['paper']} | "
                     f"{r['paper_effect']} | {r['setup']} | {r['ours']} | {effect} | {agrees}{note} | "
                     f"{r['seconds']:.0f} |")  # fmt: skip
    picture = scaling_plot(summary["rows"], out / f"{name}.png")
    if picture:
        lines += [
            "",
            f"![Scaling rows: the paper's two models and our two ladder sizes]({picture.name})",
        ]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def scaling_plot(records: list[dict], path: Path) -> Path | None:
    """One panel per scaling row: the metric against parameters, the paper's two models
    (left axis) and our two ladder sizes (right axis), both on a log scale of parameters."""
    plotted = [r for r in records if r.get("plot")]
    if not plotted:
        return None
    from evalkit.plots import pyplot, save_figure

    fig, axes = pyplot().subplots(1, len(plotted), figsize=(3.6 * len(plotted), 3.4), squeeze=False)
    for ax, record in zip(axes[0], plotted, strict=True):
        paper, ours = (list(zip(*record["plot"][k], strict=True)) for k in ("paper", "ours"))
        ax.plot(*paper, "o-", color="tab:blue", label="paper")
        ax.set_xscale("log")
        ax.set_ylabel("paper", color="tab:blue")
        top = ax.twiny()  # our ladder's parameters along the top
        top.set_xscale("log")
        top.set_xlabel("parameters (ours)", fontsize=7)
        twin = top.twinx()
        twin.plot(*ours, "s--", color="tab:orange", label="ours")
        twin.set_ylabel("ours", color="tab:orange")
        ax.set_title(f"{record['row']}. {record['where']}\n{record['plot']['metric']}", fontsize=8)
        ax.set_xlabel("parameters (paper)")
    return save_figure(fig, path, dpi=90)
