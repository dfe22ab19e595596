"""The regression gate (``evalkit compare``, docs/regression.md): baseline and new rows matched by
repeat key (the run, seeds apart) on the seeds both ran, each metric's change against its tolerance, and the verdicts as
text, a JUnit report and GitHub Actions annotations.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from pathlib import Path
from typing import Any

from evalkit.core.labels import repeat_key, repeat_labels
from evalkit.core.results import Row
from evalkit.core.tables import aggregate
from evalkit.errors import EvalkitError


class Tolerances:
    """Allowed change per metric: ``"task:metric"`` glob patterns (the first match wins) to an
    absolute tolerance in the metric's units or a share of the baseline (``"10%"``); metrics
    no pattern matches get ``default``. Read from TOML (``BASE/tolerances.toml``)."""

    def __init__(self, default: float, patterns: dict[str, float | str] | None = None):
        self.default = default
        # parsed up front, so a bad entry is refused before anything is compared
        self.rules = [(p, *self._parse(p, v)) for p, v in (patterns or {}).items()]

    @classmethod
    def read(cls, path: Path, default: float) -> Tolerances:
        import tomllib

        try:
            return cls(default, tomllib.loads(Path(path).read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise EvalkitError(f"tolerances {path} are not valid TOML: {exc}") from None

    def allowed(self, task: str, metric: str, base: float) -> float:
        for pattern, amount, relative in self.rules:
            if fnmatch.fnmatchcase(f"{task}:{metric}", pattern):
                return amount * abs(base) if relative else amount
        return self.default

    @staticmethod
    def _parse(pattern: str, value) -> tuple[float, bool]:
        """(amount, relative) of one entry: a number ≥ 0, or a percentage ``"N%"``."""
        text = str(value).strip()
        try:
            amount = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            amount = -1.0
        if amount < 0 or isinstance(value, bool):
            raise EvalkitError(f"tolerance {pattern!r} = {value!r}: expected a number ≥ 0 or 'N%'")
        return amount, text.endswith("%")


def compare(
    base: list[Row], new: list[Row], *, tolerance: float | Tolerances, one_sided: bool = False
) -> list[dict[str, Any]]:
    """Per (task, backbone, metric): base, new, delta and a status — ``ok``, ``regression``
    (worse by more than the metric's tolerance, in its units), ``changed-up`` (better by more
    than that: a change the baseline does not explain, which fails the gate too), or with
    ``one_sided`` ``improved`` (tolerated); ``missing`` and ``new`` for rows on one side only.

    Seeds are part of what is compared: where the two sides ran different seed sets, both
    are cut to the seeds they share (a mean of seeds 0 and 1 is never set against seed 0
    alone), and each record's ``seeds`` says which seeds it compares."""
    if not isinstance(tolerance, Tolerances):
        tolerance = Tolerances(tolerance)

    labels = repeat_labels([*base, *new])  # one naming for both sides: what differs shows
    base, new, seeds = on_shared_seeds(base, new)

    def index(rows):
        return {(r["spec"], r["metric"]): r for r in aggregate(rows, labels)}

    base_idx, new_idx = index(base), index(new)
    out = []
    for key in sorted(base_idx.keys() | new_idx.keys()):
        b, n = base_idx.get(key), new_idx.get(key)
        rec = {
            "task": key[0][0],
            "dataset": (b or n)["dataset"],
            "backbone": (b or n)["backbone"],
            "metric": key[1],
            "base": b["mean"] if b else None,
            "new": n["mean"] if n else None,
            "delta": None,
            "allowed": None,
            "spec": key[0],
            "seeds": seeds.get((key[0], key[1]), ""),
            "higher_is_better": (b or n)["higher_is_better"],
        }
        if b is None:
            rec["status"] = "new"
        elif n is None:
            rec["status"] = "missing"
        else:
            rec["delta"] = n["mean"] - b["mean"]
            gain = rec["delta"] if b["higher_is_better"] else -rec["delta"]
            up = "improved" if one_sided else "changed-up"
            allowed = rec["allowed"] = tolerance.allowed(rec["task"], rec["metric"], b["mean"])
            rec["status"] = "regression" if gain < -allowed else (up if gain > allowed else "ok")
        out.append(rec)
    return out


