"""Heads trained on frozen multi-layer patch grids (``(B, D, h, w)`` per tapped layer).

- ``LinearSegmentation``: DINOv2's BNHead — BatchNorm then a 1×1 conv on the last tapped
  layer (docs/protocols.md, "ADE20k"); the paper's frozen "linear" ADE20k head.
- ``UperNetSegmentation``: a ViT feature pyramid from 4 layers (×4 and ×2 transposed convs,
  identity, ×½ max-pool, channels halved per up-step as in ViTDet) feeding
  segmentation_models_pytorch's UPerNet decoder (PPM + FPN).
- ``LinearDepth``: DINOv2's linear depth head — tapped layers upsampled ×4 and concatenated,
  BatchNorm, 1×1 conv to 256 uniform bins, ReLU + 0.1 normalised, depth = Σ p·bin (§4.4).
- ``DPTDepth``: segmentation_models_pytorch's DPT decoder (reassemble 4 layers to strides
  4-32, fusion blocks) with DPT's depth head: 3×3 conv → C/2, ×2 upsample, 3×3 conv → 32,
  ReLU, 1×1 conv, then sigmoid × max depth (§4.3).
Every head returns its output at a stride of the input; callers resize it to the target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearSegmentation(nn.Module):
    def __init__(self, dims: list[int], num_classes: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(dims[-1])
        self.classifier = nn.Conv2d(dims[-1], num_classes, 1)

    def forward(self, grids: list[torch.Tensor]) -> torch.Tensor:
        return self.classifier(self.norm(grids[-1]))


def _up(channels_in: int, channels_out: int) -> list[nn.Module]:
    return [
        nn.ConvTranspose2d(channels_in, channels_out, 2, stride=2),
        nn.BatchNorm2d(channels_out),
        nn.GELU(),
    ]


class FeaturePyramid(nn.Module):
    """4 layers of one resolution → strides ×4, ×2, ×1, ×½ of the patch grid."""

    def __init__(self, dim: int):
        super().__init__()
        self.channels = [dim // 4, dim // 2, dim, dim]
        self.scales = nn.ModuleList(
            [
                nn.Sequential(
                    *_up(dim, dim // 2), nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)
                ),
                nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
                nn.Identity(),
                nn.MaxPool2d(2),
            ]
        )

    def forward(self, grids: list[torch.Tensor]) -> list[torch.Tensor]:
        return [scale(grid) for scale, grid in zip(self.scales, grids, strict=True)]


class UperNetSegmentation(nn.Module):
    def __init__(self, dims: list[int], num_classes: int, channels: int = 256):
        super().__init__()
        from segmentation_models_pytorch.decoders.upernet.decoder import UPerNetDecoder

        self.neck = FeaturePyramid(dims[0])
        # smp expects [1, 1/2, 1/4, …] feature channels and skips the first two.
        self.decoder = UPerNetDecoder(
            [3, 0, *self.neck.channels], encoder_depth=5, decoder_channels=channels
        )
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, grids: list[torch.Tensor]) -> torch.Tensor:
        return self.classifier(self.decoder([None, None, *self.neck(grids)]))


class LinearDepth(nn.Module):
    def __init__(self, dims: list[int], *, min_depth: float, max_depth: float, bins: int = 256):
        super().__init__()
        self.norm = nn.BatchNorm2d(sum(dims))
        self.classifier = nn.Conv2d(sum(dims), bins, 1)
        self.register_buffer("centres", torch.linspace(min_depth, max_depth, bins))

    def forward(self, grids: list[torch.Tensor]) -> torch.Tensor:
        # The 1×1 conv and bilinear upsampling are both linear, so they commute: classify at
        # the patch grid, then upsample the bin logits ×4 (16× cheaper). BatchNorm's batch
        # statistics are taken at the patch grid rather than the upsampled one.
        logits = self.classifier(self.norm(torch.cat(grids, dim=1)))
        size = [4 * s for s in grids[0].shape[-2:]]
        logits = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
        weights = F.relu(logits) + 0.1
        weights = weights / weights.sum(dim=1, keepdim=True)
        return (weights * self.centres[None, :, None, None]).sum(dim=1, keepdim=True)


class DPTDepth(nn.Module):
    def __init__(self, dims: list[int], *, max_depth: float, channels: int = 256):
        super().__init__()
        from segmentation_models_pytorch.decoders.dpt.decoder import DPTDecoder

        self.decoder = DPTDecoder(
            encoder_out_channels=tuple(dims),
            # smp derives the resampling from stride / 4, 8, 16, 32; 16 gives DPT's ×4, ×2,
            # ×1, ×½ of the patch grid whatever the patch size (14 would give ×3.5 …).
            encoder_output_strides=(16,) * len(dims),
            encoder_has_prefix_tokens=False,
            readout="ignore",
            intermediate_channels=tuple(
                max(channels // 4, d // 8) * 2**i for i, d in enumerate(dims)
            ),
            fusion_channels=channels,
        )
        self.head = nn.Sequential(
            nn.Conv2d(channels, channels // 2, 3, padding=1),
            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
            nn.Conv2d(channels // 2, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 1, 1),
        )
        self.max_depth = max_depth

    def forward(self, grids: list[torch.Tensor]) -> torch.Tensor:
        fused = self.decoder(grids, [None] * len(grids))
        return torch.sigmoid(self.head(fused)) * self.max_depth


SEGMENTATION_HEADS = ("linear", "upernet")
DEPTH_HEADS = ("linear", "dpt")
