"""``evalkit pretrain``: train sizes of the built-in ViT family from scratch — one size, or a
ladder of sizes sharing data and schedule — and write checkpoints that ``--weights`` loads
(effect-table rows 1–6 at small scale; docs/protocols.md, "Pretraining").

On the JFT stand-in (``--data embedded``, or a ``jft/`` multi-label set) the classifier is fitted
with a sigmoid cross-entropy, as JFT pretraining was; on a class-folder set (``imagenet``) with
a softmax cross-entropy. Images get a random resized crop and flip, drawn from a generator
seeded by (seed, step), so a resumed run sees the same batches. Each size writes
``<out>/<size>/model.safetensors`` (the backbone, its config in the metadata),
``head.safetensors`` (the classifier) and ``provenance.json``; ``<out>/ladder.json``
summarises the ladder. Training state lives in ``<out>/<size>/run/`` until the size finishes:
rerunning the command resumes it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evalkit import distributed
from evalkit.data import DataConfig
from evalkit.data.resolve import data_identity, open_dataset
from evalkit.errors import EvalkitError, did_you_mean
from evalkit.models.vit22b import SIZES, ViT, build, config
from evalkit.schedule import Schedule
from evalkit.seeds import SEED_RULE, seed_global
from evalkit.storage.checkpoints import save_checkpoint
from evalkit.storage.identity import library_versions, read_json, spec_key, write_json
from evalkit.training.loop import fit, full_state, sampled_batches

LADDER_SIZES = ("test", "ti", "s", "b", "l")  # the sizes a CPU or one GPU can pretrain


@dataclass(frozen=True)
class PretrainSpec:
    sizes: tuple[str, ...] = ("ti",)
    image: int = 32
    patch: int = 8
    schedule: Schedule = field(
        default_factory=lambda: Schedule(steps=200, batch_size=64, warmup=20)
    )
    out: Path = Path("checkpoints/pretrain")
    device: str = "cpu"
    progress: bool = True
    fsdp: bool = False  # under torchrun: shard parameters over the data-parallel ranks
    keyed: bool = False  # each size in <out>/<size>-<key of its inputs>, not <out>/<size>

    def check(self):
        unknown = [s for s in self.sizes if s not in SIZES]
        if unknown:
            raise EvalkitError(
                f"unknown ladder size {unknown[0]!r}: {did_you_mean(unknown[0], list(SIZES))}"
            )
        if self.image % self.patch:
            raise EvalkitError(f"--image {self.image} must be a multiple of --patch {self.patch}")


class Classifier(torch.nn.Module):
    """The family's pooled features and a linear classifier."""

    def __init__(self, vit: ViT, classes: int):
        super().__init__()
        self.vit = vit
        self.head = torch.nn.Linear(vit.cfg.width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.vit(images))


def pretrain(spec: PretrainSpec, data: DataConfig) -> list[dict]:
    """Train every size of ``spec.sizes`` in turn; returns one summary per size."""
    spec.check()
    name = "jft" if data.source == "embedded" or _has_jft(data) else "imagenet"
    dataset = open_dataset(name, "train", data, transform=_augment(spec.image))
    summaries = []
    for size in spec.sizes:
        summaries.append(_train_size(size, dataset, name, spec, data))
        write_json(Path(spec.out) / "ladder.json", summaries)
    return summaries


def _has_jft(data: DataConfig) -> bool:
    root = data.root
    return root is not None and (Path(root) / "jft" / "train.jsonl").exists()


def _augment(image: int):
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(image, scale=(0.35, 1.0)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize((0.5,) * 3, (0.5,) * 3),
        ]
    )


