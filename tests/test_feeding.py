"""How images reach the device and how a run's arithmetic is set (``evalkit.data.feeding``,
``evalkit.core.runner.run_numerics``): worker counts from the CPUs a job has, training batches
decoded ahead in worker processes on a (stand-in) GPU and identical to the plain ones, fp32
master weights for fine-tuning, and the numerics each row records."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from fake_cuda import fake_cuda

from evalkit import device
from evalkit.core.numerics import numerics, run_numerics
from evalkit.data import feeding
from evalkit.reproduction.sweep import Resources
from evalkit.training.loop import sampled_batches


class Noisy(torch.utils.data.Dataset):
    """Items whose 'augmentation' draws from the global RNG, as real ones do."""

    def __len__(self):
        return 50

    def __getitem__(self, index):
        return torch.full((3, 4, 4), float(index)) + torch.rand(3, 4, 4), index % 5


def test_workers_follow_the_cpus_a_job_has(monkeypatch):
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert device.available_cpus() == 32
    assert device.decode_workers("cuda") == 7  # 8 per rank, one kept to drive the GPU
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")
    assert device.decode_workers("cuda:1") == 3
    assert device.decode_workers("cpu") == 1  # the forward keeps the rank's 4 cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert device.decode_workers("cpu") == 2  # one per 8 cores


def test_even_a_small_split_is_decoded_outside_the_forwards_process(monkeypatch):
    monkeypatch.setattr(device, "cpus_per_rank", lambda: 2)
    assert feeding.loader_workers(None, "cpu", batches=21) == 1  # the README's job: 1,344 images
    assert feeding.loader_workers(None, "cpu", batches=feeding.FEW_BATCHES) == 0
    assert feeding.loader_workers(0, "cpu", batches=100) == 0  # --workers 0 is obeyed


def test_slurm_asks_for_cpus_per_gpu():
    assert Resources(gpus=8).cpus == 8 * device.CPUS_PER_GPU
    assert Resources().cpus == 8
    assert Resources(gpus=8, cpus_per_task=20).cpus == 20


def test_prefetched_batches_are_the_plain_ones_in_order(monkeypatch):
    batch = sampled_batches(Noisy(), batch_size=4, seed=3)
    keys = [(step, micro) for step in range(2, 6) for micro in range(2)]
    expected = [batch(*key) for key in keys]
    monkeypatch.setattr(device, "cpus_per_rank", lambda: 3)
    with fake_cuda(monkeypatch):
        ahead = feeding.prefetched(batch, keys, "cuda")
        assert ahead is not batch  # worker processes decode
        got = [ahead(*key) for key in keys]
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    assert feeding.prefetched(batch, keys, "cpu") is batch


def test_prefetched_refuses_a_step_out_of_order(monkeypatch):
    batch = sampled_batches(Noisy(), batch_size=4, seed=3)
    monkeypatch.setattr(device, "cpus_per_rank", lambda: 2)
    with fake_cuda(monkeypatch):
        ahead = feeding.prefetched(batch, [(0, 0), (1, 0), (2, 0)], "cuda")
        with pytest.raises(RuntimeError, match="asked for as"):
            ahead(1, 0)


def test_fine_tuning_trains_fp32_master_weights():
    from evalkit import load_backbone
    from evalkit.training.finetune import backbone_module, trainable_copy

    backbone = load_backbone("vit22b/test", random_init=True, dtype="bf16")
    copy = trainable_copy(backbone)
    params = list(backbone_module(copy).parameters())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in params)
    assert next(backbone_module(backbone).parameters()).dtype == torch.bfloat16  # untouched


def test_run_numerics_are_set_recorded_and_restored():
    def settings():
        fill = torch.utils.deterministic.fill_uninitialized_memory
        return torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, fill

    before = settings()
    restore = run_numerics()
    try:
        assert numerics() == {"tf32": False, "deterministic": True}
        assert not torch.backends.cudnn.benchmark
        assert not torch.utils.deterministic.fill_uninitialized_memory  # a cost, not a number
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        restore()
    assert settings() == before


RUN_AND_LIST = """
import sys
from evalkit.cli import main
code = main(["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded",
             "--out", sys.argv[1], "--quiet"])
