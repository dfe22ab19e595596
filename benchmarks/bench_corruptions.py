"""ImageNet-C corruptions: images/s of each of the 15 at severity 3 on 224-px images, in
batches of 32 per call and, as the baseline, one image per call (how a per-image port such as
the original generation script runs). On a CPU batching gains little (the work is memory-bound;
the ratio is near 1 and below it for the cheapest corruptions); what matters is that no
corruption is a Python pixel loop: the slowest one is reported (the original's glass_blur
managed about 1 image/s on this kind of machine)."""

from __future__ import annotations

import numpy as np

from benchmarks.common import best_time, report
from evalkit.data.corruptions import NAMES, corrupt

BATCH, SIZE = 32, 224


def images() -> np.ndarray:
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(0)
    noise = (rng.random((BATCH, SIZE, SIZE, 3)) * 255).astype(np.uint8)
    return np.stack(
        [np.asarray(Image.fromarray(a).filter(ImageFilter.GaussianBlur(2))) for a in noise]
    )


def main():
    batch = images()
    record = {}
    for name in NAMES:
        batched = BATCH / best_time(lambda n=name: corrupt(batch, n, 3), repeats=2)
        single = 4 / best_time(
            lambda n=name: [corrupt(batch[i], n, 3) for i in range(4)], repeats=2
        )
        record[name] = {
            "batched_img_s": round(batched, 1),
            "per_image_img_s": round(single, 1),
            "ratio": round(batched / single, 2),
        }
    slowest = min(record, key=lambda n: record[n]["batched_img_s"])
    report(
        "corruptions",
        {
            "size": SIZE,
            "batch": BATCH,
            "slowest": slowest,
            "slowest_img_s": record[slowest]["batched_img_s"],
            **record,
        },
    )


if __name__ == "__main__":
    main()
