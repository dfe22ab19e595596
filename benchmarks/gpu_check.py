"""The one device check: what only an accelerator can answer, as one short script (at most 8
minutes on one GPU from a bare machine; its CPU branch runs the same code at small sizes and
runs in CI). ``python -m benchmarks.gpu_check --device DEVICE --out FILE`` writes one JSON:

1. ``families`` — every task family through ``evalkit.run`` on embedded data (task, ok,
   seconds, first metric): a tensor on the wrong side of the host–device boundary, a
   collective on the wrong backend or a kernel the device lacks fails here;
2. ``features_agree`` — the same images through the same weights on the device and on the CPU
   (fp32, TF32 off): largest difference and cosine of the pooled features;
3. ``probe`` — the linear probe on the device against the same probe on the CPU: the same
   chosen L2 and top-1;
4. ``collective`` — a one-rank process group (NCCL on a GPU, gloo on the CPU): an all-reduce,
   and a ``vit22b/test`` forward tensor-parallel (DTensor) and FSDP2-sharded against the plain
   model;
5. ``feeding`` — the loader's steady-state images/s on ImageNet-sized JPEGs by each decoder,
   and from the pixel cache, against a bare forward of the backbone on the device (below 1 the
   device waits), and the decoding cores a GPU needs without the pixel cache;
6. ``extraction`` — evalkit's ``extract`` against a bare forward of the same timm model;
7. ``finetune_step`` — one fine-tuning step under bf16 autocast with fp32 master weights;
8. ``vit22b_forward`` — MFU of a ``vit22b/g`` forward (``vit22b/test`` on the CPU branch)
   against the device's dense bf16 peak, and its peak memory against ``evalkit plan``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

import torch

SIZES = {  # what each branch runs: (timm model, images, probe rows, vit22b size, batch)
    "cuda": ("timm/vit_base_patch16_224", 256, 20_000, "g", 32),
    "cpu": ("timm/vit_tiny_patch16_224", 16, 1_000, "test", 4),
}
SMALL_TRAINING = ["size=test", "image=32", "patch=8", "batch_size=8", "steps=2", "warmup=1"]
FAMILIES = {  # one run per family: (task, backbone, settings)
    "linear probe": ("imagenet-linear", "fake", ["l2_grid=0.1,0.01"]),
    "few-shot": ("imagenet-5shot", "fake", []),
    "kNN": ("imagenet-knn", "fake", []),
    "zero-shot (open_clip)": (
        "zeroshot-imagenet",
        "open_clip/Check-Tiny",
        ["templates=clip_paper"],
    ),
    "LiT": ("lit-imagenet", "fake", ["steps=3", "batch_size=32"]),
    "segmentation": ("ade20k-1/16", "fake", ["steps=2"]),
    "depth": ("waymo-depth-linear", "fake", ["steps=2"]),
    "video": ("kinetics400", "fake", ["steps=2"]),
    "calibration": ("imagenet-ece", "fake", ["l2_grid=0.1"]),
    "shape bias and human alignment": ("model-vs-human", "fake", ["l2_grid=0.1"]),
    "fairness": ("celeba-fairness-smiling", "fake", ["l2_grid=0.1"]),
    "distillation": ("distill-imagenet", "vit22b/test", ["steps=2", "student=test", "l2_grid=0.1"]),
    "fine-tuning": (
        "imagenet-linear",
        "vit22b/test",
        ["finetune=true", "finetune_steps=2", "finetune_batch_size=8"],
    ),
    "stability ablation": ("qk-norm-stability", "none", ["steps=2"]),
    "efficiency ablation": (
        "bias-efficiency",
        "none",
        [*SMALL_TRAINING, "rounds=1", "timed_steps=1"],
    ),
}
# A small open_clip architecture with random weights: the zero-shot family's text and image
# towers on the device, without a download.
CHECK_CLIP = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 96, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def register_check_clip():
    """``open_clip/Check-Tiny``, through open_clip's own config loader."""
    import open_clip

    folder = Path(tempfile.mkdtemp(prefix="evalkit-check-clip-"))
    (folder / "Check-Tiny.json").write_text(json.dumps(CHECK_CLIP))
    open_clip.add_model_config(folder)


