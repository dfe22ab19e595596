"""``evalkit reproduce --scale paper``: the effect table's runs at the paper's scale, as one
sweep (docs/protocols.md, "Effect table"; ``evalkit.reproduction.rows`` holds the rows).

The scaling rows compare the backbones standing for the paper's two models of each row
(``scales.PAPER_BACKBONES``, weights from ``--weights MODEL=PATH``), the ablation rows train
their own models at ``scales.PAPER_SETTINGS``. Every (task, backbone, settings) run is one
job of an ``evalkit.reproduction.sweep`` plan on the real data (``--data-dir``), run here one after another or
submitted to Slurm as a job array. Before anything runs, each row's compute is estimated from
the tasks' plans (the forward passes of each stage, the planner's FLOPs per image) and written
beside the table (``compute-<scale>``, Markdown): FLOPs, and GPU-hours at an assumed share of a
GPU's peak. With ``--target`` (a node type of ``evalkit plan``), each row also says what it
needs there: the fewest GPUs at which its jobs fit, per rank and per host, the nodes that takes
and the wall-clock hours; a job that fits nowhere says why. Once every job's rows are on disk,
the same command writes the table from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.reproduction.reproduce import Reproduction
from evalkit.reproduction.rows import EffectRow, selected
from evalkit.reproduction.scales import PAPER_BACKBONES, SCALES


@dataclass(frozen=True)
class Accelerator:
    """What a GPU-hour is worth: dense bf16 peak and the share of it a run achieves."""

    name: str = "A100"
    peak_tflops: float = 312.0
    utilisation: float = 0.4  # model FLOPs utilisation assumed for every run

    def __post_init__(self):
        if self.peak_tflops <= 0 or not 0 < self.utilisation <= 1:
            raise EvalkitError(
                f"expected --peak-tflops > 0 and 0 < --mfu ≤ 1, got {self.peak_tflops:g} and "
                f"{self.utilisation:g}"
            )

    def hours(self, flops: float) -> float:
        return flops / (self.peak_tflops * 1e12 * self.utilisation * 3600)


@dataclass
class PaperRun:
    """The paper-scale table's inputs: where the data and weights are, and the sweep's shape."""

    data_dir: Path | None = None
    out: Path = Path("results/paper")
    weights: dict[str, str] = field(default_factory=dict)  # paper model → checkpoint
    backbones: dict[str, str] = field(default_factory=dict)  # paper model → spec, to override
    only: set[int] | None = None

    def reproduction(self, resources) -> tuple[Reproduction, list[EffectRow]]:
        """The reproduction with its sweep plan set, and the rows it covers."""
        from evalkit.reproduction.sweep import Sweep

        for model in {**self.weights, **self.backbones}:
            if model not in PAPER_BACKBONES:
                raise EvalkitError(
                    f"unknown paper model {model!r}: expected one of {', '.join(PAPER_BACKBONES)}"
                )
        job = Reproduction(
            SCALES["paper"],
            self.out,
            weights=dict(self.weights),
            backbones={**PAPER_BACKBONES, **self.backbones},
        )
        effects = selected(self.only)
        jobs = tuple(dict.fromkeys(job.job(e, m) for e in effects for m in e.measures.values()))
        # The ablations train their own models in one process: one device, no torchrun
        alone = replace(resources, gpus=min(resources.gpus, 1), nodes=1, tp=1, fsdp=False)
        jobs = tuple(replace(j, resources=alone) if j.backbone == "none" else j for j in jobs)
        data = ("--data", "auto", *(("--data-dir", str(self.data_dir)) if self.data_dir else ()))
        job.plan = Sweep(jobs=jobs, out=job.runs, run_args=data, resources=resources)
        return job, effects

    def missing_weights(self, job: Reproduction, effects: list[EffectRow]) -> list[str]:
        """The paper models the rows use that have no ``--weights``."""
        used = {m for e in effects if e.scaling for m in e.models}
        return sorted(m for m in used if m not in job.weights)


def estimate(
    job: Reproduction, effects: list[EffectRow], data_dir: Path | None, target=None
) -> list[dict]:
    """Per row: its jobs' FLOPs from the tasks' plans (split sizes from ``data_dir`` when the
    data is there, else the dataset cards) and, on ``target``, each job's placement."""
    from evalkit.core.costs import plan_inputs, stage_flops
    from evalkit.core.runner import resolve_task
    from evalkit.data import DataConfig

    config = DataConfig(source="auto", root=data_dir)
    flops, placed = {}, {}
    for run in job.plan.jobs:
        task = resolve_task(run.task, run.overrides)
        inputs, _ = plan_inputs(task, run.backbone, config, {"dtype": "bf16"})
        flops[run] = sum(stage_flops(stage, inputs.shape) for stage in task.plan(inputs))
        if target is not None:
            placed[run] = place(task, run.backbone, config, target)
    estimates = []
    for effect in effects:
        runs = list(dict.fromkeys(job.job(effect, m) for m in effect.measures.values()))
        row = {
            "row": effect.number,
            "where": effect.where,
            "runs": [f"{r.task} × {r.backbone}" for r in runs],
            "flops": sum(flops[r] for r in runs),
        }
        if target is not None:
            row["placement"] = [placed[r] | {"flops": flops[r]} for r in runs]
        estimates.append(row)
    return estimates


