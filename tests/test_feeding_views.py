"""Feeding: evaluation views cross to the device as uint8 and are normalised there with the
same bits; the tensor decoder stays within its bound of PIL's pixels and hands every file it
does not reproduce to PIL; the pixel cache serves a second backbone of the same geometry with
bitwise-equal features, and never costs a run its features."""

from __future__ import annotations

import io
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from evalkit.backbones import BackboneOptions, load_backbone
from evalkit.backbones.base import Preprocess, build_transform, model_input
from evalkit.cache import pixels as pixel_cache
from evalkit.cache.extraction import extract_features
from evalkit.cache.keys import cache_key
from evalkit.cache.settings import ExtractSettings, FeatureRequest
from evalkit.data.folder import ImageFolder
from evalkit.data.resolve import Reading
from evalkit.data.views import TENSOR_BOUND_LEVELS, EvalView, Normalised, eval_view
from evalkit.errors import EvalkitError

PRE = Preprocess()  # 224 px from 256, bicubic: a ViT-B/16's


def photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def photo_piece(seed: int, short: int = 375) -> Image.Image:
    """A crop of a real photo at an ImageNet size."""
    rng = np.random.default_rng(seed)
    photo = photos()[seed % 2]
    top, left = rng.integers(0, 100), rng.integers(0, 150)
    piece = Image.fromarray(photo[top : top + 320, left : left + 420])
    scale = short / min(piece.size)
    return piece.resize((round(piece.width * scale), round(piece.height * scale)))


def jpeg_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=options.pop("quality", 90), **options)
    return buffer.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def view(decoder: str, pre: Preprocess = PRE) -> EvalView:
    return eval_view(pre.size, pre.crop_pct, pre.interpolation, decoder=decoder)


def test_uint8_normalised_on_the_device_is_the_float_transform_bit_for_bit():
    from torchvision import transforms as T

    image = photo_piece(0)
    before = T.Compose(  # the evaluation transform every backbone had before views
        [
            T.Resize(256, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(224),
            T.ToTensor(),
            T.Normalize(PRE.mean, PRE.std),
        ]
    )(image)
    pixels = build_transform(PRE)(image)
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, 224, 224)
    assert torch.equal(model_input(pixels[None], PRE)[0], before)
    assert torch.equal(build_transform(PRE, normalised=True)(image), before)


def test_features_from_uint8_batches_equal_the_float_path(tmp_path):
    fake = load_backbone("fake")
    folder = class_folder(tmp_path / "data", count=6)
    plain = ImageFolder(folder, fake.transform())
    floats = ImageFolder(folder, Normalised(fake.transform(), (0.5,) * 3, (0.5,) * 3))
    settings = ExtractSettings(batch_size=4, progress=False)
    a = extract_features(fake, plain, request=FeatureRequest(), settings=settings, split="val")
    b = extract_features(fake, floats, request=FeatureRequest(), settings=settings, split="val")
    assert torch.equal(a.pooled, b.pooled)


def test_the_tensor_decoder_is_within_its_bound_on_photos(tmp_path):
    worst, total, count = 0, 0.0, 0
    for seed in range(12):
        path = write(tmp_path / f"{seed}.jpg", jpeg_bytes(photo_piece(seed, 333 + 15 * seed)))
        reference, fast = view("pil").read(path).int(), view("tensor").read(path).int()
        assert fast.shape == reference.shape == (3, 224, 224)
        difference = (fast - reference).abs()
        worst = max(worst, int(difference.max()))
        total, count = total + float(difference.sum()), count + difference.numel()
    assert worst <= TENSOR_BOUND_LEVELS
    assert total / count < 0.05  # almost every pixel is the same


def _cmyk(image):
    return jpeg_bytes(image.convert("CMYK"))


def _png(image):
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _palette(image):
    buffer = io.BytesIO()
    image.convert("P", palette=Image.Palette.ADAPTIVE).save(buffer, "PNG")
    return buffer.getvalue()


def _sixteen_bit(image):
    buffer = io.BytesIO()
    grey = np.asarray(image.convert("L"), dtype=np.uint16) * 257
    Image.fromarray(grey).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", [_cmyk, _png, _palette, _sixteen_bit], ids=lambda f: f.__name__)
