"""What two runs of one job share: their rows less the clock and the machine, for the tests
that hold a sharded, merged or copied run equal to the one-process run."""

from __future__ import annotations

import json
from pathlib import Path

VOLATILE = {"time", "wall_s", "images_per_s", "peak_mem_mb", "images_extracted"}


def stable(folder: Path) -> list[dict]:
    """A folder's rows without what differs between two runs of one job (clock, machine)."""
    rows = []
    for file in sorted(folder.glob("*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            row["provenance"] = {k: v for k, v in row["provenance"].items() if k not in VOLATILE}
            rows.append(row)
    return sorted(rows, key=lambda r: (r["task"], r["run_key"], r["metric"]))