def _train_size(size: str, dataset, name: str, spec: PretrainSpec, data: DataConfig) -> dict:
    schedule = spec.schedule
    inputs = size_spec(size, name, spec, data)
    folder = Path(spec.out) / (f"{size}-{spec_key(inputs, 12)}" if spec.keyed else size)
    claim(folder, inputs)
    done = _finished(folder, inputs)
    if done is not None:  # trained before: keep its provenance (and its training time)
        return done
    cfg = config(size, image=spec.image, patch=spec.patch)
    seed_global(schedule.seed, "model-weights")
    model = Classifier(build(cfg, seed=schedule.seed), len(dataset.classes)).to(spec.device)
    model = shard(model, fsdp=spec.fsdp)
    multilabel = name == "jft"
    loss = (
        torch.nn.functional.binary_cross_entropy_with_logits
        if multilabel
        else torch.nn.functional.cross_entropy
    )

    batch = sampled_batches(dataset, schedule.batch_size, schedule.seed)
    start = time.perf_counter()
    log = fit(
        model, batch, loss, schedule, out=folder / "run", device=spec.device, progress=spec.progress
    )
    seconds = time.perf_counter() - start
    state = full_state(model)  # every rank takes part in gathering; rank 0 writes
    weights = folder / "model.safetensors"
    if distributed.current().main:
        _write_weights(state, folder, cfg, dataset.classes)
    layout = distributed.current()
    summary = {
        "size": size,
        "weights": str(weights),
        "params": sum(p.numel() for p in model.vit.parameters()),
        "ranks": {"dp": layout.dp_size, "tp": layout.tp_size, "fsdp": spec.fsdp},
        "loss": "sigmoid" if multilabel else "softmax",
        "dataset": name,
        "first_loss": log[0]["loss"],
        "final_loss": sum(e["loss"] for e in log[-10:]) / len(log[-10:]),
        "steps": len(log),
        "seconds": round(seconds, 1),
        "schedule": asdict(schedule),
        "image": spec.image,
        "patch": spec.patch,
        "data_id": inputs["data"],
        "versions": inputs["libraries"],
        "key": spec_key(inputs),
    }
    if layout.main:
        write_json(folder / "provenance.json", summary)
    distributed.barrier()
    return summary


def _write_weights(state: dict, folder: Path, cfg, classes):
    """The backbone as ``model.safetensors`` (its config in the metadata) and the classifier as
    ``head.safetensors`` (its class names in the metadata)."""
    from safetensors.torch import save_file

    save_checkpoint(
        {k[4:]: v for k, v in state.items() if k.startswith("vit.")}, folder, cfg.as_dict()
    )
    head = {k[5:]: v for k, v in state.items() if k.startswith("head.")}
    save_file(head, str(folder / "head.safetensors"), metadata={"classes": ",".join(classes)})


def shard(model: Classifier, *, fsdp: bool) -> Classifier:
    """Spread ``model`` over the torchrun layout: tensor parallel over ``tp`` with the
    family's plan, and FSDP2 over ``dp`` (``fsdp``); else data parallel with whole copies."""
    layout = distributed.current()
    if layout.tp_size > 1:
        from evalkit.parallel.sharding import apply_tensor_parallel

        apply_tensor_parallel(model.vit, layout.mesh["tp"])
    if fsdp:
        if layout.dp_size == 1:
            raise EvalkitError(
                "--fsdp shards over data-parallel ranks: launch more processes than --tp"
            )
        from torch.distributed.fsdp import fully_shard

        from evalkit.parallel.sharding import apply_fsdp

        apply_fsdp(model.vit, layout.mesh["dp"])
        fully_shard(model, mesh=layout.mesh["dp"])
    return model


def size_spec(size: str, dataset: str, spec: PretrainSpec, data: DataConfig) -> dict:
    """Everything that makes one size's weights what they are: the reuse key of its folder."""
    return {
        "size": size,
        "image": spec.image,
        "patch": spec.patch,
        "schedule": asdict(spec.schedule),
        "dataset": dataset,
        "data": data_identity(dataset, data),
        "libraries": library_versions(),
        "seed_rule": SEED_RULE,
    }


def claim(folder: Path, inputs: dict):
    """Mark ``folder`` as this spec's (``spec.json``); a folder already holding a run of
    another spec is refused, naming what differs: its weights or resumable state would
    otherwise be returned or continued for settings they were not trained with."""
    record = folder / "spec.json"
    held = read_json(record) if record.exists() else None
    if held is None and any((folder / f).exists() for f in ("provenance.json", "run")):
        raise EvalkitError(
            f"{folder} holds a run that did not record its settings: pass another --out, or "
            "delete it to retrain"
        )
    if held is not None and held != inputs:
        differs = sorted(k for k in inputs.keys() | held.keys() if held.get(k) != inputs.get(k))
        first = differs[0]
        raise EvalkitError(
            f"{folder} holds a run with other {', '.join(differs)} ({first}: "
            f"{held.get(first)} there, {inputs.get(first)} now): pass another --out, or delete "
            "it to retrain"
        )
    if held is None and distributed.current().main:
        write_json(record, inputs)
    distributed.barrier()


def _finished(folder: Path, inputs: dict) -> dict | None:
    """The provenance of a size already trained from exactly ``inputs``, or None."""
    record = folder / "provenance.json"
    if not (record.exists() and (folder / "model.safetensors").exists()):
        return None
    summary = read_json(record)
    return summary if summary.get("key") == spec_key(inputs) else None
