import hashlib

import pytest
from PIL import Image

from evalkit.data import DataConfig
from evalkit.data.embedded import ShapesSpec, class_names, render, write_shapes
from evalkit.data.folder import ImageFolder
from evalkit.data.resolve import open_dataset
from evalkit.errors import EvalkitError


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.png")):
        h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_embedded_shapes_are_deterministic_and_in_class_folder_layout(tmp_path):
    spec = ShapesSpec(seed=3, train_per_class=2, val_per_class=1, size=40)
    a = write_shapes(spec, tmp_path / "a")
    b = write_shapes(spec, tmp_path / "b")
    assert _digest(a) == _digest(b)
    assert len(class_names()) >= 20
    train = ImageFolder(a / "train")
    assert train.classes == sorted(class_names())
    assert len(train) == 2 * len(class_names())
    image, label = train[0]
    assert image.size == (40, 40) and label == 0


def test_embedded_seed_changes_images():
    one = render(ShapesSpec(seed=0), "train", 0, 0)
    two = render(ShapesSpec(seed=1), "train", 0, 0)
    assert one.tobytes() != two.tobytes()


def test_missing_data_dir_names_expected_layout(tmp_path):
    with pytest.raises(EvalkitError, match=r"imagenet/\{train,val\}/<class>/<image>"):
        open_dataset(
            "imagenet", "train", DataConfig(source="folder", root=tmp_path), transform=None
        )


def test_no_data_dir_at_all_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("EVALKIT_DATA", raising=False)
    with pytest.raises(EvalkitError, match="--data-dir"):
        open_dataset("imagenet", "val", DataConfig(), transform=None)


def test_empty_class_folder_is_an_error(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "dog").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "dog" / "0.png")
    with pytest.raises(EvalkitError, match="has no images"):
        ImageFolder(tmp_path)


def test_corrupt_image_error_names_the_file(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    dataset = ImageFolder(tmp_path)
    with pytest.raises(EvalkitError, match="broken.jpg"):
        dataset[0]


def test_identity_changes_when_a_file_changes(tmp_path):
    (tmp_path / "cat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "cat" / "0.png")
    before = ImageFolder(tmp_path).identity()
    Image.new("RGB", (16, 16)).save(tmp_path / "cat" / "1.png")
    assert ImageFolder(tmp_path).identity() != before


def test_hf_parquet_source_reads_same_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    spec = ShapesSpec(train_per_class=1, val_per_class=1, size=24)
    root = write_shapes(spec, tmp_path / "emb")
    folder = ImageFolder(root / "val")
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=folder.classes)}
    )
    ds = datasets.Dataset.from_dict(
        {"image": [str(p) for p, _ in folder.samples], "label": folder.labels}, features=features
    )
    (tmp_path / "data" / "imagenet" / "val").mkdir(parents=True)
    ds.to_parquet(tmp_path / "data" / "imagenet" / "val" / "part-0.parquet")
    hf = open_dataset("imagenet", "val", DataConfig(root=tmp_path / "data"), transform=None)
    assert len(hf) == len(folder) and hf.labels == folder.labels
    assert hf[3][0].tobytes() == folder[3][0].tobytes()