def test_files_the_tensor_decoder_does_not_reproduce_take_the_pil_path(tmp_path, kind):
    path = write(tmp_path / "image.bin", kind(photo_piece(1)))
    assert torch.equal(view("tensor").read(path), view("pil").read(path))


def test_a_jpeg_decode_jpeg_refuses_falls_back_to_pil(tmp_path, monkeypatch):
    path = write(tmp_path / "a.jpg", jpeg_bytes(photo_piece(2)))

    def refuses(self, data):
        raise RuntimeError("unsupported marker")

    monkeypatch.setattr(EvalView, "from_jpeg", refuses)
    assert torch.equal(view("tensor").read(path), view("pil").read(path))


@pytest.mark.parametrize("options", [{"progressive": True}, {"mode": "L"}, {"exif": True}], ids=str)
def test_progressive_grey_and_rotated_jpegs_match_pil(tmp_path, options):
    image = photo_piece(3)
    if options.pop("mode", None):
        image = image.convert("L")
    if options.pop("exif", None):
        exif = Image.Exif()
        exif[0x0112] = 6  # "rotate 90°": neither path applies it
        options["exif"] = exif.tobytes()
    path = write(tmp_path / "a.jpg", jpeg_bytes(image, **options))
    reference, fast = view("pil").read(path).int(), view("tensor").read(path).int()
    assert fast.shape == reference.shape
    assert int((fast - reference).abs().max()) <= TENSOR_BOUND_LEVELS


def test_a_truncated_jpeg_is_the_same_one_line_error_by_either_decoder(tmp_path):
    data = jpeg_bytes(photo_piece(4))
    path = write(tmp_path / "broken.jpg", data[: len(data) // 2])
    for decoder in ("pil", "tensor"):
        with pytest.raises(EvalkitError, match="corrupt or unreadable image .*broken.jpg"):
            view(decoder).read(path)


def test_auto_picks_the_tensor_decoder_only_where_its_bound_holds():
    assert view("auto").decoder == "tensor"
    nearest = Preprocess(interpolation="nearest")
    assert view("auto", nearest).decoder == "pil"
    with pytest.raises(EvalkitError, match="decoder=tensor reproduces .* not nearest"):
        view("tensor", nearest)


def class_folder(root: Path, count: int, size: int = 60) -> Path:
    for i in range(count):
        piece = photo_piece(i).resize((size + 8 * i, size))
        write(root / f"c{i % 2}" / f"{i}.jpg", jpeg_bytes(piece))
    return root


@pytest.fixture()
def decodes(monkeypatch) -> list[Path]:
    """The image files decoded from here on (the loader runs in this process)."""
    decoded, real = [], EvalView.read
    monkeypatch.setattr(
        EvalView, "read", lambda self, path: decoded.append(path) or real(self, path)
    )
    return decoded


def extract(backbone, folder: Path, cache: Path | None, pixels: str = "auto", decoder="auto"):
    dataset = ImageFolder(folder, _decoding(backbone, decoder))
    dataset.reading = Reading(pixels=pixels)  # as open_dataset marks it from DataConfig.pixels
    settings = ExtractSettings(
        cache_dir=cache, batch_size=4, shard_size=4, progress=False, workers=0
    )
    return extract_features(
        backbone, dataset, request=FeatureRequest(), settings=settings, split="val"
    ).pooled


def _decoding(backbone, decoder):
    from evalkit.data.views import with_decoder

    return with_decoder(backbone.transform(), decoder)


def test_a_second_backbone_reads_the_views_and_gets_the_same_features(tmp_path, decodes):
    folder = class_folder(tmp_path / "data", count=10)
    first, second = (load_backbone("fake", BackboneOptions(seed=s)) for s in (0, 1))
    extract(first, folder, tmp_path / "cache")
    assert len(decodes) == 10
    cached = extract(second, folder, tmp_path / "cache")
    assert len(decodes) == 10  # every image came from the pixel cache
    decoded = extract(second, folder, tmp_path / "other", pixels="decode")
    assert len(decodes) == 20 and not (tmp_path / "other" / "pixels").exists()
    assert torch.equal(cached, decoded)


def test_another_geometry_or_decoder_decodes_again(tmp_path, decodes):
    folder = class_folder(tmp_path / "data", count=4)
    extract(load_backbone("fake"), folder, tmp_path / "cache")
    larger = load_backbone("fake", BackboneOptions(model_kwargs={"img_size": 48}))
    extract(larger, folder, tmp_path / "cache")
    extract(load_backbone("fake"), folder, tmp_path / "cache", decoder="pil")
    assert len(decodes) == 12
    assert len(list((tmp_path / "cache" / "pixels").iterdir())) == 3


def test_auto_keeps_views_only_where_they_fit(tmp_path, monkeypatch):
    folder = class_folder(tmp_path / "data", count=4)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 10, 10))
    extract(load_backbone("fake"), folder, tmp_path / "auto")
    assert not (tmp_path / "auto" / "pixels").exists()
    extract(load_backbone("fake"), folder, tmp_path / "asked", pixels="cache")
    assert any((tmp_path / "asked" / "pixels").rglob("shard-*.safetensors"))


