"""The paper's effect table as data (docs/protocols.md, "Effect table"): its 12 rows, each with
what changed, the paper's values and effect, the runs that measure it here and the judge that
gives the verdict — agrees or disagrees only beyond the effect's 95% interval — and the
departures from the paper each row keeps at each scale (the scales: ``evalkit.reproduction.scales``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from evalkit.errors import EvalkitError
from evalkit.reproduction.resolve import quantile
from evalkit.reproduction.scales import Scale

LARGE, SMALL = "large", "small"


@dataclass(frozen=True)
class Measure:
    """One run: a task on the ablations' own models (``none``) or a ladder size."""

    task: str
    on: str = "none"  # none | small | large


# measure name → metric → value (and "<metric>/stderr" where the row has a standard error,
# "<metric>/seeds" how many seeds the value is the mean of)
Values = dict[str, dict[str, float]]


class Outcome(NamedTuple):
    """A row's verdict: our values, our effect, whether it points the paper's way (None: within
    noise, or not comparable), why, the effect's 95% interval, and the value the effect is
    relative to (None: the effect is already relative)."""

    ours: str
    effect: float | None
    agrees: bool | None
    note: str
    interval: tuple[float, float] | None = None
    relative_to: float | None = None
    stderr: float | None = None  # the effect's standard error, the interval's unit


def verdict(
    ours: str,
    effect: float,
    stderr: float | None,
    *,
    paper_sign: int = 1,
    relative_to: float | None = None,
    seeds: int = 1,
) -> Outcome:
    """Agrees or disagrees only when the 95% interval leaves out zero; else within noise. The
    interval is the effect ± t·se, t Student's on seeds − 1 degrees of freedom where the error
    includes the spread of ``seeds`` ≥ 2 seeds (normal for one: the items' error alone)."""
    if stderr is None or math.isnan(stderr):
        return Outcome(ours, effect, None, "no uncertainty measured", None, relative_to)
    half = quantile(0.05, seeds) * stderr
    low, high = effect - half, effect + half
    interval = (low, high)
    if low <= 0 <= high:
        note = f"within noise (95%: {low:+.3g} to {high:+.3g})"
        return Outcome(ours, effect, None, note, interval, relative_to, stderr)
    agrees = (low > 0) == (paper_sign > 0)
    note = "" if agrees else "points against the paper's effect beyond noise"
    return Outcome(ours, effect, agrees, note, interval, relative_to, stderr)


def seeds_of(values: Values, metric: str, measures=("small", "large")) -> int:
    """The fewest seeds any of ``measures`` averaged for ``metric`` (1 where not recorded)."""
    return min(int(values[m].get(f"{metric}/seeds", 1)) for m in measures)


def difference_stderr(values: Values, metric: str) -> float | None:
    """The standard error of large − small: the two models' errors added in quadrature
    (independent fits; on the same test items this overstates it, never understates)."""
    errors = [values[m].get(f"{metric}/stderr") for m in (SMALL, LARGE)]
    return None if None in errors else math.sqrt(sum(e * e for e in errors))


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
    # (paper model, value) of the two models compared
    paper_points: tuple = ()
    pictures: bool = False  # copy the runs' curves / diagrams beside the table
    # the paper's effect as a relative change in its favourable direction (None: no number)
    paper_relative: float | None = None
    paper_sign: int = 1  # the sign of the paper's effect on our positive-is-better scale

    @property
    def scaling(self) -> bool:
        """Whether the row compares two backbones (else its tasks train their own models)."""
        return any(m.on != "none" for m in self.measures.values())

    @property
    def models(self) -> tuple[str, str]:
        """The paper's two models this row compares (ViT-e and ViT-22B unless it names others)."""
        return tuple(m for m, _ in self.paper_points) or ("ViT-e", "ViT-22B")


def scaling(task: str, metric: str, *, lower_is_better: bool = False, paper_sign: int = 1):
    """Measures and judge of a scaling row: the larger ladder size against the smaller, the
    effect signed so that positive is better; ``paper_sign`` is the paper's effect's sign."""
    measures = {SMALL: Measure(task, SMALL), LARGE: Measure(task, LARGE)}

    def judge(values: Values) -> Outcome:
        small, large = values[SMALL][metric], values[LARGE][metric]
        effect = (small - large) if lower_is_better else (large - small)
        return verdict(
            f"{small:.3g} → {large:.3g}",
            effect,
            difference_stderr(values, metric),
            paper_sign=paper_sign,
            relative_to=abs(small) or None,
            seeds=seeds_of(values, metric),
        )

    return measures, judge


