"""Zero-shot classification and LiT (effect-table row 6; docs/protocols.md, "Zero-shot" and
"LiT").

``zeroshot-<set>``: the backbone's own text tower (open_clip models), or a LiT tower saved by an
earlier run (``--set text_tower=PATH``), builds one embedding per class from its prompts (as
the tower's published protocol: verbatim OpenAI templates for open_clip, big_vision's
canonicalised ones for LiT); test images are scored by cosine similarity within the set's
label space (ImageNet val and v2: all classes, however few are present; -R and -A: their 200;
ObjectNet: the ImageNet classes mapped to its classes, correct when the prediction is any class
mapped to the image's).

``lit-<set>``: first trains a text tower on an image–caption set against the backbone's locked
image embeddings, read from the feature cache (the image tower never runs again, across steps
or reruns), then scores the set zero-shot with it. The tower is saved beside the rows
(``towers/``) and its path recorded, so later ``zeroshot-*`` runs can reuse it.

Paper (LiT with a frozen ViT-22B image tower): ImageNet 85.9, v2 80.9, R 96.0, A 90.1,
ObjectNet 87.6 (LiT-e: 84.9).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit import distributed
from evalkit.backbones.base import POOLS, TextTower, text_tower
from evalkit.cache.keys import backbone_spec
from evalkit.cache.settings import FeatureRequest
from evalkit.core.task import (
    LAYERS,
    NON_NEGATIVE,
    POSITIVE,
    Metric,
    Rule,
    Stage,
    Task,
    extraction_stage,
    one_of,
    resolve_pool,
    setting,
)
from evalkit.data.captions import UNREADABLE
from evalkit.data.resolve import open_dataset
from evalkit.data.shifted import open_scored
from evalkit.errors import EvalkitError
from evalkit.heads.text import (
    LOSSES,
    LitModel,
    LitText,
    TowerConfig,
    load_tower,
    save_tower,
    tokenizer,
)
from evalkit.heads.train import ShardedOrder, ShardReader, train
from evalkit.heads.zeroshot import (
    PROMPT_STYLES,
    TEMPLATE_SETS,
    Prompting,
    class_embeddings,
    is_template_file,
    label_space_hits,
    names_id,
    stored_class_embeddings,
    templates,
)
from evalkit.metrics import accuracy_stderr, reported_ks
from evalkit.protocols.error_tables import classification_tables
from evalkit.protocols.paired_tests import classification_test
from evalkit.protocols.predictions import save_classifications
from evalkit.schedule import declared_schedule
from evalkit.seeds import generator, seeded_build
from evalkit.storage.checkpoints import checkpoint_id
from evalkit.storage.identity import library_versions, spec_key

TEMPLATES = Rule(
    f"auto, one of {', '.join(TEMPLATE_SETS)}, or a templates file (a path ending .txt or with a /)",
    lambda v: v == "auto" or v in TEMPLATE_SETS or is_template_file(v),
)
PAPER_LIT_22B = {
    "imagenet": 85.9,
    "imagenet-v2": 80.9,
    "imagenet-r": 96.0,
    "imagenet-a": 90.1,
    "objectnet": 87.6,
}
PAPER_LIT_E = {"objectnet": 84.9}


@dataclass(frozen=True)
class ZeroShot(Task):
    name: str = "zeroshot-imagenet"
    dataset: str = "imagenet"
    eval_split: str = "val"
    # auto: the text tower's own protocol (open_clip: OpenAI's 80 templates; LiT: big_vision's
    # clip_paper), a named set, or a text file of one template per line, each with {}
    templates: str = setting("auto", TEMPLATES)
    # auto: as the tower records (open_clip: verbatim, as CLIP's published numbers; LiT:
    # canonical, as big_vision's evaluators); or forced
    prompts: str = setting("auto", one_of("auto", *PROMPT_STYLES))
    # protocol: the set's own label space (ImageNet val, v2, ReaL: all 1000 classes, however
    # few a partial copy holds); present: only the classes the images hold (no paper number)
    label_space: str = setting("protocol", one_of("protocol", "present"))
    first_alias: bool = False  # only the first comma-separated alias of a class name
    text_tower: str = ""  # a saved LiT tower; empty: the backbone's own text tower
    pool: str = setting("auto", one_of("auto", *POOLS))  # auto: embed, or the LiT tower's
    layers: tuple[int, ...] = setting((-1,), LAYERS)

    version = 2  # 2: prompts follow the tower; ImageNet val scored over all its classes

    paired_test = staticmethod(classification_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(classification_tables)  # declared in error_tables.DECLARED too

    def config(self) -> dict:
        """The settings, and the content of the files they name: a templates file or a saved
        tower edited in place must not reuse rows measured with the old one."""
        config = super().config()
        if is_template_file(self.templates) and Path(self.templates).is_file():
            config["templates_id"] = names_id(templates(self.templates))
        if self.text_tower:  # a file or a folder: the content of what is loaded
            config["text_tower_id"] = checkpoint_id(self.text_tower)
        return config

    @property
    def reference(self) -> dict:
        if self.label_space == "present":  # not the protocol the paper measured
            return {"top1": {}}
        paper = {"LiT-22B": PAPER_LIT_22B[self.dataset]} if self.dataset in PAPER_LIT_22B else {}
        if self.dataset in PAPER_LIT_E:
            paper["LiT-e"] = PAPER_LIT_E[self.dataset]
        return {"top1": paper}

    def metrics(self) -> list[str]:
        return ["top1", "top5"]

    def splits(self) -> tuple[str, ...]:
        return (self.eval_split,)

    def run(self, backbone, ctx):
        tower = load_tower(self.text_tower) if self.text_tower else None
        yield from self.score(backbone, ctx, tower, {})

    def score(self, backbone, ctx, tower: LitText | None, extra: dict):
        """Top-1 and top-5 of the test split with ``tower`` (None: the backbone's own)."""
        text, request = self.text_side(backbone, tower)
        test = open_scored(self.dataset, self.eval_split, ctx.data, backbone.transform())
        feats = ctx.features(backbone, test, split=self.eval_split, request=request)
        space = self.scored_space(test.label_space, feats.labels)
        prompting = self.prompting(text, space.names)
        classes = self.classifier(text, prompting, ctx, self.tower_id(backbone, tower, ctx))
        hits, kept = {1: [], 5: []}, []
        for rows, index in feats.by_shard(torch.arange(len(feats))):  # one shard at a time
            scores = _image_embeddings(rows.to(classes.device), tower) @ classes.T
            for k, found in hits.items():
                found.append(label_space_hits(scores, feats.labels[index], space, k))
            if ctx.predictions is not None:
                kept.append(scores.cpu())
        if kept:
            save_classifications(
                ctx, torch.cat(kept), feats.labels, test, space, kind="similarities"
            )
        extra = {
            **extra,
            "templates": self.chosen_templates(text),
            "prompts": prompting.style,
            "classes": len(space.names),
            "class_names_id": names_id(space.names),
            "pool": request.pool,
            "candidates": len(space.candidates or space.names),
            "label_space": self.describe_space(space),
        }
        extra["num_classes"] = extra["candidates"]
        for k in reported_ks(extra["num_classes"]):
            found = hits[k]
            right = torch.cat(found)
            yield Metric(
                f"top{k}",
                100.0 * right.double().mean().item(),
                n=len(right),
                stderr=accuracy_stderr(right),
                extra=extra,
            )

    def chosen_templates(self, text) -> str:
        return (
            getattr(text, "default_templates", "clip_paper")
            if self.templates == "auto"
            else self.templates
        )

    def prompting(self, text, names) -> Prompting:
        """The prompts this tower is scored with: its own style unless one is forced."""
        style = (
            getattr(text, "prompt_style", "canonical") if self.prompts == "auto" else self.prompts
        )
        chosen = templates(self.chosen_templates(text), style)
        return Prompting(tuple(names), tuple(chosen), self.first_alias, style)

    def scored_space(self, space, labels: torch.Tensor):
        """The set's own label space, or with ``label_space=present`` only the classes its
        images hold."""
        if self.label_space == "protocol":
            return space
        present = sorted({i for label in set(labels.tolist()) for i in space.correct[label]})
        if space.candidates is not None:
            present = sorted(set(present) & set(space.candidates))
        return dataclasses.replace(space, candidates=tuple(present))

    def describe_space(self, space) -> str:
        if space.candidates is None:
            return f"all {len(space.names)} classes"
        why = "the classes present" if self.label_space == "present" else f"{self.dataset}'s own"
        return f"{len(space.candidates)} of {len(space.names)} classes ({why})"

    def classifier(self, text, prompting: Prompting, ctx, tower_id: str | None) -> torch.Tensor:
        folder = ctx.extract.writable_cache
        if folder is None or tower_id is None:
            return class_embeddings(text, prompting)
        return stored_class_embeddings(text, prompting, tower_id=tower_id, folder=folder)

    def tower_id(self, backbone, tower: LitText | None, ctx) -> str | None:
        """What identifies the text tower (None: a tower trained in this run): the backbone
        as the feature cache keys it (weights, options, dtype, library versions), or the
        saved tower's content with the library versions."""
        if tower is None:
            return spec_key(backbone_spec(backbone.info, ctx.extract.dtype))
        if not self.text_tower:
            return None
        return spec_key({"tower": checkpoint_id(self.text_tower), "libraries": library_versions()})

    def lacks(self, backbone) -> str | None:
        if self.text_tower or isinstance(getattr(backbone, "text", None), TextTower):
            return None
        return f"{backbone.info.name} has no text tower (zero-shot needs one; LiT trains one)"

    def text_side(self, backbone, tower: LitText | None):
        """The text tower and the feature request whose embeddings share its space."""
        if tower is None:
            pool = "embed" if self.pool == "auto" else self.pool
            return text_tower(backbone), FeatureRequest(layers=self.layers, pool=pool)
        image = tower.cfg.image_tower
        if image.get("weights_id") != backbone.info.weights_id:
            raise EvalkitError(
                f"text tower {self.text_tower} was trained on {image.get('backbone')} "
                f"(weights {image.get('weights_id')}), not {backbone.info.name} "
                f"({backbone.info.weights_id}): pair it with the image tower it was trained with"
            )
        return tower, FeatureRequest(layers=tuple(image["layers"]), pool=image["pool"])


def _image_embeddings(rows: torch.Tensor, tower: LitText | None) -> torch.Tensor:
    pooled = rows.float()
    if tower is None:
        return torch.nn.functional.normalize(pooled, dim=-1, eps=1e-8)
    return tower.embed_images(pooled)


@dataclass(frozen=True)
class Lit(ZeroShot):
    name: str = "lit-imagenet"
    captions: str = "captions"  # the image–text dataset the tower is trained on
    caption_split: str = "train"
    # LiT's pooling is the class token; mean is defined for every backbone (--set pool=cls).
    pool: str = setting("mean", one_of("auto", *POOLS))
    width: int = setting(192, POSITIVE)  # LiT's small towers: 192 (3 heads) or 384 (6)
    text_layers: int = setting(4, POSITIVE)  # LiT's small towers have 12: --set text_layers=12
    heads: int = setting(3, POSITIVE)
    context: int = setting(16, POSITIVE)  # tokens per caption
    loss: str = setting("softmax", one_of(*LOSSES))
    image_head: bool = True  # a linear image head, as the published LiT-B16B has
    temperature: float = setting(10.0, POSITIVE)  # the learned temperature's initial value
    steps: int = setting(300, POSITIVE)
    batch_size: int = setting(256, POSITIVE)
    lr: float = setting(1e-3, POSITIVE)
    weight_decay: float = setting(1e-4, NON_NEGATIVE)
    warmup: int = setting(30, NON_NEGATIVE)
    clip: float = setting(1.0, POSITIVE)
    resident_gb: float = setting(4.0, NON_NEGATIVE)  # larger caption sets are streamed

    version = (
        3  # 3: epoch order and captions drawn by evalkit.seeds; 2: batches across cache shards
    )

    def lacks(self, backbone) -> str | None:
        return None  # it trains its own text tower

    def datasets(self) -> tuple[str, ...]:
        return (self.dataset, self.captions)

    def reads(self) -> dict[str, dict[str, str]]:
        return {
            self.captions: {"captions": self.caption_split},
            self.dataset: {self.eval_split: self.eval_split},
        }

    def plan(self, inputs) -> list[Stage]:
        """The caption set's and the test set's embeddings extracted once; while the tower
        trains, the training set's embeddings are held as float32 when they fit
        ``resident_gb``, else streamed: two windows of cache shards at a time. The device holds
        a rank's share of a batch: embeddings, tokens and the tower's activations."""
        pairs = inputs.sizes["captions"]
        dim = len(self.layers) * inputs.shape.embed_dim
        batch = self.batch_size * (dim * 4 + self.context * (8 + 16 * self.width * 4))
        extract = extraction_stage(inputs, sum(inputs.sizes.values()), layers=len(self.layers))
        if pairs * dim * 4 <= self.resident_gb * 2**30:
            return [
                extract,
                Stage("LiT text tower", "resident", host_bytes=pairs * dim * 4, device_bytes=batch),
            ]
        window = max(2 * inputs.shard_size, 2 * self.batch_size)
        held = 2 * window * dim * 4 + pairs * 8  # two windows of shards, the order's indices
        return [extract, Stage("LiT text tower", "streamed", host_bytes=held, device_bytes=batch)]

    def run(self, backbone, ctx):
        if self.text_tower:
            raise EvalkitError(
                f"{self.name} trains its own text tower: use zeroshot-* with text_tower="
            )
        request = FeatureRequest(layers=self.layers, pool=resolve_pool(self.pool, backbone))
        model, fit = self.train_tower(backbone, ctx, request)
        tower = LitText(model)
        saved = self.save(model, backbone, ctx)
        yield from self.score(backbone, ctx, tower, {**fit, "text_tower": saved})

    def train_tower(self, backbone, ctx, request: FeatureRequest):
        """The tower trained on the caption set's cached image embeddings."""
        pairs = open_dataset(
            self.captions, self.caption_split, ctx.data, transform=backbone.transform()
        )
        feats = ctx.features(backbone, pairs, split=self.caption_split, request=request)
        readable = feats.labels != UNREADABLE
        if not readable.any():
            raise EvalkitError(f"no readable image in {self.captions}/{self.caption_split}")
        layout = distributed.current()
        if self.batch_size % layout.dp_size:
            raise EvalkitError(
                f"batch_size {self.batch_size} must divide by the {layout.dp_size} data-parallel ranks"
            )
        order = ShardedOrder.of(feats.starts, readable, self.batch_size, ctx.seed)
        dim = feats.take([0]).shape[-1]
        resident = len(feats) * dim * 4 <= self.resident_gb * 2**30
        images = ShardReader(feats, 2 * order.window, resident=resident)
        model = seeded_build(
            lambda: LitModel(self.tower_config(backbone, request, dim)), ctx.seed, "tower-weights"
        )
        model = model.to(ctx.device)
        words, steps = tokenizer(self.context), iter(range(self.steps))

        def step_loss(batch: torch.Tensor) -> torch.Tensor:
            share = len(batch) // layout.dp_size
            mine = batch[layout.dp_rank * share : (layout.dp_rank + 1) * share]
            texts = self.pick_captions(pairs.captions, batch, ctx.seed, next(steps))[
                layout.dp_rank * share : (layout.dp_rank + 1) * share
            ]
            device = ctx.device
            return model.loss(images.take(mine).to(device), words(texts).to(device))

        settings = declared_schedule(self, ctx.seed, batch_size=order.batch_size, b2=0.999)
        losses = train(
            model,
            step_loss,
            order.rows,
            settings,
            device=ctx.device,
            progress=ctx.extract.progress,
            after_backward=distributed.average_gradients,
            order=order.batch,
        )
        rows = readable.nonzero().squeeze(1).tolist()
        fit = {
            "lit_first_loss": losses[0],
            "lit_final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "lit_pairs": order.rows,
            "lit_captions": sum(len(pairs.captions[i]) for i in rows),
            "lit_unreadable": int(len(feats) - order.rows),
            "lit_skipped": pairs.skipped,
            "lit_mode": "resident" if resident else "streamed",
            "lit_temperature": model.log_temperature.detach().exp().item(),
        }
        return model, fit

    @staticmethod
    def pick_captions(captions: list[list[str]], batch: torch.Tensor, seed: int, step: int):
        """One caption per image of the batch, drawn from (seed, step) alone."""
        draws = torch.rand(len(batch), generator=generator(seed, "captions", step)).tolist()
        return [
            captions[i][int(u * len(captions[i]))]
            for i, u in zip(batch.tolist(), draws, strict=True)
        ]

    def tower_config(self, backbone, request: FeatureRequest, dim: int) -> TowerConfig:
        image = {
            "backbone": backbone.info.name,
            "weights_id": backbone.info.weights_id,
            "pool": request.pool,
            "layers": list(request.layers),
        }
        return TowerConfig(
            width=self.width,
            layers=self.text_layers,
            heads=self.heads,
            context=self.context,
            embed_dim=dim,
            image_head=self.image_head,
            loss=self.loss,
            temperature=self.temperature,
            image_tower=image,
        )

    def save(self, model: LitModel, backbone, ctx) -> str | None:
        if ctx.artifacts is None or not distributed.current().main:
            return None
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", backbone.info.name)
        out = Path(ctx.artifacts).parent / "towers" / f"{self.name}-{safe}-s{ctx.seed}"
        return str(save_tower(model, out))
