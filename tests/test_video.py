"""Video: frame sampling, PyAV decoding (seeking equals decoding everything), the Kinetics
layouts and their bad inputs, the heads on sequences whose class only their order tells, and
the task end to end with unreadable and short clips."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

pytest.importorskip("av")

from evalkit.data.clips import (  # noqa: E402
    PADDED,
    UNREADABLE,
    Sampling,
    frame_indices,
    open_clips,
    read_frames,
    render_clip,
    split_status,
    write_clip,
)
from evalkit.errors import EvalkitError  # noqa: E402


def _transform(image):
    return torch.from_numpy(np.array(image.resize((16, 16)))).permute(2, 0, 1).float() / 255


def _clip(path, motion="left", seed=0, frames=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pictures = render_clip(motion, np.random.default_rng(seed))
    write_clip(path, pictures[:frames] if frames else pictures)
    return path


# --- sampling and decoding -------------------------------------------------------------


def test_uniform_windows_are_centred_or_spread_and_short_clips_padded():
    one = Sampling(frames=4, stride=2)
    assert frame_indices(20, one, 0) == ([6, 8, 10, 12], False)
    two = Sampling(frames=4, stride=2, segments=2)
    assert frame_indices(20, two, 0)[0] == [0, 2, 4, 6]
    assert frame_indices(20, two, 1)[0] == [13, 15, 17, 19]
    assert frame_indices(5, one, 0) == ([0, 2, 4, 4], True)


def test_segment_sampling_takes_one_frame_per_segment():
    assert frame_indices(16, Sampling(frames=4, mode="segment"), 0) == ([2, 6, 10, 14], False)
    assert frame_indices(2, Sampling(frames=4, mode="segment"), 0)[1] is True


def test_seeking_reads_the_same_frames_as_decoding_everything(tmp_path):
    path = _clip(tmp_path / "a.mp4")
    for indices in ([0, 4, 8], [13, 17, 21, 25], [31]):
        sought, decoded = read_frames(path, indices), read_frames(path, indices, seek=False)
        assert sorted(sought) == indices
        for i in indices:
            assert np.array_equal(np.asarray(sought[i]), np.asarray(decoded[i]))


# --- layouts and bad input -------------------------------------------------------------


def test_class_folders_and_views(tmp_path):
    for cls in ("left", "right"):
        for i in range(2):
            _clip(tmp_path / "train" / cls / f"{i}.mp4", cls, i)
    data = open_clips(tmp_path, "train", transform=_transform, sampling=Sampling(4, 2, segments=2))
    assert data.classes == ["left", "right"] and len(data) == 8
    frames, label = data[5]  # clip 2 (right), second window
    assert frames.shape == (4, 3, 16, 16) and label == 1


def test_official_csv_layout_counts_missing_clips(tmp_path):
    rows = [
        ("label", "youtube_id", "time_start", "time_end", "split"),
        ("abseiling", "abc", "12", "22", "train"),
        ("archery", "def", "0", "10", "train"),
        ("archery", "gone", "5", "15", "train"),
    ]
    with open(tmp_path / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    _clip(tmp_path / "train" / "abc_000012_000022.mp4")
    _clip(tmp_path / "train" / "archery" / "def_000000_000010.mp4", "right")
    data = open_clips(tmp_path, "train", transform=_transform)
    assert data.classes == ["abseiling", "archery"] and data.clip_labels == [0, 1]
    assert data.skipped == {"missing clip": 1}


def test_a_csv_label_with_spaces_finds_its_underscore_folder(tmp_path):
    rows = [
        ("label", "youtube_id", "time_start", "time_end", "split"),
        ("riding a bike", "abc", "1", "11", "train"),
        ("riding a bike", "mkv", "2", "12", "train"),
    ]
    with open(tmp_path / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    _clip(tmp_path / "train" / "riding_a_bike" / "abc_000001_000011.mp4")
    _mkv_with_long_audio(tmp_path / "train" / "riding_a_bike" / "mkv_000002_000012.mkv", 12)
    data = open_clips(tmp_path, "train", transform=_transform)
    assert data.classes == ["riding a bike"] and data.clip_labels == [0, 0]
    assert data.skipped == {}


def _mkv_with_long_audio(path, frames: int, fps: int = 8, audio_seconds: float = 3.0):
    """A Matroska clip (no frame count in its header) whose audio outlasts its video."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    pictures = render_clip("left", np.random.default_rng(0))[:frames]
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        audio = container.add_stream("flac", rate=8000)
        audio.layout = "mono"
        for picture in pictures:
            container.mux(video.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(video.encode())
        samples = int(audio_seconds * 8000)
        for start in range(0, samples, 1000):
            chunk = av.AudioFrame.from_ndarray(
                np.zeros((1, 1000), np.int16), format="s16", layout="mono"
            )
            chunk.sample_rate, chunk.pts = 8000, start
            container.mux(audio.encode(chunk))
        container.mux(audio.encode())
    return path


def test_a_clip_whose_audio_outlasts_it_counts_its_own_frames(tmp_path):
    from evalkit.data.clips import VideoClips, probe

    path = _mkv_with_long_audio(tmp_path / "a" / "clip.mkv", 12)
    assert probe(path) == 12  # 24 from the container's 3 s at 8 fps
    clips = VideoClips(tmp_path, [(path, 0)], ["a"], _transform, Sampling(1, 1, "segment", 8))
    items = [clips[i] for i in range(len(clips))]
    assert all(label == 0 for _, label in items)  # readable and not padded
    ends = clips.view(path, 7)[0][0], clips.view(path, 6)[0][0]
    assert np.asarray(ends[0]).tolist() != np.asarray(ends[1]).tolist()  # no repeated frame
    window = clips.view(path, 0)  # with Sampling(1, 1, "segment", 8) frame 0's segment
    assert not window[1]


def test_a_validation_class_missing_from_train_is_an_error(tmp_path):
    _clip(tmp_path / "val" / "zebra" / "0.mp4")
    with pytest.raises(EvalkitError, match="zebra"):
        open_clips(tmp_path, "val", transform=_transform, classes=["left", "right"])


def _audio_only(path):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        container.mux(stream.encode())


def test_bad_clips_are_unreadable_items_not_crashes(tmp_path):
    good = _clip(tmp_path / "train" / "left" / "good.mp4")
    (tmp_path / "train" / "left" / "empty.mp4").write_bytes(b"")
    (tmp_path / "train" / "left" / "text.mp4").write_text("not a video")
    truncated = tmp_path / "train" / "left" / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[:600])
    _audio_only(tmp_path / "train" / "left" / "audio.mp4")
    data = open_clips(tmp_path, "train", transform=_transform, sampling=Sampling(4, 2))
    labels = {p.name: data[i][1] for i, (p, _) in enumerate(data.samples)}
    assert labels.pop("good.mp4") == 0
    assert set(labels.values()) == {UNREADABLE}, labels


