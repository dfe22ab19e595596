"""``evalkit reproduce``: the paper's 12-row effect table, measured (docs/protocols.md, "Effect
table"; the paper's numbers are in each task's module).

Each row names what changed, the paper's values and effect, and the runs that measure the same
change here: the four ablation tasks train their own small models; the scaling rows compare two
sizes of a pretraining ladder of the built-in family (``evalkit pretrain``: the smaller stands
in for ViT-e, the larger for ViT-22B) on the embedded stand-ins. Every value in the table comes
from a result row written by ``evalkit run``; a row whose effect does not point the paper's way
says so, and a row that cannot be compared says why. Runs go to ``<out>/runs-<scale>/`` and the
ladder to the cache, so a rerun (also after a crash) reuses everything already finished.

Scales: ``tiny`` (CPU-sized settings, embedded data), ``smoke`` (the same rows with a few
steps each: it checks the machinery, its numbers mean nothing) and ``paper``: the paper's models
(built-in ViT-e, ViT-G and ViT-22B, timm's ViT-L/32, each loading the weights the user gives) on
the real data sets with the paper's settings where they are known (``PAPER_SETTINGS``), run as a
sweep (``evalkit.reproduction.sweep``: locally or as a Slurm job array); each row's compute is estimated
beforehand from the tasks' plans and the planner's FLOPs (``estimate``). A rerun after the jobs
finished writes the table from their rows.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.reproduction.rows import (
    SMALL,
    EffectRow,
    Measure,
    Outcome,
    departures,
    selected,
)
from evalkit.reproduction.scales import ONE_SEED, PAPER_BACKBONES, SCALES, Scale
from evalkit.reproduction.table import write_table
from evalkit.seeds import SEED_RULE


@dataclass
class Reproduction:
    scale: Scale
    out: Path = Path("results/paper")
    cache: Path | None = None
    progress: bool = False
    ladder: dict[str, str] = field(default_factory=dict)  # size → weights path
    ladder_id: dict[str, str] = field(default_factory=dict)  # size → its weights' digest
    # scale paper: the paper's model → backbone spec, and → weights
    backbones: dict[str, str] = field(default_factory=lambda: dict(PAPER_BACKBONES))
    weights: dict[str, str] = field(default_factory=dict)
    plan: object = None  # scale paper: the sweep whose rows the table is written from
    read: dict = field(default_factory=dict)  # its rows files, each read once
    log: tuple[str, ...] = ()  # --log: every job's rows and curves also go to these trackers
    command: str = ""  # the command line that measures the rows, for the table's header

    @property
    def runs(self) -> Path:
        return self.out / f"runs-{self.scale.name}"

    def pretrain_ladder(self) -> float:
        """The ladder's checkpoints (trained once; a rerun reuses them); returns the seconds
        the ladder took when it was trained."""
        from evalkit.data import DataConfig
        from evalkit.schedule import Schedule
        from evalkit.storage.identity import cache_root, file_digest
        from evalkit.training.pretrain import PretrainSpec, pretrain

        root = Path(self.cache or cache_root())
        sizes = tuple(dict.fromkeys(self.scale.ladder))
        spec = PretrainSpec(
            sizes=sizes,
            out=root / "reproduce" / f"ladder-{self.scale.name}",
            schedule=Schedule(
                steps=self.scale.pretrain_steps,
                batch_size=64,
                warmup=max(1, self.scale.pretrain_steps // 10),
            ),
            progress=self.progress,
            keyed=True,
        )
        summaries = pretrain(spec, DataConfig(source="embedded", cache=root))
        self.ladder = {s["size"]: s["weights"] for s in summaries}
        self.ladder_id = {size: file_digest(Path(w))[:16] for size, w in self.ladder.items()}
        return sum(s["seconds"] for s in summaries)

    def job(self, effect: EffectRow, measure: Measure, seed: int = 0):
        """The ``evalkit run`` job of a measure: the ablations' own models, a ladder size, or
        (scale paper) the backbone standing for one of the row's paper models."""
        from evalkit.reproduction.sweep import Job

        overrides = tuple(self.scale.settings().get(measure.task, ()))
        if measure.on == "none":
            return Job(measure.task, "none", seed=seed, overrides=overrides)
        which = 0 if measure.on == SMALL else 1
        if self.scale.paper:
            model = effect.models[which]
            return Job(
                measure.task,
                self.backbones[model],
                seed=seed,
                overrides=overrides,
                weights=self.weights.get(model),
            )
        size = self.scale.ladder[which]
        return Job(
            measure.task,
            f"vit22b/{size}",
            seed=seed,
            overrides=overrides,
            weights=self.ladder[size],
        )

    def seeds(self, measure: Measure, count: int | None = None) -> int:
        """Seeds a measure runs: one for the ablations' own models and seed-free measures,
        else ``count`` (``--resolve`` adding seeds) or the scale's."""
        if not seed_dependent(measure):
            return 1
        return count or self.scale.seeds

    def measure(self, job) -> tuple[dict[str, float], float, list[str]]:
        """The metrics of one job (rows reused when on disk), its seconds of compute and the
        pictures it drew."""
        import evalkit
        from evalkit.reproduction.sweep import job_rows

        if self.plan is not None:  # the sweep ran it
            rows = job_rows(self.plan, job, self.read)
        else:
            rows = evalkit.run(
                job.task,
                () if job.backbone == "none" else job.backbone,
                weights=job.weights,
                overrides=job.overrides,
                data="embedded",
                seeds=(job.seed,),
                out=self.runs,
                progress=self.progress,
                cache_dir=self.cache,
                log=self.log,
            )
        seconds = max((r["provenance"]["wall_s"] for r in rows), default=0.0)
        pictures = dict.fromkeys(r["extra"]["picture"] for r in rows if r["extra"].get("picture"))
        values = {r["metric"]: r["value"] for r in rows}
        values |= {
            f"{r['metric']}/stderr": r["stderr"] for r in rows if r.get("stderr") is not None
        }
        return values, seconds, list(pictures)

    def row(self, effect: EffectRow, seed_count: int | None = None) -> dict:
        values, seeds, seconds, drawn = {}, {}, 0.0, []
        for name, measure in effect.measures.items():
            per_seed = []
            for seed in range(self.seeds(measure, seed_count)):
                measured, spent, pictures = self.measure(self.job(effect, measure, seed))
                per_seed.append(measured)
                seconds += spent
                drawn += pictures if seed == 0 else []
            values[name], seeds[name] = over_seeds(per_seed), len(per_seed)
        outcome = effect.judge(values)
        return {
            "row": effect.number,
            "changed": effect.changed,
            "where": effect.where,
            "metric": effect.metric,
            "paper": effect.paper,
            "paper_effect": effect.paper_effect,
            "setup": self.setup(effect),
            "ours": outcome.ours,
            "our_effect": outcome.effect,
            "interval": outcome.interval,
            "stderr": outcome.stderr,
            "agrees": outcome.agrees,
            "note": outcome.note,
            "seeds": seeds,
            "relative": relative(effect, outcome),
            "departures": departures(effect, self.scale),
            "seconds": round(seconds, 1),
            "pictures": self.copy_pictures(effect, drawn) if effect.pictures else [],
            # which ladder a scaling row compared (scale paper: the user's weights, named)
            "ladder_id": dict(self.ladder_id) if effect.scaling and self.ladder_id else None,
            "seed_rule": SEED_RULE,  # how its draws were seeded: a kept row of another says so
        }

    def setup(self, effect: EffectRow) -> str:
        if self.scale.paper:
            if not effect.scaling:
                return "paper settings"
            return " → ".join(self.backbones[m] for m in effect.models)
        if effect.setup:
            return effect.setup.format(timed=self.scale.timed)
        return f"ladder {self.scale.ladder[0]} → {self.scale.ladder[1]}"

    def copy_pictures(self, effect: EffectRow, drawn: list[str]) -> list[str]:
        """The row's pictures copied beside the table (the runs folder is not committed)."""
        names = []
        self.out.mkdir(parents=True, exist_ok=True)
        for drawing in drawn:
            # rows store the path as the run saw it; the file is under this run folder
            path = self.runs / "pictures" / Path(drawing).name
            if path.is_file():
                name = f"effects-{self.scale.name}-row{effect.number}-{path.name}"
                shutil.copyfile(path, self.out / name)
                names.append(name)
        return names


