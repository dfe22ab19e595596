"""A stand-in CUDA device for a machine without a GPU, to find device mistakes in CPU tests.

Inside ``fake_cuda()``, a tensor sent to ``cuda`` (``.to("cuda")``, ``.cuda()``, a factory
with ``device="cuda"``, a module's ``.to("cuda")``) stays in CPU memory but is marked as on
the device, and ``x.device`` says ``cuda:0``; every torch operation then applies CUDA's rules:
tensors of one operation must share a device (a CPU scalar, 0-dim, may join CUDA tensors, as
on CUDA), a CPU tensor cannot be indexed by CUDA indices, ``.numpy()`` of a CUDA tensor fails,
and the results of an operation on CUDA tensors are CUDA tensors. ``torch.cuda`` answers as one
device would; ``torch.distributed`` collectives demand CUDA tensors, as NCCL does. So a task or
trainer that would crash on a GPU because a tensor is on the wrong side fails here with the
same message, and one that runs here moves its tensors as a GPU run needs.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

MARK = "_on_fake_cuda"
DEVICE = torch.device("cuda", 0)
# Operations that take tensors on two devices by design.
CROSSING = {
    "copy_",
    "to",
    "cuda",
    "cpu",
    "pin_memory",
    "__set__",
    "__get__",
    "_has_compatible_shallow_copy_type",
    "set_",
    "is_pinned",
    "_parse_to",
    "is_floating_point",
    "dim",
    "size",
    "numel",
    "__len__",
}


def on_cuda(value) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, MARK, False)


def mark(value, flag: bool = True):
    if isinstance(value, torch.Tensor):
        with contextlib.suppress(AttributeError, RuntimeError):
            setattr(value, MARK, flag)
    elif isinstance(value, (tuple, list)):
        for item in value:
            mark(item, flag)
    return value


def tensors_in(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from tensors_in(value)
        elif isinstance(value, dict):
            yield from tensors_in(value.values())


def is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


def is_cpu_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cpu"
    return isinstance(device, str) and device.startswith("cpu")


def target_device(args, kwargs):
    """Where ``Tensor.to(...)`` sends a tensor: cuda, cpu, or None (a dtype change only)."""
    for value in (kwargs.get("device"), *args[1:]):
        if isinstance(value, torch.Tensor):
            return "cuda" if on_cuda(value) else "cpu"
        if is_cuda_device(value):
            return "cuda"
        if is_cpu_device(value):
            return "cpu"
    return None


def strip_device(args, kwargs):
    args = tuple("cpu" if is_cuda_device(a) else a for a in args)
    kwargs = {k: ("cpu" if k == "device" and is_cuda_device(v) else v) for k, v in kwargs.items()}
    return args, kwargs


class DeviceMismatch(RuntimeError):
    pass


class FakeCuda(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            return self.attribute(func, args)
        if name == "__set__":
            result = func(*args, **kwargs)
            if getattr(func.__self__, "__name__", "") == "data" and len(args) > 1:
                mark(args[0], on_cuda(args[1]))  # a module moved by ``param.data = moved``
            return result
        if name in ("to", "cuda", "cpu"):
            return self.move(func, name, args, kwargs)
        if name == "pin_memory":
            return args[0]
        if name in ("numpy", "__array__") and on_cuda(args[0]):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        if "device" in kwargs and is_cuda_device(kwargs["device"]):
            args, kwargs = strip_device(args, kwargs)
            return mark(func(*args, **kwargs))
        if name not in CROSSING:
            self.check(name, args, kwargs)
        result = func(*args, **kwargs)
        if any(on_cuda(t) for t in tensors_in((args, kwargs))) and name not in ("tolist", "item"):
            mark(result)
        return result

    def attribute(self, func, args):
        prop = getattr(func.__self__, "__name__", "")
        owner = args[0] if args else None
        if prop == "device" and on_cuda(owner):
            return DEVICE
        if prop == "is_cuda":
            return on_cuda(owner)
        result = func(*args)
        if prop in ("data", "grad", "T", "mT", "real") and on_cuda(owner):
            mark(result)
        return result

    def move(self, func, name, args, kwargs):
        source = args[0]
        where = (
            "cuda" if name == "cuda" else "cpu" if name == "cpu" else target_device(args, kwargs)
        )
        if where is None:
            return mark(func(*args, **kwargs), on_cuda(source))
        if name == "to":
            args, kwargs = strip_device(
                tuple(
                    "cpu" if isinstance(a, torch.Tensor) and i else a for i, a in enumerate(args)
                ),
                kwargs,
            )
        result = torch.Tensor.cpu(source) if name == "cuda" else func(*args, **kwargs)
        if result is source and on_cuda(source) != (where == "cuda"):
            result = source.clone()  # a copy across, as a real device makes: the source stays
        return mark(result, where == "cuda")

    @staticmethod
    def check(name, args, kwargs):
        tensors = list(tensors_in((args, kwargs)))
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            indexed, indices = args[0], list(tensors_in(args[1:2]))
            if not on_cuda(indexed) and any(on_cuda(i) for i in indices):
                raise DeviceMismatch(
                    "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
                )
            return
        devices = {"cuda:0" if on_cuda(t) else "cpu" for t in tensors if on_cuda(t) or t.dim() > 0}
        if len(devices) > 1:
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"cuda:0 and cpu! (in {name}: "
                + ", ".join(f"{'cuda' if on_cuda(t) else 'cpu'} {tuple(t.shape)}" for t in tensors)
                + ")"
            )


def _module_to(original):
    def to(self, *args, **kwargs):
        if target_device((None, *args), kwargs) == "cuda":
            args, kwargs = strip_device(args, kwargs)
            result = original(self, *args, **kwargs)
            for tensor in (*self.parameters(), *self.buffers()):
                mark(tensor)
            return result
        result = original(self, *args, **kwargs)
        if target_device((None, *args), kwargs) == "cpu":
            for tensor in (*self.parameters(), *self.buffers()):
                mark(tensor, False)
        return result

    return to


def _module_to_empty(original):
    def to_empty(self, *, device, recurse=True):
        cuda = is_cuda_device(device)
        result = original(self, device="cpu" if cuda else device, recurse=recurse)
        for tensor in (*self.parameters(), *self.buffers()):
            mark(tensor, cuda)
        return result

    return to_empty


def _nccl_collective(original):
    def collective(tensor, *args, **kwargs):
        for t in tensors_in((tensor,)):
            if not on_cuda(t):
                raise DeviceMismatch(
                    "No backend type associated with device type cpu (NCCL takes CUDA tensors)"
                )
        return original(tensor, *args, **kwargs)

    return collective


class _Stream:
    """One stand-in stream: work on it is already done."""

    def wait_stream(self, other):
        pass


def _record_stream(tensor, stream):
    if not on_cuda(tensor):
        raise RuntimeError("record_stream of a CPU tensor (it is for CUDA tensors)")


@contextlib.contextmanager
def fake_cuda(monkeypatch):
    """Within the block, ``cuda`` is a stand-in device with CUDA's placement rules."""
    memory = SimpleNamespace(
        total_memory=80 * 2**30, name="fake", major=9, minor=0, multi_processor_count=132
    )
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "max_memory_allocated": lambda device=None: 0,
        "memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
        "mem_get_info": lambda device=None: (60 * 2**30, 80 * 2**30),
        "empty_cache": lambda: None,
        "get_device_name": lambda device=None: "stand-in GPU",
        "is_bf16_supported": lambda *a, **k: True,
        "get_device_properties": lambda device=None: memory,
        "manual_seed_all": lambda seed: None,
        "manual_seed": lambda seed: None,
        "get_rng_state": lambda device=None: torch.zeros(8, dtype=torch.uint8),
        "set_rng_state": lambda state, device=None: None,
        "seed_all": lambda: None,
    }
    stream = _Stream()
    answers |= {
        "Stream": lambda device=None: stream,
        "stream": lambda s: contextlib.nullcontext(),
        "current_stream": lambda device=None: stream,
    }
    for name, answer in answers.items():
        monkeypatch.setattr(torch.cuda, name, answer)
    monkeypatch.setattr(torch.Tensor, "record_stream", _record_stream)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, device=None: self)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, device=None: False)
    # no stream to capture: the optimisers' graph-capture check asks the accelerator for one
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: None
    )
    monkeypatch.setattr(torch.nn.Module, "to", _module_to(torch.nn.Module.to))
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, device=None: self.to("cuda"))
    monkeypatch.setattr(torch.nn.Module, "to_empty", _module_to_empty(torch.nn.Module.to_empty))
    import torch.distributed as dist

    for name in ("all_reduce", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor"):
        monkeypatch.setattr(dist, name, _nccl_collective(getattr(dist, name)))
    with FakeCuda():
        yield