def test_a_short_clip_is_padded_and_flagged(tmp_path):
    _clip(tmp_path / "train" / "left" / "short.mp4", frames=3)
    data = open_clips(tmp_path, "train", transform=_transform, sampling=Sampling(4, 2))
    frames, label = data[0]
    assert label == PADDED and torch.equal(frames[2], frames[3])
    labels, padded, unreadable = split_status(torch.tensor([label, 1, UNREADABLE]))
    assert labels.tolist() == [0, 1, UNREADABLE] and padded.tolist() == [True, False, False]


# --- heads ------------------------------------------------------------------------------


def _trend_sequences(n=256, frames=8, dim=16, seed=0):
    """Class = whether feature 0 rises or falls over time; its mean over time is the same."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen)
    ramp = torch.linspace(-1, 1, frames)[None, :] * (2 * y[:, None] - 1)
    x = torch.randn(n, frames, dim, generator=gen) * 0.3
    x[:, :, 0] += ramp * 2
    return x, y


@pytest.mark.parametrize(
    "kind, at_least, at_most", [("temporal", 0.9, 1.0), ("attentive", 0.9, 1.0), ("mean", 0.0, 0.7)]
)
def test_only_heads_that_see_frame_order_learn_a_trend(kind, at_least, at_most):
    from evalkit.heads.temporal import HeadConfig, build_head
    from evalkit.heads.train import train
    from evalkit.schedule import Schedule

    x, y = _trend_sequences()
    xt, yt = _trend_sequences(seed=1)
    head = build_head(HeadConfig(kind, width=32, depth=1), 16, 2, 8)
    train(
        head,
        lambda b: torch.nn.functional.cross_entropy(head(x[b]), y[b]),
        len(y),
        Schedule(steps=150, batch_size=64, lr=3e-3, warmup=10, b2=0.999, clip=35.0),
    )
    with torch.no_grad():
        accuracy = (head(xt).argmax(1) == yt).float().mean().item()
    assert at_least <= accuracy <= at_most


# --- the task ---------------------------------------------------------------------------


def _two_motions(root, *, train: int):
    """Kinetics-style class folders of ``grow`` and ``shrink`` clips: ``train`` per class for
    training, 2 for validation."""
    for split, count in (("train", train), ("val", 2)):
        for label, motion in enumerate(("grow", "shrink")):
            for i in range(count):
                seed = label * 10 + i + (split == "val") * 100
                _clip(root / split / motion / f"{i}.mp4", motion, seed=seed)
    return root


def test_task_end_to_end_lists_bad_clips_and_reuses_cached_frames(fake, ctx, tmp_path):
    from evalkit.data import DataConfig
    from evalkit.tasks.video import VideoClassification

    root = _two_motions(tmp_path / "data" / "kinetics400", train=4)
    (root / "val" / "grow" / "broken.mp4").write_text("not a video")
    ctx.data = DataConfig(source="folder", root=tmp_path / "data")
    task = VideoClassification(frames=4, stride=4, segments=2, steps=20, batch_size=4, warmup=2)
    rows = {m.metric: m for m in task.run(fake, ctx)}
    extra = rows["top1"].extra
    assert rows["top1"].n == 4  # the broken clip is not scored
    assert extra["unreadable"]["eval"] == {"count": 1, "clips": ["val/grow/broken.mp4"]}
    assert extra["views"] == "2 segments x 1 crops" and extra["frames"] == 4
    images = ctx.stats["images"]
    ctx.predictions = tmp_path / "predictions.parquet"
    again = {m.metric: m.value for m in task.run(fake, ctx)}
    assert again["top1"] == rows["top1"].value and ctx.stats["images"] == images
    import pandas as pd

    frame = pd.read_parquet(ctx.predictions)
    assert len(frame) == 4 and 100 * frame["correct"].mean() == pytest.approx(again["top1"])


def test_a_clip_with_one_undecodable_view_is_dropped_whole(fake, ctx, tmp_path, monkeypatch):
    from evalkit.data import DataConfig
    from evalkit.data.clips import Unreadable, VideoClips
    from evalkit.tasks.video import VideoClassification

    root = _two_motions(tmp_path / "data" / "kinetics400", train=3)
    _clip(root / "val" / "grow" / "short.mp4", "grow", seed=7, frames=6)  # both views padded
    view = VideoClips.view

    def second_view_fails(self, path, segment):
        if path.name == "1.mp4" and path.parent.name == "shrink" and segment == 1:
            raise Unreadable(f"{path}: damaged")
        return view(self, path, segment)

    monkeypatch.setattr(VideoClips, "view", second_view_fails)
    ctx.data = DataConfig(source="folder", root=tmp_path / "data")
    task = VideoClassification(frames=4, stride=4, segments=2, steps=10, batch_size=4, warmup=2)
    rows = {m.metric: m for m in task.run(fake, ctx)}
    extra = rows["top1"].extra
    assert rows["top1"].n == 4  # 5 clips, the one with a damaged view not scored
    assert extra["unreadable"]["eval"] == {"count": 1, "clips": ["val/shrink/1.mp4"]}
    assert extra["padded"]["eval"] == 1  # clips, not views


def test_video_settings_are_validated():
    from evalkit.tasks.video import VideoClassification

    for bad in ({"crops": 2}, {"depth": 5}, {"head": "lstm"}, {"frames": 0}):
        with pytest.raises(EvalkitError, match="out of range"):
            VideoClassification(**bad)