def on_shared_seeds(base: list[Row], new: list[Row]) -> tuple[list[Row], list[Row], dict]:
    """Both sides' rows cut, per (repeat key, metric), to the seeds both ran, and what each
    comparison is made on: ``"0, 1"`` where the seed sets agree, ``"base seeds 0, 1; new seed
    0: compared on seed 0"`` where they differ. Sides with no seed in common keep all their
    rows (their means are compared) and say so."""
    found: dict[tuple, list[set]] = defaultdict(lambda: [set(), set()])
    for side, rows in enumerate((base, new)):
        for row in rows:
            found[(repeat_key(row), row["metric"])][side].add(row.get("seed", 0))
    kept: dict[tuple, set] = {}
    said = {}
    for key, (ran_base, ran_new) in found.items():
        shared = ran_base & ran_new
        kept[key] = shared or ran_base | ran_new
        said[key] = _seeds_said(ran_base, ran_new, shared)

    def cut(rows):
        return [r for r in rows if r.get("seed", 0) in kept[(repeat_key(r), r["metric"])]]

    return cut(base), cut(new), said


def _seeds_said(ran_base: set, ran_new: set, shared: set) -> str:
    def named(seeds: set) -> str:
        return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, sorted(seeds)))

    if ran_base == ran_new or not (ran_base and ran_new):
        return ", ".join(map(str, sorted(ran_base | ran_new)))
    sides = f"base {named(ran_base)}; new {named(ran_new)}"
    if not shared:
        return f"{sides}: no seed in common, their means compared"
    return f"{sides}: compared on {named(shared)}"


FAILING = ("regression", "changed-up", "missing")  # statuses that fail the gate


def describe(rec: dict[str, Any]) -> str:
    """One line for a compared metric: what it was, what it is, what was allowed."""
    if rec["status"] == "missing":
        return f"{rec['status']}: baseline {rec['base']:.4g}, no new row"
    if rec["status"] == "new":
        return f"new: {rec['new']:.4g}, no baseline"
    return (
        f"{rec['status']}: baseline {rec['base']:.4g}, new {rec['new']:.4g}, "
        f"delta {rec['delta']:+.4g}, tolerance ±{rec['allowed']:.4g}"
    )


def junit_xml(records: list[dict[str, Any]]) -> str:
    """A JUnit report: one test case per compared metric (suite = task), a failure for each
    status that fails the gate, with baseline, value and tolerance in its message."""
    from xml.etree import ElementTree as ET

    suites = ET.Element("testsuites", name="evalkit compare")
    by_task: dict[str, ET.Element] = {}
    for rec in records:
        suite = by_task.get(rec["task"])
        if suite is None:
            suite = by_task[rec["task"]] = ET.SubElement(suites, "testsuite", name=rec["task"])
        case = ET.SubElement(
            suite, "testcase", classname=rec["task"], name=f"{rec['backbone']} {rec['metric']}"
        )
        if rec["status"] in FAILING:
            ET.SubElement(case, "failure", message=describe(rec), type=rec["status"])
    for suite in suites:
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(sum(1 for case in suite if len(case))))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def github_annotations(records: list[dict[str, Any]]) -> str:
    """GitHub Actions workflow commands: an ``::error`` per failing metric."""
    lines = []
    for rec in records:
        if rec["status"] in FAILING:
            title = f"{rec['task']} {rec['backbone']} {rec['metric']}"
            lines.append(f"::error title={_escape(title, True)}::{_escape(describe(rec), False)}")
    return "".join(line + "\n" for line in lines)


def _escape(text: str, property_value: bool) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text