def test_a_damaged_view_shard_is_decoded_again(tmp_path, capsys, decodes):
    folder = class_folder(tmp_path / "data", count=8)
    extract(load_backbone("fake"), folder, tmp_path / "cache")
    shard = sorted((tmp_path / "cache" / "pixels").rglob("shard-00001.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])
    second = load_backbone("fake", BackboneOptions(seed=1))
    features = extract(second, folder, tmp_path / "cache")
    assert len(decodes) == 8 + 4  # the damaged shard's images again, not the sound one's
    assert "unusable" in capsys.readouterr().err
    assert torch.equal(features, extract(second, folder, None))
    assert shard.exists()  # decoded again and kept again
    extract(load_backbone("fake", BackboneOptions(seed=2)), folder, tmp_path / "cache")
    assert len(decodes) == 8 + 4 + 8  # the uncached run's; the third backbone decodes none


def test_without_workers_a_thread_decodes_ahead_with_the_same_features(tmp_path, monkeypatch):
    """``--workers 0``: one thread decodes a few batches ahead of the forward; the features
    are the ones decoded in turn with the forward (the thread changes when, never what)."""
    from evalkit.cache import feed as module

    folder = class_folder(tmp_path / "data", count=10)
    ahead = extract(load_backbone("fake"), folder, None)
    calls = []
    monkeypatch.setattr(module, "decoded_ahead", lambda batches: calls.append(1) or batches)
    assert torch.equal(ahead, extract(load_backbone("fake"), folder, None)) and calls


def test_images_read_by_several_threads_give_the_features_read_in_turn(tmp_path, monkeypatch):
    """``--workers 0`` on a reader of independent files: its images are read by a few threads
    at once; the features are those of the loader reading them one after another."""
    from evalkit.cache import feed as module

    folder = class_folder(tmp_path / "data", count=10)
    calls, real = [], module.read_in_threads
    monkeypatch.setattr(
        module, "read_in_threads", lambda *args: calls.append(args[2]) or real(*args)
    )
    threaded = extract(load_backbone("fake"), folder, None)
    assert calls and all(count >= 1 for count in calls)
    monkeypatch.setattr(module, "independent_reads", lambda dataset: False)
    before = len(calls)
    in_turn = extract(load_backbone("fake"), folder, None)
    assert torch.equal(threaded, in_turn) and len(calls) == before  # the loader read these


def test_a_full_disk_for_views_warns_and_keeps_the_features(tmp_path, monkeypatch, capsys):
    from evalkit.storage import shards

    folder = class_folder(tmp_path / "data", count=8)
    real = shards.save_shard

    def full_for_views(folder, place, shard, **source):
        if "images" in shard:
            raise EvalkitError(f"no space left on the device writing {folder}")
        real(folder, place, shard, **source)

    monkeypatch.setattr(shards, "save_shard", full_for_views)
    assert extract(load_backbone("fake"), folder, tmp_path / "cache").shape[0] == 8
    assert capsys.readouterr().err.count("no longer kept") == 1


def test_the_decoder_reaches_the_feature_key_and_the_row(cli_env, tmp_path):
    from evalkit.core.runner import run
    from evalkit.core.spec import RunSpec

    fake = load_backbone("fake")
    keys = {
        cache_key(
            fake.info,
            FeatureRequest(),
            dtype="fp32",
            dataset_id=ImageFolder(class_folder(tmp_path / "d", 2), _decoding(fake, d)).identity(),
            split="val",
            subset=None,
        )
        for d in ("pil", "tensor")
    }
    assert len(keys) == 2
    spec = RunSpec.of(
        tasks="imagenet-knn", backbones="fake", data="embedded", overrides=("decoder=pil",)
    )
    assert spec.data.decoder == "pil" and spec.overrides == ()
    (result,) = run(spec)
    assert {row["decoder"] for row in result.rows} == {"pil"}


def test_a_bad_decoder_or_pixels_value_is_one_line(cli_env):
    from evalkit.core.spec import RunSpec

    with pytest.raises(EvalkitError, match="--pixels keep: expected one of auto, cache, decode"):
        RunSpec(tasks="imagenet-knn", backbones="fake", overrides=("pixels=keep",))
    with pytest.raises(EvalkitError, match="--decoder gpu: expected one of auto, pil, tensor"):
        RunSpec.of(tasks="imagenet-knn", backbones="fake", decoder="gpu")


def test_pixel_bytes_are_what_plan_counts():
    assert pixel_cache.pixel_bytes(view("tensor"), 50_000) == 50_000 * 3 * 224 * 224


def test_the_cache_commands_list_verify_and_clear_the_views(tmp_path):
    from evalkit.cache.entries import clear_cache, list_cache, verify_cache

    folder = class_folder(tmp_path / "data", count=8)
    extract(load_backbone("fake"), folder, tmp_path / "cache")
    (views,) = [e for e in list_cache(tmp_path / "cache") if e["area"] == "pixels"]
    assert views["complete"] and views["shards"] == 2 and views["n"] == 8
    assert views["backbone"] == "(pixels 32px bilinear, tensor)"
    report = verify_cache(tmp_path / "cache", progress=False)
    assert sum(r["bad"] for r in report) == 0 and len(report) == 2
    assert clear_cache(tmp_path / "cache") == 2
    assert not list_cache(tmp_path / "cache")


def test_every_image_reader_names_its_decoder_in_its_identity(tmp_path):
    from evalkit.data.multilabel import MultiLabelImages

    folder = class_folder(tmp_path / "data", count=2)
    (folder / "train.jsonl").write_text(
        '{"image": "c0/0.jpg", "labels": ["a"]}\n{"image": "c1/1.jpg", "labels": ["b"]}\n'
    )
    fake = load_backbone("fake")
    for reader in (
        lambda t: ImageFolder(folder, t, layout_hint=""),
        lambda t: MultiLabelImages(folder, "train", t),
    ):
        ids = {reader(_decoding(fake, d)).identity() for d in ("pil", "tensor")}
        assert len(ids) == 2


# --- the decoder and the pixel cache are data-reading settings, with one route ----------------


def test_the_decoder_has_one_default_and_reaches_every_opened_view(tmp_path):
    """``DataConfig`` holds the one default; a task that hands ``open_dataset`` any evaluation
    view (here one built with another decoder) reads by the run's decoder, so no task can
    forget it."""
    from evalkit.data import DataConfig
    from evalkit.data.resolve import open_dataset
    from evalkit.data.views import decoder_of

    pre = Preprocess(size=32, crop_pct=0.875, interpolation="bicubic")
    assert EvalView(32, 36, "bicubic").decoder == build_transform(pre).decoder
    assert EvalView(32, 36, "bicubic", decoder=DataConfig.decoder).decoder == "tensor"
    forgetful = build_transform(pre, decoder="pil")
    for decoder, resolved in (("pil", "pil"), ("tensor", "tensor"), ("auto", "tensor")):
        config = DataConfig(source="embedded", cache=tmp_path, decoder=decoder)
        dataset = open_dataset("imagenet", "val", config, transform=forgetful)
        assert decoder_of(dataset.transform) == resolved
    with pytest.raises(EvalkitError, match="unknown decoder 'gpu'"):
        DataConfig(decoder="gpu")


def test_the_pixel_cache_says_when_several_processes_switch_it_off(tmp_path, monkeypatch, capsys):
    from evalkit import distributed
    from evalkit.cache import extraction

    folder = class_folder(tmp_path / "data", count=4)
    dataset = ImageFolder(folder, load_backbone("fake").transform())
    settings = ExtractSettings(cache_dir=tmp_path / "cache", progress=False)
    args = (dataset, settings, FeatureRequest(), "id", "val", None, 4)
    assert extraction._pixels(*args) is not None  # one process: kept
    monkeypatch.setattr(distributed, "current", lambda: distributed.Layout(dp_size=2))
    assert extraction._pixels(*args) is None and extraction._pixels(*args) is None
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "warning: the pixel cache is off under 2 processes (ranks would have to agree on which "
        "shards it holds): images are decoded"
    ]


def torchvision_view(data: bytes, side: int, size: int, interpolation: str) -> torch.Tensor:
    """The tensor decoder's steps by torchvision's own functions."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional

    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    image = decode_jpeg(encoded, mode=ImageReadMode.RGB)
    mode = functional.InterpolationMode(interpolation)
    image = functional.resize(image, [side], interpolation=mode, antialias=True)
    return functional.center_crop(image, [size])


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("without_torchvision_library", [False, True], ids=["alone", "torchvision"])
def test_the_tensor_decoders_steps_are_torchvisions_bit_for_bit(
    interpolation, without_torchvision_library, monkeypatch
):
    """The tensor decoder decodes, resizes and crops without importing torchvision, by the
    calls torchvision's functions make: the same pixels for portrait, landscape and square
    photos, odd and even margins (the crop's anchor rounds half to even), a greyscale JPEG,
    an image already at the side, and a crop larger than the image (torchvision pads). With
    torchvision's image library not loadable alone, torchvision's decoder does it."""
    from evalkit.data import jpeg_ops

    if without_torchvision_library:
        monkeypatch.setattr(jpeg_ops, "image_operators", lambda: None)
    cases = [(375, 0, 256, 224), (375, 1, 256, 224), (301, 2, 256, 224), (256, 3, 256, 224)]
    cases += [(333, 4, 255, 225), (300, 5, 64, 96), (257, 6, 288, 288)]
    for short, seed, side, size in cases:
        piece = photo_piece(seed, short)
        if seed % 2:
            piece = piece.transpose(Image.Transpose.TRANSPOSE)  # portrait
        if seed == 6:
            piece = piece.convert("L")
        if seed == 3:
            piece = piece.crop((0, 0, short, short))
        data = jpeg_bytes(piece)
        ours = jpeg_ops.center_crop_square(
            jpeg_ops.resize_shorter_side(jpeg_ops.decode_jpeg_rgb(data), side, interpolation), size
        )
        expected = torchvision_view(data, side, size, interpolation)
        assert torch.equal(ours, expected), (short, seed, side, size)
        assert ours.stride() == expected.stride(), "laid out as torchvision lays it out"
    float_path = jpeg_ops.resize_shorter_side(jpeg_ops.decode_jpeg_rgb(data), 200, interpolation)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    if interpolation == "bilinear":  # torchvision resizes in float, then rounds, without AVX2
        from torchvision.transforms.v2 import functional

        image = jpeg_ops.decode_jpeg_rgb(data)
        mode = functional.InterpolationMode.BILINEAR
        expected = functional.resize(image, [200], interpolation=mode, antialias=True)
        assert torch.equal(jpeg_ops.resize_shorter_side(image, 200, interpolation), expected)
    else:
        assert torch.equal(
            jpeg_ops.resize_shorter_side(jpeg_ops.decode_jpeg_rgb(data), 200, interpolation),
            float_path,
        )


def test_a_run_decoding_jpegs_imports_no_torchvision(tmp_path):
    """A run whose tensor decoder reads JPEGs loads torchvision's image library alone: not
    torchvision's package, whose import loads torch's compiler (1.3 CPU-s, 170 MB a run)."""
    import subprocess
    import sys

    for split in ("train", "val"):
        for label in ("a", "b"):
            for index in range(3):
                piece = photo_piece(index + (label == "b") * 3, short=80)
                write(tmp_path / "set" / split / label / f"{index}.jpg", jpeg_bytes(piece))
    code = (
        "import sys\nfrom evalkit.cli import main\n"
        "code = main(['run', '--task', 'imagenet-knn', '--backbone', 'fake', '--set', "
        f"'dataset=folder:{tmp_path / 'set'}', '--set', 'ks=3', '--decoder', 'tensor', '--workers', '0', "
        f"'--cache-dir', '{tmp_path / 'cache'}', '--out', '{tmp_path / 'rows'}', '--quiet'])\n"
        "heavy = ('torchvision', 'torch._dynamo')\n"
        "print(code, [m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []"
