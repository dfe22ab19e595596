"""How far one injected fault moves the regression suite's numbers, per regression backbone:
images reach the backbone without their normalisation (a one-line preprocessing bug). The
baseline is each backbone's clean run in the same process; a backbone whose numbers barely
move under the fault makes a weak regression gate. The trained regression ViT
(``tests/regression/``) is compared with the random-init backbones.

Run: ``python -m benchmarks.fault_sensitivity`` (a few minutes on a CPU).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from torchvision import transforms as T

import evalkit
from benchmarks.common import report

TASKS = ("imagenet-linear", "imagenet-5shot")
TRAINED = Path(__file__).parents[1] / "tests" / "regression" / "vit22b-test.safetensors"
BACKBONES = {
    "fake": {},
    "timm/vit_tiny_patch16_224": {},
    "vit22b/test (random)": {"backbones": "vit22b/test"},
    "vit22b/test (trained)": {"backbones": "vit22b/test", "weights": str(TRAINED)},
}
MODULES = ("evalkit.backbones.fake", "evalkit.backbones.timm_backbone", "evalkit.backbones.vit22b")


def no_normalise(pre, *, train=False, square=False):
    return T.Compose([T.Resize(pre.size), T.CenterCrop(pre.size), T.ToTensor()])


def values(label: str, options: dict, out: Path, cache: Path) -> dict:
    options = {"backbones": label, **options}
    rows = evalkit.run(TASKS, data="embedded", out=out, cache_dir=cache, progress=False, **options)
    return {f"{r['task']} {r['metric']}": r["value"] for r in rows}


def main():
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for label, options in BACKBONES.items():
            clean = values(label, options, tmp / "clean", tmp / "cache")
            patches = [mock.patch(f"{m}.build_transform", no_normalise) for m in MODULES]
            for patch in patches:
                patch.start()
            try:
                faulty = values(label, options, tmp / "faulty", tmp / "cache")
            finally:
                for patch in patches:
                    patch.stop()
            moves = {k: round(faulty[k] - clean[k], 2) for k in clean}
            record[label] = {
                "moves": moves,
                "mean_abs_move": round(sum(map(abs, moves.values())) / len(moves), 2),
            }
    random = [v["mean_abs_move"] for k, v in record.items() if "trained" not in k]
    trained = record["vit22b/test (trained)"]["mean_abs_move"]
    record["trained_vs_random_mean"] = round(trained / (sum(random) / len(random)), 2)
    report("fault_sensitivity", record)


if __name__ == "__main__":
    main()
