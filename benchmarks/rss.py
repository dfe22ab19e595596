"""``evalkit <argv>`` (any command), then this process's peak RSS written as
``$EVALKIT_RSS_DIR/rss-<rank>.json`` (the memory benchmarks run it alone and under torchrun)."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

from evalkit.cli import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rank = os.environ.get("RANK", "0")
    folder = Path(os.environ["EVALKIT_RSS_DIR"])
    (folder / f"rss-{rank}.json").write_text(json.dumps({"max_rss_mb": peak_mb}))
    sys.exit(code)