def seed_dependent(measure: Measure) -> bool:
    """Whether more seeds give a measure new information: a ladder size's head or tower
    trained from the seed (not the ablations' own models, not a seed-free fit)."""
    return measure.on != "none" and measure.task not in ONE_SEED


def over_seeds(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """One measure's metrics over its seeds: the mean, and a standard error that adds the
    test items' (the mean of the seeds' variances: the same items every seed) and the seeds'
    spread (their variance over the number of seeds)."""
    if len(per_seed) == 1:
        return per_seed[0]
    out = {}
    for metric in (m for m in per_seed[0] if not m.endswith("/stderr")):
        values = [seed[metric] for seed in per_seed]
        out[metric] = statistics.mean(values)
        out[f"{metric}/seeds"] = len(values)
        items = [seed.get(f"{metric}/stderr") for seed in per_seed]
        if None not in items:
            sampling = statistics.mean(e * e for e in items)
            out[f"{metric}/stderr"] = math.sqrt(
                sampling + statistics.variance(values) / len(values)
            )
    return out


def relative(effect: EffectRow, outcome: Outcome) -> dict:
    """The paper's effect and ours as relative changes in the paper's favourable direction
    (ours with its interval), for the picture; None where a row has no such number."""
    scale = outcome.relative_to
    ours = (
        outcome.effect
        if scale is None
        else (None if outcome.effect is None else outcome.effect / scale)
    )
    interval = outcome.interval
    if interval is not None and scale is not None:
        interval = (interval[0] / scale, interval[1] / scale)
    return {
        "paper": effect.paper_relative,
        "ours": ours if effect.paper_relative is not None else None,
        "interval": interval if effect.paper_relative is not None else None,
    }


def reproduce(
    scale: str,
    *,
    only=None,
    out=Path("results/paper"),
    cache=None,
    progress=False,
    echo=print,
    log=(),
    resolve_budget: float | None = None,
    command: str = "",
) -> list[dict]:
    """Measure every row (or the numbers in ``only``; the table keeps the others' records),
    resolve the rows within noise with ``resolve_budget`` seconds of more seeds where given,
    write the table, return the measured rows' records."""
    if scale == "paper":
        raise EvalkitError("scale paper runs as a sweep: evalkit reproduce --scale paper --dry-run")
    if scale not in SCALES:
        raise EvalkitError(f"unknown scale {scale!r}: choose from {', '.join(SCALES)}")
    effects = selected(only)
    job = Reproduction(SCALES[scale], Path(out), cache, progress, log=tuple(log))
    job.command = command or f"evalkit reproduce --scale {scale}"
    start = time.perf_counter()
    ladder_s = job.pretrain_ladder() if any(r.scaling for r in effects) else 0.0
    return tabulate(job, effects, ladder_s, start, echo, resolve_budget)


def tabulate(
    job: Reproduction,
    effects: list[EffectRow],
    ladder_s: float,
    start: float,
    echo=print,
    resolve_budget: float | None = None,
) -> list[dict]:
    """Every row measured (or read) and judged, resolved where asked, the table written with
    the records of rows measured earlier and not now; the records measured now."""
    records = []
    for effect in effects:
        echo(f"row {effect.number}: {effect.changed} ({effect.where})")
        records.append(job.row(effect))
    summary = {"scale": job.scale.name, "ladder": list(job.scale.ladder)}
    if resolve_budget is not None:
        spent = resolve_rows(job, effects, records, resolve_budget, echo)
        summary |= {"resolve_budget": resolve_budget, "resolve_seconds": round(spent, 1)}
    kept, before = earlier_rows(job, records)
    table = sorted(kept + records, key=lambda r: r["row"])
    if any(OTHER_LADDER in r["note"] for r in kept):
        ladder_s += before.get("ladder_seconds", 0.0)  # the kept rows' ladder cost too
    command = job.command or f"evalkit reproduce --scale {job.scale.name}"
    summary["invocations"] = invocations(before, kept, records, command)
    rows_s = round(sum(r["seconds"] for r in table), 1)
    summary |= {
        "ladder_seconds": ladder_s,
        "rows_seconds": rows_s,
        "compute_seconds": round(ladder_s + rows_s, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "rows": table,
    }
    write_table(summary, job.out)
    return records


def earlier_rows(job: Reproduction, records: list[dict]) -> tuple[list[dict], dict]:
    """The records of the rows an earlier invocation measured and this one did not (``--rows``
    picks some): a table of twelve rows stays one when a few are measured again; and the
    earlier table's summary."""
    path = job.out / f"effects-{job.scale.name}.json"
    if not path.is_file():
        return [], {}
    try:
        before = json.loads(path.read_text())
        earlier = before["rows"]
    except (ValueError, KeyError, TypeError) as error:
        raise EvalkitError(
            f"{path} is not an effect table ({error}): move it away, or measure every row"
        ) from None
    now = {r["row"] for r in records}
    kept = [r for r in earlier if r["row"] not in now]
    for record in kept:
        label_other_rule(record)
        if job.ladder_id:
            label_other_ladder(record, job.ladder_id)
    return kept, before


def invocations(before: dict, kept: list[dict], records: list[dict], command: str) -> list[dict]:
    """Which commands measured the table's rows, oldest first: the earlier table's list (or,
    from a table that kept none, one earlier command), its rows cut to those still kept."""
    still = {r["row"] for r in kept}
    earlier = before.get("invocations") or [
        {"command": f"evalkit reproduce --scale {before.get('scale', '?')}", "rows": sorted(still)}
    ]
    listed = [dict(i, rows=[n for n in i["rows"] if n in still]) for i in earlier]
    now = {"command": command, "rows": [r["row"] for r in records]}
    return [i for i in listed if i["rows"]] + [now]


OTHER_LADDER = "not measured on the ladder of the rows measured last: rerun it to compare on one"


@functools.cache
def scaling_rows() -> frozenset[int]:
    """The numbers of the rows that compare two sizes of the ladder."""
    return frozenset(e.number for e in selected(None) if e.scaling)


def label_other_ladder(record: dict, ladder_id: dict[str, str]) -> None:
    """A kept scaling row measured on other ladder weights than the rows measured now (another
    machine's training, an older version's) says so: two sizes' gap is only comparable on
    one ladder. Rows that train their own models depend on no ladder."""
    other = record["row"] in scaling_rows() and record.get("ladder_id") != ladder_id
    if other and OTHER_LADDER not in record["note"]:
        record["note"] = "; ".join(n for n in (record["note"], OTHER_LADDER) if n)


def label_other_rule(record: dict) -> None:
    """A kept row measured under another seed rule (``evalkit.seeds``; a record without one
    was measured under rule 1, before every draw was named) says so: its numbers came from
    other draws than a row measured now, so the two are not one measurement."""
    rule = record.get("seed_rule", 1)
    note = OTHER_RULE.format(rule=rule, now=SEED_RULE)
    if rule != SEED_RULE and note not in record["note"]:
        record["note"] = "; ".join(n for n in (record["note"], note) if n)


OTHER_RULE = "drawn under seed rule {rule}: rerun it to measure it under rule {now}"
FLOOR = "more seeds cannot change it: its measures fit seed-free models (test items' error only)"
SEVERAL_HEADS = "judged over two heads: --resolve measures rows of one effect"


def resolve_rows(
    job: Reproduction, effects: list[EffectRow], records: list[dict], budget: float, echo
) -> float:
    """``--resolve``: each row within noise whose measures depend on the seed measured again
    with its seeds doubled until decided or ``budget`` seconds are spent
    (``evalkit.reproduction.resolve``); its record takes the last look's numbers. Returns the
    seconds spent."""
    spent = 0.0
    by_number = {e.number: e for e in effects}
    for record in records:
        effect = by_number[record["row"]]
        if record["agrees"] is not None or record.get("interval") is None:
            continue
        if not effect.scaling:
            continue  # the ablations train their own models: their noise is their runs'
        if not any(seed_dependent(m) for m in effect.measures.values()):
            record["note"] = FLOOR
            continue
        if len(effect.measures) > 2:
            record["note"] = SEVERAL_HEADS
            continue
        echo(f"resolving row {effect.number} ({budget - spent:.0f} s of budget left)")
        run, verdict, latest = resolve_one(job, effect, budget - spent)
        spent += run.seconds
        record.update(latest, agrees=verdict, sequential=run.record())
        record["relative"] = rescaled(latest, run.last.interval)
        record["interval"] = list(run.last.interval)
        record["note"] = "" if record["agrees"] is not False else "points against the paper"
    return spent


def resolve_one(job: Reproduction, effect: EffectRow, budget: float):
    from evalkit.reproduction.resolve import resolve

    latest = {}

    def measure(seeds: int) -> tuple[float, float, float]:
        latest.clear()
        latest.update(job.row(effect, seeds))
        return latest["our_effect"], latest["stderr"], latest["seconds"]

    run, verdict = resolve(measure, job.scale.seeds, budget, effect.paper_sign)
    return run, verdict, dict(latest)


def rescaled(record: dict, interval: tuple[float, float]) -> dict:
    """The picture's relative numbers with the row's interval replaced by ``interval`` (the
    relative scale is the effect's divided by the same reference value)."""
    relative = dict(record["relative"])
    low, high = record["interval"]
    if relative.get("interval") is not None and high > low:
        factor = (relative["interval"][1] - relative["interval"][0]) / (high - low)
        relative["interval"] = [v * factor for v in interval]
    return relative
