"""Every preprocessing a model's config names is the library's own: for every distinct (crop
mode, crop fraction, interpolation, size) among all pretrained configs of the installed timm,
evalkit's evaluation view gives the pixels of ``timm.data.create_transform`` on real photos —
bit for bit with the ``pil`` decoder, within ``TENSOR_BOUND_LEVELS`` with ``tensor`` — and a
config it cannot reproduce is refused by name; open_clip's resize modes likewise."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_feeding_views import photos

from evalkit.backbones.base import build_transform
from evalkit.backbones.open_clip_backbone import open_clip_preprocess
from evalkit.backbones.timm_backbone import timm_preprocess
from evalkit.data.views import TENSOR_BOUND_LEVELS
from evalkit.errors import EvalkitError


def distinct_configs() -> dict[tuple, dict]:
    """One resolved data config per distinct preprocessing among every pretrained config."""
    import timm

    found = {}
    for name in timm.list_pretrained():
        cfg = timm.data.resolve_data_config(
            pretrained_cfg=timm.models.get_pretrained_cfg(name).to_dict()
        )
        key = (cfg.get("crop_mode"), cfg["crop_pct"], cfg["interpolation"], cfg["input_size"])
        found.setdefault(key, cfg | {"name": name})
    return found


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> list[tuple[Image.Image, bytes]]:
    """Real photos in three shapes (landscape, portrait, a small crop), as JPEG files."""
    folder = tmp_path_factory.mktemp("photos")
    out = []
    for i, image in enumerate(
        [
            Image.fromarray(photos()[0]),
            Image.fromarray(photos()[1]).transpose(Image.Transpose.ROTATE_90),
            Image.fromarray(photos()[0][40:250, 100:420]),
        ]
    ):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=92)
        (folder / f"{i}.jpg").write_bytes(buffer.getvalue())
        out.append((Image.open(folder / f"{i}.jpg").convert("RGB"), folder / f"{i}.jpg"))
    return out


def test_every_timm_preprocessing_gives_timms_pixels_or_is_refused_by_name(pictures):
    import timm

    configs = distinct_configs()
    modes = {key[0] for key in configs}
    assert {"center", "squash"} <= modes and len(configs) > 50  # the walk is over all of them
    honoured = refused = 0
    for key, cfg in configs.items():
        size = tuple(cfg["input_size"][-2:])
        try:
            pre = timm_preprocess(cfg["name"], cfg, size)
        except EvalkitError as exc:
            assert cfg["name"] in str(exc)
            assert cfg.get("crop_mode") not in ("center", "squash", None) or size[0] != size[1]
            refused += 1
            continue
        honoured += 1
        theirs = timm.data.create_transform(
            **{k: v for k, v in cfg.items() if k != "name"}, use_prefetcher=True
        )
        for image, path in pictures:
            expected = torch.as_tensor(np.asarray(theirs(image)))
            pil = build_transform(pre, decoder="pil")
            assert torch.equal(pil(image), expected), (key, path.name)
            if pre.interpolation in ("bicubic", "bilinear") and pre.crop_mode == "center":
                tensor = build_transform(pre, decoder="tensor").read(path)
                gap = (tensor.int() - expected.int()).abs().max()
                assert gap <= TENSOR_BOUND_LEVELS, (key, path.name, int(gap))
    assert honoured > 100 and refused >= 1


def test_a_squashing_config_is_squashed_and_a_border_one_refused():
    cfg = {"crop_pct": 1.0, "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3}
    squash = timm_preprocess(
        "timm/convnext_tiny.fb_in22k_ft_in1k_384", cfg | {"crop_mode": "squash"}, (384, 384)
    )
    assert squash.crop_mode == "squash"
    wide = Image.new("RGB", (400, 200))
    wide.paste((255, 0, 0), (0, 0, 50, 200))  # a red band on the left: squashed, it stays
    view = build_transform(squash, decoder="pil")(wide)
    assert view.shape == (3, 384, 384) and int(view[0, 192, 5]) > 200
    assert build_transform(squash, decoder="auto").decoder == "pil"  # the bound is not met
    with pytest.raises(EvalkitError, match="where it can be 8 levels apart"):
        build_transform(squash, decoder="tensor")
    with pytest.raises(EvalkitError, match=r"timm/x: its preprocessing has crop_mode='border'"):
        timm_preprocess("timm/x", cfg | {"crop_mode": "border"}, (224, 224))
    with pytest.raises(EvalkitError, match="non-square input 1024×768"):
        timm_preprocess("timm/y", cfg | {"crop_mode": "squash"}, (1024, 768))


@pytest.mark.parametrize("mode", ["shortest", "squash"])
def test_open_clips_resize_modes_give_its_pixels(pictures, mode):
    from open_clip.transform import image_transform

    cfg = {"resize_mode": mode, "interpolation": "bicubic"}
    pre = open_clip_preprocess("open_clip/x", cfg, 224)
    theirs = image_transform(224, is_train=False, resize_mode=mode, interpolation="bicubic")
    for image, _ in pictures:
        expected = theirs(image)
        ours = build_transform(pre, decoder="pil", normalised=True)(image)
        assert torch.equal(ours, expected)


def test_open_clips_longest_mode_is_refused_by_name():
    with pytest.raises(
        EvalkitError, match="open_clip/x: its preprocessing has resize_mode='longest'"
    ):
        open_clip_preprocess("open_clip/x", {"resize_mode": "longest"}, 224)