def _stability(values: Values) -> Outcome:
    row = values["ablation"]
    highest = max(float(k.split("lr=")[1]) for k in row if k.startswith("max_attention_logit/"))
    without = row[f"max_attention_logit/no_qk_norm/lr={highest:g}"]
    with_qk = row[f"max_attention_logit/qk_norm/lr={highest:g}"]
    ratio = without / with_qk if with_qk else float("inf")
    text = f"max logit at lr {highest:g}: {without:.3g} without, {with_qk:.3g} with QK-norm"
    return Outcome(
        text, ratio, ratio >= 10, "" if ratio >= 10 else "logits did not grow 10× without it"
    )


def _keep_lr(values: Values) -> Outcome:
    gains = {k.split("/")[1]: v for k, v in values["ablation"].items() if k.startswith("gain/")}
    text = ", ".join(f"{size}: {gain:+.3f}" for size, gain in gains.items())
    worst = min(gains.values())
    return Outcome(
        f"loss(lowered) − loss(kept): {text}",
        worst,
        worst >= 0,
        "" if worst >= 0 else "a lowered LR trained better at some size",
    )


def _speedup(first: str, second: str):
    """Judge of an efficiency row: faster beyond two standard errors of the rounds' ratios
    agrees, slower beyond them does not, and anything closer is timing noise (n/a)."""

    def judge(values: Values) -> Outcome:
        row = values["ablation"]
        speedup, noise = row["speedup"], 2 * row.get("speedup/stderr", 0.0)
        losses = f"final loss {row[f'final_loss/{first}']:.3f} vs {row[f'final_loss/{second}']:.3f}"
        text = f"{speedup:.3f}× ± {noise / 2:.3f} images/s ({losses})"
        interval = (speedup - 1 - noise, speedup - 1 + noise)
        stderr = row.get("speedup/stderr")
        if abs(speedup - 1) <= noise:
            note = f"within timing noise on this device (±{noise:.3f})"
            return Outcome(text, speedup - 1, None, note, interval, None, stderr)
        note = "" if speedup > 1 else f"{first} was slower on this device"
        return Outcome(text, speedup - 1, speedup > 1, note, interval, None, stderr)

    return judge


def _ade_full(values: Values) -> Outcome:
    """The paper's ViT-22B is behind ViT-G at full data (a negative effect): judged by the
    rule of the other scaling rows, with the reminder of what is compared."""
    outcome = scaling("ade20k-1/1", "miou", paper_sign=-1)[1](values)
    caveat = "the paper compares ViT-22B with ViT-G; here the ladder's sizes"
    return outcome._replace(note="; ".join(n for n in (outcome.note, caveat) if n))


def _depth(values: Values) -> Outcome:
    """Both heads' MSE must fall with size: agrees when each head's interval is above zero,
    disagrees when one is below it, else within noise; the effect shown is the smaller gain."""
    heads = {}
    for head in ("dpt", "linear"):
        pair = {SMALL: values[f"{SMALL}-{head}"], LARGE: values[f"{LARGE}-{head}"]}
        gain = pair[SMALL]["mse"] - pair[LARGE]["mse"]
        heads[head] = verdict(
            "",
            gain,
            difference_stderr(pair, "mse"),
            relative_to=pair[SMALL]["mse"],
            seeds=seeds_of(pair, "mse"),
        )
    text = ", ".join(
        f"{h}: {values[f'{SMALL}-{h}']['mse']:.3g} → {values[f'{LARGE}-{h}']['mse']:.3g}"
        for h in heads
    )
    answers = [o.agrees for o in heads.values()]
    agrees = False if False in answers else (None if None in answers else True)
    notes = "; ".join(f"{h}: {o.note}" for h, o in heads.items() if o.note)
    return deciding_head(heads, agrees)._replace(ours=text, agrees=agrees, note=notes)


