"""The regression gate's rows: small backbones on embedded data, fast enough for every CI run
(its time on a 2-core CPU is the README's one figure), compared two-sided with ``results/baselines/gate`` at the
tolerances of ``results/baselines/tolerances.toml``.

Backbones: ``fake``, a random-init ``timm/vit_tiny_patch16_224`` and ``vit22b/test`` trained on
the embedded data (``vit22b-test.safetensors`` here); tasks: the linear probe, 5-shot and kNN on
each, one dense row (ADE20k 1/16, linear head) and one zero-shot row (LiT, trained on the
embedded captions). Run: ``python tests/regression/gate.py OUT`` writes the rows under OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
TRAINED = HERE / "vit22b-test.safetensors"
BASELINES = HERE.parents[1] / "results" / "baselines" / "gate"
TOLERANCES = HERE.parents[1] / "results" / "baselines" / "tolerances.toml"
PROBES = ("imagenet-linear", "imagenet-5shot", "imagenet-knn")
JOBS = (
    {"tasks": PROBES, "backbones": ["fake", "timm/vit_tiny_patch16_224"]},
    {"tasks": PROBES, "backbones": "vit22b/test", "weights": str(TRAINED)},
    {"tasks": ["ade20k-1/16", "lit-imagenet"], "backbones": "vit22b/test", "weights": str(TRAINED)},
)


def run_rows(out: Path, cache_dir: Path | None = None) -> None:
    import evalkit

    for job in JOBS:
        evalkit.run(**job, data="embedded", out=out, cache_dir=cache_dir, progress=False)


if __name__ == "__main__":
    run_rows(Path(sys.argv[1]))
