"""ADE20k semantic segmentation on frozen features, with a fraction of the training images
(paper: "few-shot" ADE20k, effect-table rows 7-8; docs/protocols.md, "ADE20k segmentation").

Protocol: a seeded, hashed subset of ``fraction`` of the training images (nested: the 1/16
images are inside the 1/8 ones; the same for every backbone); images resized to
``image_size`` squared; the patch grids of 4 evenly spaced layers extracted once (cached);
a head — ``linear`` (BatchNorm + 1×1 conv on the last layer, DINOv2's BNHead) or ``upernet``
(ViT feature pyramid from the 4 layers + UPerNet decoder) — trained with cross-entropy
(ignore 255, labels reduced: 0 → ignored, 1..150 → 0..149) at stride 4 of the input by AdamW
with warm-up and cosine decay; no augmentation (frozen features are computed once). mIoU and
pixel accuracy on the validation images at each annotation's own resolution (logits upsampled
bilinearly), intersection and union summed over the whole set, mean over classes present in
the ground truth or the prediction.

Paper (mIoU, backbone fine-tuned): 1/16: DeiT-III-L 36.1, ViT-G 42.4, ViT-22B 44.7; 1/8: 41.3 /
47.0 / 47.2; 1/4: 45.6 / 50.2 / 50.6; 1/2: 48.4 / 52.4 / 52.5; 1/1: 51.9 / 55.6 / 54.9. These runs
keep the backbone frozen, so tables set beside them only the frozen ViT-22B numbers at full data
(linear 34.6, UperNet 52.7). The paper's crop is 504 px and its schedule far longer; the defaults here fit a CPU (``--set image_size=504
--set steps=40000 --set channels=512`` for the paper's scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from evalkit.core.task import NON_NEGATIVE, POSITIVE, SHARE, Metric, Stage, one_of, setting
from evalkit.data.dense_layouts import ADE_CLASSES, IGNORE, SlidingWindows, scale_crop_flip
from evalkit.data.resolve import open_dataset
from evalkit.heads.decoders import SEGMENTATION_HEADS, LinearSegmentation, UperNetSegmentation
from evalkit.metrics import confusion_matrix, miou_bootstrap_stderr, segmentation_scores
from evalkit.protocols.error_tables import segmentation_tables
from evalkit.protocols.finetuning import FinetuneSettings, dense_end_to_end, finetune_extra
from evalkit.protocols.grids import (
    DenseSettings,
    colour_labels,
    dense_features,
    hashed_subset,
    picture_path,
    resize_to,
    save_picture_grid,
)
from evalkit.protocols.paired_tests import segmentation_test
from evalkit.protocols.predictions import image_ids
from evalkit.seeds import derived_seed
from evalkit.training.loop import sampled_batches

# The paper's fraction table was measured with the backbone fine-tuned with a linear decoder (a
# later paper tabulates ViT-22B at full data as frozen linear 34.6, frozen UperNet 52.7,
# fine-tuned UperNet 55.3): it stands beside fine-tuned linear runs only.
PAPER_FINETUNED = {
    1 / 16: {"DeiT-III-L": 36.1, "ViT-G": 42.4, "ViT-22B": 44.7},
    1 / 8: {"DeiT-III-L": 41.3, "ViT-G": 47.0, "ViT-22B": 47.2},
    1 / 4: {"DeiT-III-L": 45.6, "ViT-G": 50.2, "ViT-22B": 50.6},
    1 / 2: {"DeiT-III-L": 48.4, "ViT-G": 52.4, "ViT-22B": 52.5},
    1.0: {"DeiT-III-L": 51.9, "ViT-G": 55.6, "ViT-22B": 54.9},
}
# Frozen ViT-22B at full data, the numbers to set beside these (frozen) runs.
PAPER_FROZEN = {
    (1.0, "linear"): {"ViT-22B (frozen, linear)": 34.6},
    (1.0, "upernet"): {"ViT-22B (frozen, UperNet)": 52.7},
}
PAPER_FINETUNED_UPERNET = {1.0: {"ViT-22B (fine-tuned, UperNet)": 55.3}}
PICTURES = 4


@dataclass(frozen=True)
class Segmentation(FinetuneSettings, DenseSettings):
    name: str = "ade20k-1/1"
    fraction: float = setting(1.0, SHARE)
    head: str = setting("linear", one_of(*SEGMENTATION_HEADS))
    finetune_batch_size: int = setting(8, POSITIVE)  # the paper's: 16
    eval_mode: str = setting("resize", one_of("resize", "slide"))  # slide: mmseg's windows
    # Training views when images pass through the backbone each step (in the loop, fine-tuned):
    # flip, or mmseg's scale jitter + crop + flip + photometric jitter.
    augment: str = setting("flip", one_of("flip", "mmseg"))
    eval_stride: int = setting(0, NON_NEGATIVE)  # slide: 0 = 2/3 of image_size (341 of 512)

    version = 1
    trains_in_loop = True

    paired_test = staticmethod(segmentation_test)  # declared in paired_tests.DECLARED too
    error_tables = staticmethod(segmentation_tables)  # declared in error_tables.DECLARED too

    @property
    def reference(self) -> dict:
        if not self.finetune:
            return {"miou": PAPER_FROZEN.get((self.fraction, self.head), {})}
        table = PAPER_FINETUNED if self.head == "linear" else PAPER_FINETUNED_UPERNET
        return {"miou": table.get(self.fraction, {})}

    def plan(self, inputs) -> list[Stage]:
        if self.finetune:
            return self.finetune_stages(inputs, self.image_size, inputs.sizes["val"])
        return super().plan(inputs)

    def metrics(self) -> list[str]:
        return ["miou", "pixel_acc"]

    def datasets(self) -> tuple[str, ...]:
        return ("ade20k",)

    def train_images(self, available: int) -> int:
        return max(1, math.ceil(available * self.fraction))

    def run(self, backbone, ctx):
        train_set, val_set = (
            open_dataset(
                "ade20k", s, ctx.data, size=self.image_size, preprocess=backbone.info.preprocess
            )
            for s in ("train", "val")
        )
        subset = hashed_subset([p.name for p in train_set.images], self.fraction, ctx.seed)
        indices = subset if subset is not None else list(range(len(train_set)))
        if self.finetune:
            predict, extra = self.fine_tuned(backbone, ctx, (train_set, val_set), indices)
        else:
            predict, extra = self.frozen(backbone, ctx, train_set, val_set, subset)
        confusion, pictures, per_image, overlaps = self.evaluate(predict, val_set)
        scores = segmentation_scores(confusion)
        intersections, unions = overlaps  # per image and class: mIoU recomputed exactly
        ctx.save_predictions(
            {
                "image": image_ids(val_set),
                **per_image,
                "intersection": intersections.tolist(),
                "union": unions.tolist(),
            }
        )
        extra |= {
            "head": self.head,
            "train_images": len(indices),
            "val_images": len(val_set),
            "classes_scored": scores["classes"],
            "eval_resolution": "annotation",
            "eval_mode": self.eval_mode,
            "augment": "none (cached features)" if extra.get("features_cached") else self.augment,
        }
        if self.eval_mode == "slide":
            extra |= {
                "eval_crop": self.image_size,
                "eval_stride": self.eval_stride or self.image_size * 2 // 3,
            }
        if path := picture_path(ctx, self.name, backbone.info.name, self.head):
            extra["picture"] = str(save_picture_grid(pictures, path))
        stderr = {
            "miou": miou_bootstrap_stderr(*overlaps, seed=derived_seed(ctx.seed, "miou-stderr"))
        }
        for metric in self.metrics():
            yield Metric(
                metric,
                scores[metric],
                stderr=stderr.get(metric),
                n=len(val_set),
                extra=extra,
            )

    def frozen(self, backbone, ctx, train_set, val_set, subset):
        """A head on the frozen backbone: trained on cached grids when they fit
        ``cache_budget_gb``, else with the backbone in the training loop (one batch of grids
        at a time; nothing held for the whole split)."""
        indices = subset if subset is not None else list(range(len(train_set)))
        info = backbone.info
        if not self.fits_cache(len(indices) + len(val_set), info.embed_dim, info.patch_size):
            predict, extra = self.trained_in_loop(backbone, ctx, (train_set, val_set), indices)
            return predict, {**extra, "dense_mode": "backbone in the loop"}
        feats, cached = dense_features(self, backbone, ctx, train_set, split="train", subset=subset)
        head = self.fit(feats, lambda j: train_set.target(indices[j]), ctx)
        device = ctx.device
        if self.eval_mode == "slide":
            windows = self.windows(val_set)
            grids, _ = dense_features(self, backbone, ctx, windows, split="val-windows")
            predict = windowed(windows, lambda ids: head(grids.take(ids, device)))
        else:
            val_feats, _ = dense_features(self, backbone, ctx, val_set, split="val")

            def predict(i: int) -> torch.Tensor:
                return head(val_feats.take([i], device))

        return predict, {"features_cached": cached, "dense_mode": "cached grids"}

    def windows(self, val_set) -> SlidingWindows:
        return SlidingWindows(
            val_set, self.image_size, self.eval_stride or self.image_size * 2 // 3
        )

    def fine_tuned(self, backbone, ctx, sets, indices):
        """Backbone and head trained end to end on randomly flipped training images, labels at
        stride 4 of the input (evalkit.protocols.finetuning)."""
        log, predict = self.train_end_to_end(backbone, ctx, sets, indices, frozen=False)
        return predict, {**finetune_extra(self, log, self.image_size), "dense_mode": "fine-tuned"}

    def trained_in_loop(self, backbone, ctx, sets, indices):
        """The head's schedule (``steps``, ``batch_size``, ``lr``) on grids computed per batch
        by the frozen backbone, from flipped training images."""
        log, predict = self.train_end_to_end(backbone, ctx, sets, indices, frozen=True)
        return predict, {"features_cached": False, "final_loss": log[-1]["loss"]}

    def train_end_to_end(self, backbone, ctx, sets, indices, *, frozen: bool):
        train_set, val_set = sets
        run = dense_end_to_end(self, backbone, ctx, frozen=frozen)
        side = 4 * (self.image_size // backbone.info.patch_size)

        def collate(items):  # label maps read and resized per batch, never held for the split
            if self.augment == "mmseg":
                views = [
                    scale_crop_flip(train_set, i, self.image_size, train_set.target(i))
                    for _, i in items
                ]
                return torch.stack([x for x, _ in views]), torch.stack(
                    [resize_labels(y, (side, side)) for _, y in views]
                )
            flips = torch.rand(len(items)) < 0.5
            images = torch.stack(
                [x.flip(-1) if f else x for (x, _), f in zip(items, flips, strict=True)]
            )
            labels = [resize_labels(train_set.target(i), (side, side)) for _, i in items]
            return images, torch.stack(
                [y.flip(-1) if f else y for y, f in zip(labels, flips, strict=True)]
            )

        def loss(logits, labels):
            return F.cross_entropy(
                resize_to(logits, labels.shape[-2:]), labels, ignore_index=IGNORE
            )

        batch = self.batch_size if frozen else self.finetune_batch_size
        subset = torch.utils.data.Subset(train_set, indices)
        batches = sampled_batches(subset, batch, ctx.seed, collate)
        log = run.train(self, batches, loss, ctx, schedule=self.head_schedule(ctx.seed))
        device = ctx.device
        if self.eval_mode == "slide":
            windows = self.windows(val_set)

            def window_logits(ids):
                return run.model(torch.stack([windows[k][0] for k in ids]).to(device))

            return log, windowed(windows, window_logits)

        def predict(i: int) -> torch.Tensor:
            return run.model(val_set[i][0][None].to(device))

        return log, predict

    def build_head(self, dims: list[int]):
        if self.head == "linear":
            return LinearSegmentation(dims, ADE_CLASSES)
        return UperNetSegmentation(dims, ADE_CLASSES, self.channels)

    def fit(self, feats, target, ctx):
        """A head on cached grids; ``target(j)`` reads the label map of the j-th grid, resized
        per batch (label maps are never held for the whole split)."""
        device = ctx.device
        head = self.new_head(feats, ctx)
        size = [4 * s for s in feats.take([0])[0].shape[-2:]]

        def step_loss(indices):
            indices = indices.sort().values  # shard order: each shard read once per batch
            logits = resize_to(head(feats.take(indices, device)), size)
            labels = torch.stack([resize_labels(target(j), size) for j in indices])
            return F.cross_entropy(logits.float(), labels.to(device), ignore_index=IGNORE)

        return self.train_head(head, step_loss, len(feats), ctx)

    @torch.no_grad()
    def evaluate(self, predict, dataset):
        """Confusion over the validation images at each annotation's resolution, the picture
        grid's first rows, and each image's own mIoU and pixel accuracy; ``predict(i)`` gives
        image i's logits."""
        confusion = np.zeros((ADE_CLASSES, ADE_CLASSES), dtype=np.int64)
        pictures, per_image = [], {"miou": [], "pixel_acc": []}
        overlaps = ([], [])  # per image: each class's intersection and union (mIoU's stderr)
        for i in range(len(dataset)):
            target = dataset.target(i)
            logits = predict(i)
            pred = resize_to(logits.float(), target.shape).argmax(1)[0].cpu().numpy()
            own = confusion_matrix(pred, target, ADE_CLASSES)
            confusion += own
            inter = np.diag(own)
            overlaps[0].append(inter)
            overlaps[1].append(own.sum(0) + own.sum(1) - inter)
            for name, value in segmentation_scores(own).items():
                if name in per_image:
                    per_image[name].append(value)
            if i < PICTURES:
                pictures.append([dataset.original(i), colour_labels(pred), colour_labels(target)])
        return confusion, pictures, per_image, tuple(np.stack(o) for o in overlaps)


def windowed(windows: SlidingWindows, logits_of):
    """``predict(i)`` for sliding-window evaluation: the logits of image i's windows
    (``logits_of(window indices)``), each upsampled to the crop, averaged where windows
    overlap, over the short-side-resized image."""

    @torch.no_grad()
    def predict(i: int) -> torch.Tensor:
        placed = windows.of_image(i)
        logits = logits_of([k for k, _, _ in placed]).float()
        crop, (height, width) = windows.crop, windows.shapes[i]
        canvas = torch.zeros(logits.shape[1], height, width, device=logits.device)
        count = torch.zeros(1, height, width, device=logits.device)
        for window, (_, top, left) in zip(resize_to(logits, (crop, crop)), placed, strict=True):
            canvas[:, top : top + crop, left : left + crop] += window
            count[:, top : top + crop, left : left + crop] += 1
        return (canvas / count)[None]

    return predict


def resize_labels(labels: np.ndarray, size) -> torch.Tensor:
    """Nearest-neighbour resize of a label map (ignore pixels stay ignored)."""
    tensor = torch.from_numpy(labels.astype(np.int64))[None, None].float()
    return F.interpolate(tensor, size=tuple(size), mode="nearest")[0, 0].long()