heavy = ("torchvision", "torch._dynamo", "torch._inductor", "torch.distributed.fsdp", "sympy")
print(code, [m for m in heavy if m in sys.modules])
"""


def test_a_run_loads_torchs_compiler_only_where_torchvision_is_needed(tmp_path):
    """Importing torchvision loads torch's compiler (dynamo, inductor: 1–2 CPU-s of a run's
    start), as do ``torch.use_deterministic_algorithms`` and torch's FLOP counter; asking
    whether a model is FSDP-sharded by importing FSDP loads DTensor and sympy (about 1 CPU-s).
    A single-process run that decodes nothing through torchvision (features cached, or views
    made without it) loads none of them: ``evalkit run`` of a cached kNN, 4.2 → 2.4 CPU-s."""
    env = os.environ | {"EVALKIT_CACHE": str(tmp_path / "cache")}
    for out in ("first", "features-cached"):
        command = [sys.executable, "-c", RUN_AND_LIST, str(tmp_path / out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == "0 []"


def _with_the_fill(real):
    """``run_numerics`` as a run sets it, but keeping deterministic mode's fill of new tensors."""

    def numerics_with_fill():
        restore = real()
        torch.utils.deterministic.fill_uninitialized_memory = True
        return restore

    return numerics_with_fill


@pytest.mark.parametrize("task", ["imagenet-knn", "imagenet-linear"])
def test_a_run_without_the_fill_of_new_tensors_gives_the_same_rows(cli_env, monkeypatch, task):
    """A run turns off deterministic mode's NaN fill of every new tensor (a pass over each
    output, for speed): with the fill kept, the same run gives the same rows bit for bit. A
    head that read memory nothing wrote would give NaN with the fill and other values
    without it."""
    import evalkit.core.runner as runner
    from evalkit.core.spec import RunSpec

    def values(out: str) -> dict[str, float]:
        spec = {"tasks": (task,), "backbones": ("fake",), "data": "embedded", "out": out}
        (result,) = list(runner.run(RunSpec.of(**spec, no_cache=True, progress=False)))
        return {row["metric"]: row["value"] for row in result.rows}

    plain = values("plain")
    monkeypatch.setattr(runner, "run_numerics", _with_the_fill(runner.run_numerics))
    assert values("filled") == plain and all(math.isfinite(v) for v in plain.values())


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("fake", {}),
        ("vit22b/test", {}),
        ("timm/vit_tiny_patch16_224", {"img_size": 32, "depth": 2}),
        ("open_clip/ViT-B-32", {"force_image_size": 64}),
    ],
)
def test_backbones_extract_the_same_bits_without_the_fill_of_new_tensors(name, options):
    """Each family's forward, every layer pooled and dense, under a run's numerics with and
    without deterministic mode's fill of new tensors: the same bits."""
    from evalkit import load_backbone

    backbone = load_backbone(name, model_kwargs=options)
    size = backbone.info.preprocess.size
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 3, size, size), generator=generator, dtype=torch.uint8)
    layers = tuple(range(backbone.info.depth))
    pool = "mean" if "mean" in backbone.info.pools else backbone.info.pools[0]

    def features(fill: bool):
        restore = (_with_the_fill(run_numerics) if fill else run_numerics)()
        try:
            with torch.inference_mode():
                out = backbone.extract(images, layers=layers, pool=pool, dense=True)
            return [out.pooled, *out.grids]
        finally:
            restore()

    plain, filled = features(fill=False), features(fill=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, filled, strict=True))
    assert all(torch.isfinite(a).all() for a in plain)


def test_plan_states_decode_rate_beside_forward_rate(capsys):
    from evalkit.cli import main

    assert (
        main(
            [
                "plan",
                "--task",
                "imagenet-linear",
                "--backbone",
                "timm/vit_base_patch16_224",
                "--data",
                "embedded",
                "--target",
                "8xH100-80GB",
            ]
        )
        == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("feeding:"))
    assert "11 decoding workers per rank" in line and "the forward takes about" in line
    assert "the device waits" in line  # PIL on 11 cores cannot feed a ViT-B on an H100


def test_slurms_cpu_count_caps_the_affinity_never_raises_it(monkeypatch):
    """Slurm's per-task count below the affinity mask lowers it; above (a mask narrowed by
    taskset or cgroups inside the allocation) it must not raise it."""
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for slurm, expected in (("2", 2), ("16", 4), ("", 4)):
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", slurm)
        assert device.available_cpus() == expected, slurm


