"""Run under ``torchrun --nproc-per-node 2`` (gloo, CPU) by tests/test_parallel.py.

Checks every sharded layout against the unsharded model and writes what it measured as JSON
(rank 0) to the path in argv[1]; the test asserts on that file. argv[2] is a sharded
safetensors checkpoint of ``vit22b/test`` written by the test.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from evalkit import distributed as mesh
from evalkit.models.vit22b import ViT, build, config, init_value
from evalkit.parallel.load import RandomSource, materialize
from evalkit.parallel.sharding import apply_fsdp, apply_tensor_parallel
from evalkit.storage.checkpoints import SafetensorsSource

SWITCHES = {
    "default": {},
    "sequential": {"parallel": False},
    "no_qk_norm": {"qk_norm": False},
    "biases": {"qkv_bias": True, "ln_bias": True, "norm": "layer"},
    "timm_like": {"pool": "cls", "norm": "rms", "pre_norm": True, "patch_bias": False},
}


def sharded(cfg, layout, source, *, tp: bool, fsdp: bool) -> ViT:
    with torch.device("meta"):
        model = ViT(cfg)
    if tp:
        apply_tensor_parallel(model, layout.mesh["tp"])
    if fsdp:
        apply_fsdp(model, layout.mesh["dp"])
    model.to_empty(device="cpu")
    return materialize(model, source).eval().requires_grad_(False)


def local_bytes(model) -> int:
    def size(p):
        t = p.to_local() if isinstance(p, DTensor) else p
        return t.numel() * t.element_size()

    return sum(size(p) for p in model.parameters())


def tensor_parallel(layout, images) -> dict:
    out = {}
    for name, switches in SWITCHES.items():
        cfg = config("test", **switches)
        reference = build(cfg, seed=5).eval().requires_grad_(False)
        model = sharded(cfg, layout, RandomSource(init_value, 5), tp=True, fsdp=False)
        with torch.no_grad(), CommDebugMode() as comm:
            pooled = model(images)
        with torch.no_grad():
            expected = reference(images)
            tokens = model.forward_layers(images, [1, 3])
            expected_tokens = reference.forward_layers(images, [1, 3])
        out[name] = {
            "max_err": (pooled - expected).abs().max().item(),
            "max_err_tokens": max(
                (a - b).abs().max().item() for a, b in zip(tokens, expected_tokens, strict=True)
            ),
            "all_reduces": comm.get_total_counts(),
            "depth": cfg.depth,
            "bytes_ratio": local_bytes(model) / local_bytes(reference),
        }
    return out


def backbone_under_inference_mode(images) -> dict:
    """The adapter as feature extraction calls it: inference_mode, sharded by the layout."""
    from evalkit.backbones import BackboneOptions, load_backbone

    backbone = load_backbone("vit22b/test", BackboneOptions(seed=5))
    with torch.inference_mode(), CommDebugMode() as comm:
        pooled = backbone.extract(images, layers=(-1,), pool="map").pooled
    expected = build(config("test"), seed=5).eval()(images)
    return {
        "max_err": (pooled - expected).abs().max().item(),
        "comms": {str(k): v for k, v in comm.get_comm_counts().items()},
    }


def checkpoint_layouts(layout, images, path: str) -> dict:
    source = SafetensorsSource(path)
    cfg = config("test")
    reference = sharded(cfg, mesh.Layout(), source, tp=False, fsdp=False)
    with torch.inference_mode():
        expected = reference(images)
    errors = {}
    for name, tp, fsdp in (("tp", True, False), ("fsdp", False, True)):
        sub = mesh.Layout(
            mesh=layout.mesh if tp else _dp_mesh(layout),
            tp_size=2 if tp else 1,
            dp_size=1 if tp else 2,
        )
        model = sharded(cfg, sub, source, tp=tp, fsdp=fsdp)
        with torch.no_grad():
            errors[name] = (model(images) - expected).abs().max().item()
    return errors


def _dp_mesh(layout):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))


def main():
    layout = mesh.setup(2)
    torch.manual_seed(0)
    images = torch.randn(2, 3, 224, 224)
    result = {
        "tensor_parallel": tensor_parallel(layout, images),
        "checkpoint": checkpoint_layouts(layout, images, sys.argv[2]),
        "backbone": backbone_under_inference_mode(images),
    }
    if layout.main:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    mesh.teardown()


if __name__ == "__main__":
    main()