def families(device: str, work: Path) -> dict:
    """Every task family on embedded data on ``device``; a failure is recorded, not raised."""
    import evalkit

    register_check_clip()
    os.environ.setdefault("EVALKIT_EMBEDDED_SCENES", "16,8")
    out = {}
    for family, (task, backbone, settings) in FAMILIES.items():
        start = time.perf_counter()
        try:
            rows = evalkit.run(
                task,
                backbone,
                data="embedded",
                device=device,
                out=work / "rows",
                cache_dir=work / "cache",
                progress=False,
                overrides=settings,
                random_init=backbone.startswith("open_clip"),
            )
            entry = {
                "ok": True,
                "metric": rows[0]["metric"],
                "value": rows[0]["value"],
                "device": rows[0]["provenance"]["device"],
            }
        except Exception as exc:  # noqa: BLE001 - the check reports every family, whatever fails
            entry = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "where": traceback.format_exc(limit=-3),
            }
        out[family] = {"task": task, **entry, "seconds": round(time.perf_counter() - start, 1)}
    return out


def features_agree(device: str) -> dict:
    """The same weights and images on ``device`` and on the CPU, in fp32 with TF32 off."""
    from evalkit import load_backbone
    from evalkit.core.numerics import run_numerics

    restore = run_numerics()
    try:
        here = load_backbone(SIZES[device][0], device=device)
        there = load_backbone(SIZES[device][0], device="cpu")
        there.model.load_state_dict(here.model.state_dict())
        images = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            a = here.extract(images.to(device), pool="cls").pooled.cpu()
            b = there.extract(images, pool="cls").pooled
    finally:
        restore()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1).min().item()
    return {
        "max_abs_diff": float(f"{(a - b).abs().max().item():.3g}"),
        "min_cosine": round(cosine, 7),
        "scale": round(b.abs().max().item(), 3),
    }


def collective(device: str) -> dict:
    """A one-rank group on the device's backend: an all-reduce, then a forward of a model
    sharded tensor-parallel and with FSDP2 over one-rank mesh axes, against the plain model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from evalkit.models.vit22b import build, config
    from evalkit.parallel.sharding import apply_fsdp, apply_tensor_parallel

    kind = torch.device(device).type
    backend = "nccl" if kind == "cuda" else "gloo"
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    try:
        total = torch.full((4,), 2.0, device=device)
        dist.all_reduce(total)
        mesh = init_device_mesh(kind, (1, 1), mesh_dim_names=("dp", "tp"))
        plain = build(config("test"), seed=3).to(device).eval()
        sharded = copy.deepcopy(plain)
        apply_tensor_parallel(sharded, mesh["tp"])
        apply_fsdp(sharded, mesh["dp"])
        images = torch.randn(2, 3, 224, 224, device=device)
        with torch.no_grad():
            diff = (sharded(images) - plain(images)).abs().max().item()
    finally:
        dist.destroy_process_group()
    return {
        "backend": backend,
        "all_reduce_ok": bool((total == 2.0).all()),
        "sharded_vs_plain_max_diff": float(f"{diff:.3g}"),
        "ok": diff <= 1e-4,
    }


def feeding(device: str, work: Path) -> dict:
    """The loader's steady-state images/s on ImageNet-sized JPEGs cut from real photos
    (``benchmarks.bench_loader``; workers started before the clock), by each decoder and from
    the pixel cache, against a bare bf16 forward of the timm backbone on the device; and the
    decoding cores a GPU needs to keep up without the pixel cache."""
    from benchmarks.bench_loader import loader_rate, make_jpegs, pixel_cache_rate, view_path
    from evalkit import load_backbone
    from evalkit.device import decode_workers

    backbone = load_backbone(SIZES[device][0], device=device)
    paths = make_jpegs(work / "jpegs", 2000 if device.startswith("cuda") else 192)
    workers = decode_workers(device)
    loader = {d: loader_rate(paths, view_path(d), workers) for d in ("pil", "tensor")}
    cached = pixel_cache_rate(paths[:256], work)["img_per_cpu_s"]
    batch = torch.randn(64, 3, 224, 224, device=device)
    autocast = torch.autocast(torch.device(device).type, torch.bfloat16, enabled=device != "cpu")
    with torch.inference_mode(), autocast:
        seconds = timed(lambda: backbone.model.forward_features(batch), device)
    forward = len(batch) / seconds
    return {
        "workers": workers,
        "images": len(paths),
        "loader_img_s": loader,
        "pixel_cache_img_s_one_core": cached,
        "forward_img_s": round(forward, 1),
        "loader_vs_forward": {d: round(rate / forward, 3) for d, rate in loader.items()},
        "pixel_cache_vs_forward": round(cached / forward, 3),
        "cores_to_keep_up": {d: round(forward / (rate / workers), 1) for d, rate in loader.items()},
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
    return {
        "backbone": name,
        "images": count,
        "throughput_vs_bare": round(ratio, 3),
        "target": "≥ 0.95",
    }


def probe(device: str) -> dict:
    """The probe's selection and refit on seeded features, on ``device`` and on the CPU."""
    from evalkit.heads.linear import Standardizer, fit_logistic, hits, logistic_path
    from evalkit.heads.logistic import FeatureRows
    from evalkit.protocols.classification import DEFAULT_L2, choose_l2, stratified_holdout

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
        held = {
            l2: int(hits(m, FeatureRows.of(xs[held_idx], ys[held_idx]), 1).sum()) for l2, m in path
        }
        l2, init = choose_l2(path, held)
        model = fit_logistic(xs, ys, num_classes=classes, l2=l2, init=init)
        return l2, int(hits(model, FeatureRows.of(xts, yts), 1).sum())

    here, cpu = run(device), run("cpu")
    return {
        "l2": here[0],
        "top1_hits": here[1],
        "cpu_l2": cpu[0],
        "cpu_top1_hits": cpu[1],
        "same": here == cpu,
    }


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
    return {
        "loss": round(loss.item(), 4),
        "finite": bool(torch.isfinite(loss)),
        "seconds": round(time.perf_counter() - start, 3),
    }


