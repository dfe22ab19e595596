"""Monocular depth on frozen features (paper: Waymo Open depth with DPT and linear decoders,
effect-table row 9; docs/protocols.md, "Monocular depth").

Protocol: images resized to ``image_size`` squared; patch grids of 4 evenly spaced layers
extracted once (cached); a head — ``dpt`` (DPT decoder: reassemble, fusion, head; sigmoid ×
max depth) or ``linear`` (DINOv2's linear head: 256 uniform bins, ReLU + 0.1 normalised) —
trained with DINOv2's scale-invariant log loss, sqrt(Var(g) + 0.15·mean(g)²) with
g = ln(d̂ + 1e-3) − ln(d + 1e-3), over valid ground-truth pixels at stride 4 of the input
(sparse LiDAR depth is resampled by averaging the returns that fall in each cell). Evaluation
at each ground truth's own resolution (prediction upsampled bilinearly), over valid pixels
(min_depth < d < max_depth, the dataset's crop: Garg for KITTI, the NYU crop for NYU, none for
Waymo), per image and then averaged over images: MSE in metres² (``mse``) and on natural-log
depth (``mse_log``), RMSE, AbsRel, log10, δ < 1.1 and δ < 1.25ᵏ. Whether the paper's MSE is on
depth, log-depth or normalised depth is not confirmed, so its numbers are shown labelled
"MSE units unconfirmed", for orientation only. Images without a single valid pixel are skipped and counted in the row.

Paper (MSE, Waymo): DPT ViT-e 0.024 → ViT-22B 0.021; linear 0.053 → 0.039.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evalkit.core.task import Metric, one_of, setting
from evalkit.data.dense_layouts import DEPTH, frame_size
from evalkit.data.resolve import open_dataset
from evalkit.errors import EvalkitError
from evalkit.heads.decoders import DEPTH_HEADS, DPTDepth, LinearDepth
from evalkit.metrics import DEPTH_METRICS, depth_errors, eval_crop, mean_stderr
from evalkit.protocols.error_tables import depth_tables
from evalkit.protocols.finetuning import dense_end_to_end
from evalkit.protocols.grids import (
    DenseSettings,
    colour_depth,
    dense_features,
    picture_path,
    resize_to,
    save_picture_grid,
)
from evalkit.protocols.predictions import image_ids
from evalkit.training.loop import sampled_batches

# The paper's MSE, of units it does not state: labelled so wherever it is shown.
PAPER = {
    ("waymo", "dpt"): {
        "ViT-e (MSE units unconfirmed)": 0.024,
        "ViT-22B (MSE units unconfirmed)": 0.021,
    },
    ("waymo", "linear"): {
        "ViT-e (MSE units unconfirmed)": 0.053,
        "ViT-22B (MSE units unconfirmed)": 0.039,
    },
}
LOWER_IS_BETTER = {"mse", "mse_log", "rmse", "abs_rel", "log10"}
PICTURES = 4


@dataclass(frozen=True)
class Depth(DenseSettings):
    name: str = "waymo-depth-dpt"
    error_tables = staticmethod(depth_tables)  # declared in error_tables.DECLARED too
    dataset: str = setting("waymo", one_of(*DEPTH))
    head: str = setting("dpt", one_of(*DEPTH_HEADS))
    # keep: the short side is image_size and the frame keeps its aspect (Waymo's 3:2)
    aspect: str = setting("keep", one_of("keep", "square"))
    # What the ground truth's depth is: the data set's own convention (Waymo as prepared by
    # default: range from the camera centre; KITTI, NYU: along the axis), or one named.
    depth_convention: str = setting("dataset", one_of("dataset", "range", "forward"))

    trains_in_loop = True
    version = 2  # 2: mse_log and delta1.1 added

    @property
    def reference(self) -> dict:
        return {"mse": PAPER.get((self.dataset, self.head), {})}

    def metrics(self) -> list[str]:
        return list(DEPTH_METRICS)

    def run(self, backbone, ctx):
        spec = DEPTH[self.dataset]
        train_set, val_set = (
            open_dataset(
                self.dataset, s, ctx.data, size=self.image_size, preprocess=backbone.info.preprocess
            )
            for s in ("train", "val")
        )
        convention = self.check_convention(train_set)
        if self.aspect == "keep":
            # an even number of patches along the long side: DPT halves the grid once
            size = frame_size(train_set.images, self.image_size, 2 * backbone.info.patch_size)
            train_set.size = val_set.size = size
        info = backbone.info
        if self.fits_cache(len(train_set) + len(val_set), info.embed_dim, info.patch_size):
            predict, mode = self.frozen(backbone, ctx, train_set, val_set), "cached grids"
        else:
            predict, mode = self.trained_in_loop(backbone, ctx, train_set, val_set)
        scored, pictures = self.evaluate(predict, val_set)
        per_image = [errors for _, errors in scored]
        ctx.save_predictions(
            {
                "image": [image_ids(val_set)[i] for i, _ in scored],
                **{m: [float(e[m]) for e in per_image] for m in DEPTH_METRICS},
            }
        )
        extra = {
            "head": self.head,
            "train_images": len(train_set),
            "val_images": len(val_set),
            "skipped_no_valid_pixels": len(val_set) - len(per_image),
            "mse_units": "metres^2 (mse), natural-log depth squared (mse_log)",
            "valid": f"{spec.min_depth} < depth < {spec.max_depth} m, LiDAR returns only",
            "crop": spec.crop or "none",
            "depth_convention": convention,
            "aggregation": "per image, then mean over images",
            "input_size": list(train_set.size) if self.aspect == "keep" else [self.image_size] * 2,
            "features_cached": mode == "cached grids",
            "dense_mode": mode,
        }
        if not per_image:
            raise EvalkitError(f"no validation image of {self.dataset} has a valid depth pixel")
        if path := picture_path(ctx, self.name, backbone.info.name, self.head):
            extra["picture"] = str(save_picture_grid(pictures, path))
        for metric in DEPTH_METRICS:
            values = [errors[metric] for errors in per_image]
            yield Metric(
                metric,
                float(np.mean(values)),
                higher_is_better=metric not in LOWER_IS_BETTER,
                stderr=mean_stderr(values),
                n=len(per_image),
                extra=extra,
            )

    def check_convention(self, dataset) -> str:
        """The convention scored, refusing data prepared with another one: a range map
        scored as forward depth (or back) is off by up to 1/cos of the field of view."""
        spec = DEPTH[self.dataset]
        wanted = spec.convention if self.depth_convention == "dataset" else self.depth_convention
        prepared = getattr(dataset, "prepared_convention", None)
        if prepared is not None and prepared != wanted:
            raise EvalkitError(
                f"{self.dataset} depth was prepared as {prepared!r} (provenance.json) but this "
                f"run scores {wanted!r}: pass --set depth_convention={prepared} or prepare again "
                f"with --depth {wanted}"
            )
        return wanted if prepared else f"{wanted} (assumed: the data records none)"

    def build_head(self, dims: list[int]):
        spec = DEPTH[self.dataset]
        if self.head == "linear":
            return LinearDepth(dims, min_depth=spec.min_depth, max_depth=spec.max_depth)
        return DPTDepth(dims, max_depth=spec.max_depth, channels=self.channels)

    def fit(self, feats, dataset, ctx):
        device = ctx.device
        head = self.new_head(feats, ctx)
        size = [4 * s for s in feats.take([0])[0].shape[-2:]]

        def step_loss(indices):  # depth maps read and resized per batch
            indices = indices.sort().values
            pred = resize_to(head(feats.take(indices, device)).float(), size)[:, 0]
            targets = [sparse_resize(*dataset.target(int(i)), size) for i in indices]
            depth = torch.stack([d for d, _ in targets]).to(device)
            return silog_loss(pred, depth, torch.stack([v for _, v in targets]).to(device))

        return self.train_head(head, step_loss, len(dataset), ctx)

    def frozen(self, backbone, ctx, train_set, val_set):
        """A head trained on the cached grids of the frozen backbone; returns ``predict``."""
        feats, _ = dense_features(self, backbone, ctx, train_set, split="train")
        val_feats, _ = dense_features(self, backbone, ctx, val_set, split="val")
        head, device = self.fit(feats, train_set, ctx), ctx.device
        return lambda i: head(val_feats.take([i], device))

    def trained_in_loop(self, backbone, ctx, train_set, val_set):
        """Over the cache budget: the head trained with the frozen backbone in the loop, one
        batch of grids and sparse depth targets at a time."""
        run = dense_end_to_end(self, backbone, ctx, frozen=True)
        height, width = (train_set.size,) * 2 if isinstance(train_set.size, int) else train_set.size
        side = (4 * (height // backbone.info.patch_size), 4 * (width // backbone.info.patch_size))

        def collate(items):
            targets = [
                torch.stack(sparse_resize(*train_set.target(i), side)).float() for _, i in items
            ]
            return torch.stack([x for x, _ in items]), torch.stack(targets)

        def loss(pred, targets):
            pred = resize_to(pred.float(), targets.shape[-2:])[:, 0]
            return silog_loss(pred, targets[:, 0], targets[:, 1].bool())

        batches = sampled_batches(train_set, self.batch_size, ctx.seed, collate)
        run.train(self, batches, loss, ctx, schedule=self.head_schedule(ctx.seed))
        device = ctx.device
        return (lambda i: run.model(val_set[i][0][None].to(device))), "backbone in the loop"

    @torch.no_grad()
    def evaluate(self, predict, dataset):
        """Per validation image with valid pixels: (index, errors); and the picture rows."""
        spec = DEPTH[self.dataset]
        per_image, pictures = [], []
        for i in range(len(dataset)):
            gt, valid = dataset.target(i)
            pred = predict(i).float()
            pred = (
                resize_to(pred, gt.shape)[0, 0].clamp(spec.min_depth, spec.max_depth).cpu().numpy()
            )
            errors = depth_errors(pred, gt, valid & eval_crop(gt.shape, spec.crop))
            if errors is not None:
                per_image.append((i, errors))
            if i < PICTURES:
                full = np.ones_like(valid)
                pictures.append(
                    [
                        dataset.original(i),
                        colour_depth(pred, full, spec.max_depth),
                        colour_depth(gt, valid, spec.max_depth),
                    ]
                )
        return per_image, pictures


def silog_loss(pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """DINOv2's SigLoss over valid pixels: sqrt(Var(g) + 0.15·mean(g)²)."""
    if not valid.any():
        return pred.sum() * 0.0
    g = torch.log(pred[valid] + 1e-3) - torch.log(gt[valid] + 1e-3)
    return torch.sqrt(g.var(unbiased=False) + 0.15 * g.mean() ** 2 + 1e-12)


def sparse_resize(depth: np.ndarray, valid: np.ndarray, size) -> tuple[torch.Tensor, torch.Tensor]:
    """Average the valid returns that fall in each cell of a ``size`` grid; a cell with none
    stays invalid (nearest-neighbour resizing would drop or invent LiDAR points)."""
    height, width = depth.shape
    rows, cols = np.nonzero(valid)
    cell = (rows * size[0] // height) * size[1] + cols * size[1] // width
    total = np.bincount(cell, weights=depth[rows, cols], minlength=size[0] * size[1])
    count = np.bincount(cell, minlength=size[0] * size[1])
    mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    shape = tuple(size)
    return torch.from_numpy(mean.reshape(shape)).float(), torch.from_numpy(
        (count > 0).reshape(shape)
    )