def deciding_head(heads: dict[str, Outcome], agrees: bool | None) -> Outcome:
    """The head whose interval the row shows: one that points against the paper where the row
    disagrees, the widest undecided one where it is undecided (its margin bounds both), else
    the smaller gain."""
    if agrees is None:
        undecided = [o for o in heads.values() if o.agrees is None]
        return max(undecided, key=lambda o: max(map(abs, o.interval or (math.inf,))))
    if agrees is False:
        return min((o for o in heads.values() if o.agrees is False), key=lambda o: o.effect)
    return min(heads.values(), key=lambda o: o.effect)


def _distill(values: Values) -> Outcome:
    row = values["distill"]
    text = (
        f"teacher {row['top1/teacher']:.3g}, distilled {row['top1/distilled']:.3g}, "
        f"label-only {row['top1/label_only']:.3g}"
    )
    return verdict(
        text,
        row["gain"],
        row.get("gain/stderr"),
        relative_to=row["top1/label_only"] or None,
        seeds=int(row.get("gain/seeds", 1)),
    )


def rows() -> list[EffectRow]:
    """The paper's effect table, each row with the runs that measure it here."""
    lin, lin_judge = scaling("imagenet-linear", "top1")
    lit, lit_judge = scaling("lit-objectnet", "top1")
    ade, ade_judge = scaling("ade20k-1/16", "miou")
    video, video_judge = scaling("kinetics400", "top1")
    ece, ece_judge = scaling("imagenet-c-ece", "ece/mean", lower_is_better=True)
    depth = {
        f"{size}-{head}": Measure(f"waymo-depth-{head}", size)
        for size in (SMALL, LARGE)
        for head in ("dpt", "linear")
    }
    ablation = {"ablation": Measure("qk-norm-stability")}
    return [
        EffectRow(
            1,
            "add QK-LayerNorm",
            "~8B ViT",
            "max attention logit",
            "without: diverged after a few thousand steps",
            "stable with it",
            ablation,
            _stability,
            "small ViT, LR sweep, with/without QK-norm",
            pictures=True,
        ),
        EffectRow(
            2,
            "keep LR 1e-3 with QK-norm",
            "up to ViT-L",
            "final loss",
            "(not public)",
            "quality holds with scale",
            {"ablation": Measure("qk-norm-lr")},
            _keep_lr,
            "ladder test, ti: LR kept vs lowered with width",
            pictures=True,
        ),
        EffectRow(
            3,
            "no QKV / LayerNorm biases",
            "ViT-22B",
            "images/s",
            "+3% utilisation",
            "faster, same quality",
            {"ablation": Measure("bias-efficiency")},
            _speedup("without", "with"),
            "vit22b/{timed} at 32 px, interleaved timing",
            pictures=True,
            paper_relative=0.03,
        ),
        EffectRow(
            4,
            "parallel attention + MLP",
            "ViT-22B",
            "images/s",
            "~15% faster",
            "faster, same quality",
            {"ablation": Measure("parallel-efficiency")},
            _speedup("parallel", "sequential"),
            "vit22b/{timed} at 32 px, interleaved timing",
            pictures=True,
            paper_relative=0.15,
        ),
        EffectRow(
            5,
            "scale ViT-e → ViT-22B",
            "ImageNet linear probe",
            "top-1",
            "89.26 → 89.51",
            "+0.25",
            lin,
            lin_judge,
            paper_points=(("ViT-e", 89.26), ("ViT-22B", 89.51)),
            paper_relative=(89.51 - 89.26) / 89.26,
        ),
        EffectRow(
            6,
            "scale LiT-e → LiT-22B",
            "ObjectNet zero-shot",
            "top-1",
            "84.9 → 87.6",
            "+2.7",
            lit,
            lit_judge,
            paper_points=(("ViT-e", 84.9), ("ViT-22B", 87.6)),
            paper_relative=(87.6 - 84.9) / 84.9,
        ),
        EffectRow(
            7,
            "scale ViT-G → ViT-22B",
            "ADE20k 1/16, fine-tuned",
            "mIoU",
            "42.4 → 44.7",
            "+2.3",
            ade,
            ade_judge,
            paper_points=(("ViT-G", 42.4), ("ViT-22B", 44.7)),
            paper_relative=(44.7 - 42.4) / 42.4,
        ),
        EffectRow(
            8,
            "scale ViT-G → ViT-22B",
            "ADE20k 1/1, fine-tuned",
            "mIoU",
            "55.6 → 54.9",
            "−0.7 (ViT-22B behind)",
            scaling("ade20k-1/1", "miou", paper_sign=-1)[0],
            _ade_full,
            paper_points=(("ViT-G", 55.6), ("ViT-22B", 54.9)),
            paper_sign=-1,
            paper_relative=(54.9 - 55.6) / 55.6,
        ),
        EffectRow(
            9,
            "scale ViT-e → ViT-22B",
            "Waymo depth (DPT, linear)",
            "MSE",
            "DPT 0.024 → 0.021, linear 0.053 → 0.039",
            "lower",
            depth,
            _depth,
            paper_relative=(0.024 - 0.021) / 0.024,
        ),  # the smaller of the two heads' gains
        EffectRow(
            10,
            "scale ViT-e → ViT-22B",
            "Kinetics-400, frozen",
            "top-1",
            "86.5 → 88.0",
            "+1.5",
            video,
            video_judge,
            paper_points=(("ViT-e", 86.5), ("ViT-22B", 88.0)),
            paper_relative=(88.0 - 86.5) / 86.5,
        ),
        EffectRow(
            11,
            "scale ViT-L/32 → ViT-22B",
            "ImageNet-C calibration",
            "ECE",
            "0.05 → 0.01 (fine-tuned, 384 px)",
            "lower",
            ece,
            ece_judge,
            "frozen probe, temperature not applied",
            paper_points=(("ViT-L/32", 0.05), ("ViT-22B", 0.01)),
            pictures=True,
            paper_relative=(0.05 - 0.01) / 0.05,
        ),
        EffectRow(
            12,
            "distil from ViT-22B",
            "ImageNet, ViT-B/16 student",
            "top-1",
            "86.7 → 88.6",
            "+1.9",
            {"distill": Measure("distill-imagenet", LARGE)},
            _distill,
            "ladder teacher, tiny student, consistent teaching",
            paper_relative=(88.6 - 86.7) / 86.7,
        ),
    ]