def place(task, backbone: str, config, target) -> dict:
    """Where one job fits on ``target``: GPUs, nodes, and what stops it when nothing does."""
    import math

    from evalkit.core.costs import placement, plan_inputs

    def inputs_of(tp: int, dp: int):
        try:
            return plan_inputs(task, backbone, config, {"dtype": "bf16", "tp": tp, "dp": dp})[0]
        except EvalkitError:  # the model does not split into tp ranks
            return None

    gpus, problems = placement(task, backbone, inputs_of, target)
    named = [f"{task.name} × {backbone}: {why}" for why in problems]
    return {"gpus": gpus, "nodes": math.ceil(gpus / max(target.gpus, 1)), "problems": named}


def placement_table(estimates: list[dict], target, utilisation: float) -> str:
    """Markdown: per row, the GPUs and nodes of ``target`` its largest job needs and the
    wall-clock hours of its jobs run one after another on that many GPUs."""
    gpu = Accelerator(
        peak_tflops=target.peak_tflops or Accelerator.peak_tflops, utilisation=utilisation
    )
    peak = gpu.peak_tflops
    lines = [
        f"## On {target.describe()}",
        "",
        f"Each job on the fewest GPUs of a node at which it fits (per rank and per host); "
        f"hours at {utilisation:.0%} of {peak:g} TFLOP/s per GPU.",
        "",
        "| # | GPUs × nodes | hours | runnable |",
        "|---|---|---|---|",
    ]
    for e in estimates:
        jobs = e["placement"]
        widest = max(jobs, key=lambda j: j["gpus"])
        hours = sum(gpu.hours(j["flops"]) / j["gpus"] for j in jobs)
        problems = [p for j in jobs for p in j["problems"]]
        lines.append(
            f"| {e['row']} | {widest['gpus']} × {widest['nodes']} | "
            f"{hours:,.1f} | {'no: ' + problems[0] if problems else 'yes'} |"
        )
    return "\n".join(lines) + "\n"


def compute_table(estimates: list[dict], gpu: Accelerator) -> str:
    """Markdown: each row's runs, FLOPs and GPU-hours, and the total."""
    from evalkit.parallel.sizing import human

    head = f"GPU-hours at {gpu.utilisation:.0%} of an {gpu.name}'s {gpu.peak_tflops:g} TFLOP/s"
    lines = [
        "# Compute of the effect table at scale `paper` (estimated)",
        "",
        "Each row's runs, their FLOPs from the tasks' plans (forward passes per stage × the "
        "planner's FLOPs per image; training counted as three passes) and what that is in "
        "GPU-hours. Written by `evalkit reproduce --scale paper --dry-run`; estimates, "
        "not measurements.",
        "",
        f"| # | where | runs | FLOPs | {head} |",
        "|---|---|---|---|---|",
    ]
    for e in estimates:
        lines.append(
            f"| {e['row']} | {e['where']} | {'; '.join(e['runs'])} | "
            f"{human(e['flops'], 'FLOP')} | {gpu.hours(e['flops']):,.0f} |"
        )
    total = sum(e["flops"] for e in estimates)
    lines.append(f"| | all rows | | {human(total, 'FLOP')} | {gpu.hours(total):,.0f} |")
    return "\n".join(lines) + "\n"
