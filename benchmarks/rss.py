"""``evalkit <argv>`` (any command), then this process's peak RSS written as
``$EVALKIT_RSS_DIR/rss-<rank>.json`` (the memory benchmarks run it alone and under torchrun)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from evalkit.cli import main

# Run as a script (also under torchrun): the repository root is not on the path by itself
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import peak_rss_mb  # noqa: E402

if __name__ == "__main__":
    code = main(sys.argv[1:])
    peak_mb = peak_rss_mb()
    rank = os.environ.get("RANK", "0")
    folder = Path(os.environ["EVALKIT_RSS_DIR"])
    (folder / f"rss-{rank}.json").write_text(json.dumps({"max_rss_mb": peak_mb}))
    sys.exit(code)