# What stays different from the paper, per row: (scales it applies at, what and why).
DEPARTURES = {
    3: (
        (
            "all",
            "both variants keep centred LayerNorms: the ablation isolates the biases, while "
            "ViT-22B also drops centring",
        ),
    ),
    6: (
        (
            "tiny",
            "image features mean-pooled (LiT pools the class token; at scale paper the "
            "model's MAP head, as ViT-22B has no class token)",
        ),
        ("all", "text tower and schedule from the public LiT recipe; the paper's are not public"),
    ),
    7: (("tiny", "small images and a few fine-tuning steps (the paper: 504 px, 40k steps)"),),
    8: (("tiny", "small images and a few fine-tuning steps (the paper: 504 px, 40k steps)"),),
    9: (
        ("all", "no gradient loss (DINOv2's KITTI recipe adds one, weight 0.5)"),
        (
            "all",
            "the linear head batch-normalises the patch tokens alone; DINOv2's also "
            "concatenates the class token",
        ),
        ("tiny", "DPT fusion width 64 (scale paper: 256, DPT's)"),
    ),
    11: (
        ("all", "the temperature is fitted on the hold-out that also chose the probe's L2"),
        (
            "tiny",
            "severities 1, 3 and 5 only; a frozen probe, not a classifier fine-tuned at 384 px",
        ),
        ("paper", "ViT-L/32 is timm's vit_large_patch32_384, not Plex's ViT-L/32"),
    ),
    12: (("tiny", "a small student at 32 px (the paper: ViT-B/16 at 384 px)"),),
}


def departures(effect: EffectRow, scale: Scale) -> list[str]:
    at = "paper" if scale.paper else "tiny"
    return [text for where, text in DEPARTURES.get(effect.number, ()) if where in ("all", at)]


def selected(only) -> list[EffectRow]:
    effects = [r for r in rows() if not only or r.number in only]
    if not effects:
        raise EvalkitError(f"no effect-table rows {sorted(only)}: rows are 1 to 12")
    return effects