def test_free_cpus_leaves_out_only_other_processes_running_threads(monkeypatch, tmp_path):
    """The kernel's count of runnable threads includes this process's own: with 5 running,
    3 of them ours (a fourth of ours asleep), 2 cores are busy elsewhere and 6 of 8 are free."""
    (tmp_path / "loadavg").write_text("1.00 1.00 1.00 5/300 4242\n")
    for task in "1234":
        (tmp_path / "task" / task).mkdir(parents=True)
    proc = {"/proc/loadavg": tmp_path / "loadavg", "/proc/self/task": tmp_path / "task"}
    monkeypatch.setattr(device, "Path", lambda path: proc[path])
    monkeypatch.setattr(device, "_task_state", lambda task: "S" if task.name == "4" else "R")
    monkeypatch.setattr(device, "available_cpus", lambda: 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert device.free_cpus() == 6


def test_free_cpus_reads_the_fewest_busy_of_several_readings(monkeypatch):
    """A thread runnable at one reading only (a kernel worker, a pool falling asleep) takes
    no core from a search of seconds; a process busy at every reading does. The pool of this
    process that stops spinning between its own count and the kernel's is its own."""
    monkeypatch.setattr(device, "available_cpus", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(device.time, "sleep", lambda seconds: None)

    def readings(counts):
        kernel, own = iter(counts[0]), iter(counts[1])
        monkeypatch.setattr(device, "_own_running", lambda: next(own))
        monkeypatch.setattr(device, "Path", lambda path: FakeLoadavg(next(kernel)))

    readings(([3, 2, 2], [2, 2, 2, 2, 2, 2]))  # one thread elsewhere, at the first reading
    assert device.free_cpus() == 2
    readings(([3, 3, 3], [2, 2, 2, 2, 2, 2]))  # a process busy throughout
    assert device.free_cpus() == 1
    readings(([2, 2, 2], [2, 1, 2, 1, 2, 1]))  # our spinning pool asleep by the second count
    assert device.free_cpus() == 2


class FakeLoadavg:
    def __init__(self, running: int):
        self.running = running

    def read_text(self) -> str:
        return f"1.00 1.00 1.00 {self.running}/300 4242\n"


def test_decoded_ahead_keeps_order_and_raises_the_producers_error_as_raised():
    import threading

    assert list(feeding.decoded_ahead(iter(range(50)), depth=2)) == list(range(50))

    def failing():
        yield from range(3)
        raise device.EvalkitError("image 3: not a JPEG (expected ...)")

    got = []
    with pytest.raises(device.EvalkitError, match="image 3: not a JPEG"):
        for item in feeding.decoded_ahead(failing()):
            got.append(item)
    assert got == [0, 1, 2]

    started = threading.active_count()
    ahead = feeding.decoded_ahead(iter(range(10**6)), depth=2)
    assert next(ahead) == 0
    ahead.close()  # a caller that stops early stops the thread
    assert threading.active_count() == started


class Slow(torch.utils.data.Dataset):
    """Items that take longer the lower their index, so threads finish them out of order."""

    independent_reads = True

    def __init__(self, count: int, bad: int | None = None):
        self.count, self.bad, self.threads_seen = count, bad, set()

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        import time

        self.threads_seen.add(torch.get_num_threads())
        if index == self.bad:
            raise device.EvalkitError(f"image {index}: corrupt (expected a JPEG)")
        time.sleep(0.002 * (index % 4 == 0))
        return torch.full((2, 3), float(index)), index % 3


def test_reads_in_threads_collate_as_the_loader_in_order_each_read_on_one_thread():
    dataset = Slow(23)
    batches = [list(range(i, min(i + 5, 23))) for i in range(0, 23, 5)]
    loader = list(torch.utils.data.DataLoader(dataset, batch_sampler=batches))
    dataset.threads_seen.clear()
    threaded = list(feeding.read_in_threads(dataset, batches, count=3))
    assert len(threaded) == len(batches)
    for (images, labels), (want_images, want_labels) in zip(threaded, loader, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    assert dataset.threads_seen == {1}
    assert feeding.independent_reads(dataset) and not feeding.independent_reads(Noisy())


def test_reads_in_threads_raise_the_readers_error_after_the_batches_before_it():
    import threading

    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    got = []
    with pytest.raises(device.EvalkitError, match="image 5: corrupt"):
        for images, _ in feeding.read_in_threads(Slow(8, bad=5), batches, count=2):
            got.append(images[:, 0, 0].tolist())
    assert got == [[0.0, 1.0], [2.0, 3.0]]

    started = threading.active_count()
    reads = feeding.read_in_threads(Slow(10**5), [[i] for i in range(10**5)], count=2)
    assert next(reads)[1].tolist() == [0]
    reads.close()  # a caller that stops early leaves no thread reading
    assert threading.active_count() == started


def test_read_threads_are_this_ranks_cores_within_a_bound(monkeypatch):
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert feeding.read_threads() == feeding.MOST_READ_THREADS
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0})
    assert feeding.read_threads() == 1
