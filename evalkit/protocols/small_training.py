"""What the small-scale ablations share (QK-norm stability and learning rate, bias and parallel
efficiency, distillation's student): the sizes of the built-in family they train, as a checked
setting, and the small image sets they train on, held in memory."""

from __future__ import annotations

import torch

from evalkit.core.task import Rule
from evalkit.data.resolve import open_dataset
from evalkit.models.vit22b import SIZES

SIZE = Rule(f"a size of the built-in family ({', '.join(SIZES)})", lambda v: v in SIZES)


def load_images(task, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of ``task.split`` of ``task.dataset`` at ``task.image`` px, in memory (the
    ablations train small models on small sets)."""
    from torchvision import transforms as T

    transform = T.Compose(
        [T.Resize((task.image, task.image)), T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)]
    )
    data = open_dataset(task.dataset, task.split, ctx.data, transform=transform)
    pairs = [data[i] for i in range(len(data))]
    return torch.stack([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
