"""The 15 ImageNet-C corruptions: shape and dtype kept, deterministic from a seed, stronger with
severity (except where the original parameters are not monotone), errors, hand checks."""

from __future__ import annotations

import numpy as np
import pytest

from evalkit.data.corruptions import CORRUPTIONS, NAMES, corrupt
from evalkit.errors import EvalkitError

# The original script's parameters do not grow monotonically for these (measured on the
# original too): glass_blur's pixel-swap distance and iterations alternate, frost and fog trade
# image weight against texture, snow's flake density depends on the draw (monotone for some
# seeds only), elastic_transform's affine jitter is largest at severity 2.
NOT_MONOTONE = {"glass_blur", "frost", "fog", "snow", "elastic_transform"}


@pytest.fixture(scope="module")
def images():
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(0)
    noise = (rng.random((4, 64, 64, 3)) * 255).astype(np.uint8)
    smooth = [Image.fromarray(a).filter(ImageFilter.GaussianBlur(2)) for a in noise]
    return np.stack([np.asarray(s) for s in smooth])


def test_the_fifteen_standard_corruptions():
    assert len(NAMES) == 15 and all(len(levels) == 5 for _, levels in CORRUPTIONS.values())


@pytest.mark.parametrize("name", NAMES)
def test_corruption_keeps_shape_dtype_and_is_seeded(images, name):
    out = corrupt(images, name, 3, seed=1)
    assert out.shape == images.shape and out.dtype == np.uint8
    assert np.array_equal(out, corrupt(images, name, 3, seed=1))
    assert corrupt(images[0], name, 3, seed=1).shape == images[0].shape
    assert np.abs(out.astype(int) - images).mean() > 0


@pytest.mark.parametrize("name", sorted(set(NAMES) - NOT_MONOTONE))
def test_corruption_grows_with_severity(images, name):
    change = [np.abs(corrupt(images, name, s).astype(float) - images).mean() for s in range(1, 6)]
    assert all(b > a for a, b in zip(change, change[1:], strict=False)), change


def test_not_monotone_corruptions_follow_the_original_parameters():
    assert CORRUPTIONS["glass_blur"][1][3] == (1.1, 3, 2)
    assert CORRUPTIONS["frost"][1][0] == (1, 0.4)
    assert CORRUPTIONS["fog"][1][2] == (2.5, 1.7)
    assert CORRUPTIONS["snow"][1][2] == (0.55, 0.3, 4, 0.9, 12, 8, 0.7)
    assert CORRUPTIONS["elastic_transform"][1][1] == pytest.approx((488, 19.52, 48.8))


def test_contrast_and_brightness_by_hand():
    image = np.array([[[100, 50, 0], [200, 150, 100]]], dtype=np.uint8)
    low = corrupt(image, "contrast", 1).astype(float)  # c = 0.4 around the channel means
    mean = image.astype(float).mean(axis=(0, 1)) / 255
    expected = np.floor(((image / 255 - mean) * 0.4 + mean) * 255)
    assert np.array_equal(low, expected)
    bright = corrupt(image, "brightness", 2).astype(float)  # V + 0.2, hue and saturation kept
    scale = (200 / 255 + 0.2) / (200 / 255)
    assert np.array_equal(bright[0, 1], np.floor(np.array([200, 150, 100]) / 255 * scale * 255))


def test_gaussian_noise_has_the_severity_std():
    grey = np.full((1, 128, 128, 3), 128, dtype=np.uint8)
    noisy = corrupt(grey, "gaussian_noise", 1).astype(float) / 255  # σ 0.08: no clipping
    assert noisy.std() == pytest.approx(0.08, rel=0.05)


def test_bad_corruption_requests_are_clear_errors(images):
    with pytest.raises(EvalkitError, match="unknown corruption 'gausian_noise'.*gaussian_noise"):
        corrupt(images, "gausian_noise", 1)
    with pytest.raises(EvalkitError, match="severity must be 1 to 5"):
        corrupt(images, "fog", 6)
    with pytest.raises(EvalkitError, match="uint8 RGB"):
        corrupt(images.astype(np.float32), "fog", 1)
