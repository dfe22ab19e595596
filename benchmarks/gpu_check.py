"""The checks only an accelerator can answer, as one short script (at most 8 minutes on one
GPU; its CPU branch runs the same code at test sizes in seconds, and the tests run it):

1. extraction throughput — evalkit's ``extract`` (bf16 autocast, the model's SDPA attention)
   against a bare forward of the same timm model on the same batch (baseline);
2. the linear probe on the device against the same probe on the CPU: the same chosen L2 and
   top-1 (the probe is float64 and pinned to its optimum, so they must agree);
3. one fine-tuning step with bf16 autocast (trainable copy, layer-wise groups): finite loss;
4. model FLOPs utilisation of a ``vit22b/g`` forward (``vit22b/test`` on the CPU branch) against
   the device's dense bf16 peak;
5. peak device memory of that forward against what ``evalkit plan`` predicts for the
   extraction stage (weights plus the stage's device bytes): within 15%.

Run: ``python -m benchmarks.gpu_check [--device cuda]``; writes results/bench/gpu_check.json.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import report

SIZES = {  # what each branch runs: (timm model, images, probe rows, vit22b size, batch)
    "cuda": ("timm/vit_base_patch16_224", 256, 20_000, "g", 32),
    "cpu": ("timm/vit_tiny_patch16_224", 16, 1_000, "test", 4),
}


def timed(fn, device: str, repeats: int = 3) -> float:
    """Best wall time of ``fn`` over ``repeats`` after one warm-up, synchronised on CUDA."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def extraction(device: str) -> dict:
    from evalkit import load_backbone

    name, count, *_ = SIZES[device]
    backbone = load_backbone(name, device=device)
    images = torch.randn(count, 3, 224, 224, device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def ours():
        with torch.inference_mode(), autocast:
            backbone.extract(images, pool="cls")

    def bare():
        with torch.inference_mode(), autocast:
            backbone.model.forward_features(images)

    ratio = timed(bare, device) / timed(ours, device)
    return {"backbone": name, "images": count, "throughput_vs_bare": round(ratio, 3),
            "target": "≥ 0.95"}  # fmt: skip


def probe(device: str) -> dict:
    """The probe's selection and refit on seeded features, on ``device`` and on the CPU."""
    from evalkit.heads.linear import Rows, Standardizer, fit_logistic, hits, logistic_path
    from evalkit.tasks.linear_probe import DEFAULT_L2, choose_l2, stratified_holdout

    rows = SIZES[device][2]
    generator = torch.Generator().manual_seed(0)
    classes = 50
    means = torch.randn(classes, 128, generator=generator)
    y = torch.randint(0, classes, (rows,), generator=generator)
    x = means[y] + 2.0 * torch.randn(rows, 128, generator=generator)
    yt = torch.randint(0, classes, (rows // 4,), generator=generator)
    xt = means[yt] + 2.0 * torch.randn(rows // 4, 128, generator=generator)

    def run(where: str) -> tuple[float, int]:
        scale = Standardizer.fit(x)
        xs, xts, ys, yts = scale(x).to(where), scale(xt).to(where), y.to(where), yt.to(where)
        fit_idx, held_idx = stratified_holdout(y, 0.2, seed=0)
        path = logistic_path(xs[fit_idx], ys[fit_idx], num_classes=classes, l2_values=DEFAULT_L2)
        held = {l2: int(hits(m, Rows.of(xs[held_idx], ys[held_idx]), 1).sum()) for l2, m in path}
        l2, init = choose_l2(path, held)
        model = fit_logistic(xs, ys, num_classes=classes, l2=l2, init=init)
        return l2, int(hits(model, Rows.of(xts, yts), 1).sum())

    here, cpu = run(device), run("cpu")
    return {"l2": here[0], "top1_hits": here[1], "cpu_l2": cpu[0], "cpu_top1_hits": cpu[1],
            "same": here == cpu}  # fmt: skip


def finetune_step(device: str) -> dict:
    from evalkit import load_backbone
    from evalkit.training.finetune import EndToEnd, decayed_groups, trainable_copy

    backbone = trainable_copy(load_backbone(SIZES[device][0], device=device))
    head = torch.nn.Linear(backbone.info.embed_dim, 10).to(device)
    model = EndToEnd(backbone, head, layers=(-1,), pool="cls", dense=False)
    groups = decayed_groups(model.tower, head, depth=backbone.info.depth, decay=0.75)
    optimizer = torch.optim.AdamW([{"params": g["params"]} for g in groups], lr=1e-4)
    images = torch.randn(8, 3, 224, 224, device=device)
    labels = torch.arange(8, device=device) % 10
    start = time.perf_counter()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return {"loss": round(loss.item(), 4), "finite": bool(torch.isfinite(loss)),
            "seconds": round(time.perf_counter() - start, 3)}  # fmt: skip


def vit22b_forward(device: str) -> dict:
    """MFU and peak memory of a forward of the built-in family, against the plan."""
    from evalkit import load_backbone
    from evalkit.parallel.planner import plan
    from evalkit.tasks.efficiency import device_peak_tflops

    _, _, _, size, batch = SIZES[device]
    dtype = "bf16" if device == "cuda" else "fp32"
    backbone = load_backbone(f"vit22b/{size}", device=device, dtype=dtype, random_init=True)
    cfg = backbone.model.cfg
    images = torch.randn(batch, 3, cfg.image, cfg.image, device=device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(lambda: backbone.extract(images.to(getattr(torch, _TORCH[dtype]))), device)
    predicted = plan(cfg, dtype=dtype)
    flops = predicted.flops_per_image * batch
    peak = device_peak_tflops(device)
    out = {
        "model": f"vit22b/{size}",
        "batch": batch,
        "tflops_achieved": round(flops / seconds / 1e12, 2),
    }
    out["mfu"] = round(flops / seconds / (peak * 1e12), 3) if peak else "not measured (no GPU)"
    if device == "cuda":
        measured = torch.cuda.max_memory_allocated()
        expected = predicted.bytes_per_rank + batch * predicted.activation_bytes_per_image
        out |= {"peak_gb": round(measured / 1e9, 2), "plan_gb": round(expected / 1e9, 2),
                "within_15pct": abs(measured / expected - 1) <= 0.15}  # fmt: skip
    return out


_TORCH = {"bf16": "bfloat16", "fp32": "float32"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    record = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    for check in (extraction, probe, finetune_step, vit22b_forward):
        start = time.perf_counter()
        record[check.__name__] = check(args.device) | {
            "check_seconds": round(time.perf_counter() - start, 1)
        }
    report("gpu_check", record)
    return record


if __name__ == "__main__":
    main()