def vit22b_forward(device: str) -> dict:
    """MFU and peak memory of a forward of the built-in family, against the plan."""
    from evalkit import load_backbone
    from evalkit.device import peak_tflops
    from evalkit.parallel.sizing import sizing

    _, _, _, size, batch = SIZES[device]
    dtype = "bf16" if device == "cuda" else "fp32"
    backbone = load_backbone(f"vit22b/{size}", device=device, dtype=dtype, random_init=True)
    cfg = backbone.model.cfg
    images = torch.randn(batch, 3, cfg.image, cfg.image, device=device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(lambda: backbone.extract(images.to(getattr(torch, _TORCH[dtype]))), device)
    predicted = sizing(cfg, dtype=dtype)
    flops = predicted.flops_per_image * batch
    peak = peak_tflops(device)
    out = {
        "model": f"vit22b/{size}",
        "batch": batch,
        "tflops_achieved": round(flops / seconds / 1e12, 2),
    }
    out["mfu"] = round(flops / seconds / (peak * 1e12), 3) if peak else "not measured (no GPU)"
    if device == "cuda":
        measured = torch.cuda.max_memory_allocated()
        expected = predicted.bytes_per_rank + batch * predicted.activation_bytes_per_image
        out |= {
            "peak_gb": round(measured / 1e9, 2),
            "plan_gb": round(expected / 1e9, 2),
            "within_15pct": abs(measured / expected - 1) <= 0.15,
        }
    return out


_TORCH = {"bf16": "bfloat16", "fp32": "float32"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, default=Path("results/bench/gpu_check.json"))
    parser.add_argument("--skip", default="", help="checks to leave out, comma-separated")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = args.device
    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    with tempfile.TemporaryDirectory(prefix="evalkit-gpu-check-") as folder:
        work = Path(folder)
        checks = {
            "families": lambda: families(device, work),
            "features_agree": lambda: features_agree(device),
            "probe": lambda: probe(device),
            "collective": lambda: collective(device),
            "feeding": lambda: feeding(device, work),
            "extraction": lambda: extraction(device),
            "finetune_step": lambda: finetune_step(device),
            "vit22b_forward": lambda: vit22b_forward(device),
        }
        skipped = set(filter(None, args.skip.split(",")))
        for name, check in [(n, c) for n, c in checks.items() if n not in skipped]:
            start = time.perf_counter()
            record[name] = check() | {"check_seconds": round(time.perf_counter() - start, 1)}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2))  # what finished survives a crash
    ran = record.get("families", {})
    failed = [name for name, f in ran.items() if name != "check_seconds" and not f["ok"]]
    record["all_families_ok"] = not failed if ran else "not run"
    args.out.write_text(json.dumps(record, indent=2))
    print(
        f"[gpu_check] {device}: families ok {record['all_families_ok']} "
        f"(failed: {', '.join(failed) or 'none'}); written to {args.out}"
    )
    return record


if __name__ == "__main__":
    main()
