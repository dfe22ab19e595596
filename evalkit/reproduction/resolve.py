"""How each effect-table row ends, and how a row within noise is resolved by adding seeds
(``evalkit reproduce --resolve BUDGET``; docs/protocols.md, "Effect table").

Every row ends as one of three things: it **agrees** with the paper, it **disagrees**, or it
shows **no effect larger than X** — X the larger end, in absolute value, of its interval, so
an effect beyond ±X is ruled out at the interval's level (an equivalence statement at margin
X, never a bare "within noise"). Each row with an interval also states its minimum detectable
effect: the true effect its test finds 80% of the time, (z₁₋α/₂ + z₀.₈)·se, the standard error
read from the interval's half-width.

``--resolve`` measures a row within noise again with more seeds, one batch at a time (the
seed count doubled), and judges it after each batch. Testing at 5% after every batch and
stopping at the first interval that leaves out zero would decide a row with no effect far
more often than 5% (optional stopping). Look k is therefore held to α_k = α/(k(k+1)), which
sums to α over any number of looks (α/2 + α/6 + α/12 + … = α): by the union bound the chance
that *any* look's interval misses the true effect — a false "agrees" or "disagrees", or a
margin that does not hold — stays ≤ α whatever the stopping rule and however the looks depend
on each other. This is alpha spending (Lan and DeMets, "Discrete sequential boundaries for
clinical trials", Biometrika 70(3), 1983) with the spending fixed in advance and the looks
combined by Bonferroni's inequality instead of their exact joint boundary: conservative,
never anti-conservative. A look's quantile is Student's t with seeds − 1 degrees of freedom
(the seeds' spread is estimated from that many; a row of one seed per measure has the test
items' error alone, a normal quantile).

A row stops when its interval at α_k leaves out zero (decided), when seeds cannot change it
(every measure fits a seed-free model: fixed features, one fine-tuning), or when the next batch
would overspend the budget; it then ends at its last look's margin, which the same bound
covers. The test items stay the same at this scale (the embedded stand-ins): their error is a
floor no number of seeds removes, and a row held there says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evalkit.power import Z975

LEVEL = 0.05
POWER_Z = 0.8416212335729143  # z₀.₈: the 80% power of every stated MDE


def look_level(look: int, level: float = LEVEL) -> float:
    """The two-sided level look ``look`` (1, 2, …) is held to: α/(k(k+1)), summing to α."""
    return level / (look * (look + 1))


def quantile(level: float, seeds: int) -> float:
    """The two-sided critical value at ``level``: Student's t with seeds − 1 degrees of
    freedom where the error includes a spread over ≥ 2 seeds, else normal."""
    from scipy.special import ndtri, stdtrit

    if seeds >= 2:
        return float(stdtrit(seeds - 1, 1 - level / 2))
    return float(ndtri(1 - level / 2))


def margin(interval: tuple[float, float]) -> float:
    """The largest effect an interval leaves possible, in absolute value."""
    return max(abs(interval[0]), abs(interval[1]))


def detectable(interval: tuple[float, float], stderr: float | None = None) -> float:
    """The MDE of the test behind an interval of half-width c·se: (c + z₀.₈)·se, the half-width
    plus z₀.₈ standard errors (se read as half-width / 1.96 where a row recorded none)."""
    half = (interval[1] - interval[0]) / 2
    return half + POWER_Z * (stderr if stderr is not None else half / Z975)


def decided(interval: tuple[float, float], paper_sign: int) -> bool | None:
    """Agrees (True) or disagrees (False) when the interval leaves out zero; else None."""
    low, high = interval
    if low <= 0 <= high:
        return None
    return (low > 0) == (paper_sign > 0)


@dataclass(frozen=True)
class Look:
    """One judgement: the seeds per seed-dependent measure, the effect, its standard error and
    the interval at the look's spent level."""

    look: int
    seeds: int
    effect: float
    stderr: float
    level: float
    interval: tuple[float, float]

    def record(self) -> dict:
        return {
            "look": self.look,
            "seeds": self.seeds,
            "effect": self.effect,
            "stderr": self.stderr,
            "level": self.level,
            "interval": list(self.interval),
        }


def judge_look(look: int, seeds: int, effect: float, stderr: float) -> Look:
    level = look_level(look)
    half = quantile(level, seeds) * stderr
    return Look(look, seeds, effect, stderr, level, (effect - half, effect + half))


@dataclass
class Sequential:
    """A row's sequential resolution: its looks, how it ended and the compute it spent."""

    looks: list[Look] = field(default_factory=list)
    stopped: str = ""
    seconds: float = 0.0

    @property
    def last(self) -> Look:
        return self.looks[-1]

    def record(self) -> dict:
        return {
            "method": "alpha spending α/(k(k+1)) per look, Bonferroni over looks "
            "(Lan & DeMets 1983)",
            "looks": [look.record() for look in self.looks],
            "stopped": self.stopped,
            "seconds": round(self.seconds, 1),
        }


# measure a row with this many seeds → (effect, standard error, the seconds all its seeds'
# runs took when they ran: a seed measured before is reused and costs nothing now)
MeasureRow = Callable[[int], tuple[float, float, float]]


def resolve(
    measure: MeasureRow, start: int, budget: float, paper_sign: int
) -> tuple[Sequential, bool | None]:
    """Look at ``start`` seeds, then double them while the row is undecided and the next batch
    fits in ``budget`` seconds (its cost extrapolated from the last
    batch's seconds per seed). Returns the looks and the verdict (None: no effect beyond the margin)."""
    run = Sequential()
    seeds, first, before = start, None, (0, 0.0)
    while True:
        effect, stderr, seconds = measure(seeds)
        first = seconds if first is None else first  # the first look is the table's own
        run.seconds = seconds - first
        # the last batch's cost per seed: a first seed also pays for what later ones reuse
        cost_per_seed = (seconds - before[1]) / (seeds - before[0])
        before = (seeds, seconds)
        run.looks.append(judge_look(len(run.looks) + 1, seeds, effect, stderr))
        verdict = decided(run.last.interval, paper_sign)
        if verdict is not None:
            run.stopped = f"decided at look {run.last.look}"
            return run, verdict
        if run.seconds + cost_per_seed * seeds > budget:
            run.stopped = f"budget: {seeds} more seeds would need ~{cost_per_seed * seeds:.0f} s"
            return run, None
        seeds *= 2


def resolution_text(record: dict) -> str:
    """A row's end in words: agrees, disagrees, or no effect larger than X — with its MDE, and
    the look it was decided at where ``--resolve`` measured it."""
    verdict, interval = record["agrees"], record.get("interval")
    sequential = record.get("sequential")
    last = sequential["looks"][-1] if sequential else None
    if verdict is not None and interval is None:
        return ("agrees" if verdict else "disagrees") + " with the paper, no noise estimate"
    if verdict is True:
        text = "agrees with the paper"
    elif verdict is False:
        text = "disagrees with the paper"
    elif interval is None:
        return "undecided: no uncertainty measured"
    else:
        text = f"no effect larger than ±{record_number(margin(interval))}"
    if interval is not None:
        shown = detectable(interval, record.get("stderr"))
        text += f"; would detect ≥ {record_number(shown)} 80% of the time"
    if last:
        text += (
            f" (sequential, look {last['look']} at {last['seeds']} seeds, "
            f"look level {last['level']:.2g}; {sequential['stopped']})"
        )
    return text


def record_number(value: float) -> str:
    return f"{value:.3g}"
