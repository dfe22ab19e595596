"""Video clips for classification on frozen backbones (effect-table row 10; docs/protocols.md,
"Video"): Kinetics-400/600/700 and Moments in Time, decoded with PyAV.

Layouts (under the data root):

- ``kinetics400/{train,val}/<class>/<clip>.mp4`` (also ``kinetics600``, ``kinetics700``), or
  ``kinetics400/{train,val}.csv`` with the official columns ``label,youtube_id,time_start,
  time_end,split`` and the clips as ``kinetics400/<split>/[<label>/]<youtube_id>_<start>_<end>
  .mp4`` (start and end zero-padded to 6 digits, as the official downloader names them);
- ``Moments_in_Time_Raw/{training,validation}/<class>/<clip>.mp4``.

A clip is read as views: ``segments`` temporal windows × ``crops`` spatial crops (1: the
backbone's centre crop; 3: left/centre/right squares, or top/centre/bottom). A window is
``frames`` frames ``stride`` apart (``uniform``), or the middle frame of each of ``frames``
equal segments of the clip (``segment``). Decoding seeks to the keyframe before the first
wanted frame and decodes forward only to the last one. Items are ``(frames (T, C, H, W),
label)``, one per (clip, view). A clip that cannot be decoded gets label ``UNREADABLE`` and is
dropped (every view of it) and listed where its features are used; a clip shorter than the
window is padded by repeating its last frame, and its label carries ``PADDED``
(``split_status`` separates them). A CSV row finds its clip with any video suffix, flat or
under its label's folder (spaces in the label as spaces or underscores).
"""

from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from evalkit.data import DataKind
from evalkit.data.folder import class_index
from evalkit.data.resolve import identity_options
from evalkit.errors import EvalkitError
from evalkit.storage.identity import files_identity

VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v"}
UNREADABLE = -1
PADDED = 1 << 24  # added to the label of a padded view: class indices stay below it
MODES = ("uniform", "segment")


@dataclass(frozen=True)
class Sampling:
    frames: int = 8
    stride: int = 4
    mode: str = "uniform"
    segments: int = 1  # temporal views
    crops: int = 1  # spatial views: 1 or 3

    @property
    def views(self) -> int:
        return self.segments * self.crops


class Unreadable(Exception):
    """A clip PyAV cannot decode (corrupt, truncated, empty, audio only, not a video)."""


def split_status(labels: torch.Tensor):
    """(class labels, padded mask, unreadable mask) of a feature set's encoded labels."""
    unreadable = labels == UNREADABLE
    padded = labels >= PADDED
    return torch.where(padded, labels - PADDED, labels), padded, unreadable


def frame_indices(total: int, sampling: Sampling, segment: int) -> tuple[list[int], bool]:
    """The frames of temporal view ``segment`` of a clip of ``total`` frames, and whether the
    clip was too short (its last frame repeated)."""
    t = sampling.frames
    if sampling.mode == "segment":
        edges = np.linspace(0, total, t + 1)
        offset = (segment + 0.5) / sampling.segments
        starts, widths = edges[:-1], np.diff(edges)
        picked = [min(total - 1, int(a + offset * w)) for a, w in zip(starts, widths, strict=True)]
        return picked, total < t
    window = (t - 1) * sampling.stride + 1
    if total < window:
        kept = [i * sampling.stride for i in range(t) if i * sampling.stride < total]
        return kept + [kept[-1]] * (t - len(kept)), True
    spare = total - window
    start = (
        spare // 2 if sampling.segments == 1 else round(segment * spare / (sampling.segments - 1))
    )
    return [start + i * sampling.stride for i in range(t)], False


def _av():
    try:
        import av
    except ImportError as exc:
        raise EvalkitError("video tasks need PyAV: pip install 'evalkit[video]'") from exc
    return av


def probe(path: Path) -> int:
    """The clip's frame count (see ``_frame_count``)."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            return _frame_count(container, _video_stream(container, path), path)
    except (av.error.FFmpegError, OSError, ValueError, TypeError) as exc:
        raise Unreadable(f"{path}: {exc.__class__.__name__}") from exc


def _frame_count(container, stream, path: Path) -> int:
    """The header's frame count; a container that keeps none (Matroska, WebM) has its video
    packets counted, without decoding them: a duration × frame rate estimate takes the
    longest stream's duration, and an audio track that outlasts the video would add frames
    that never decode."""
    if stream.frames:
        return int(stream.frames)
    return _packet_count(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=65536)
def _packet_count(path: str, mtime_ns: int) -> int:
    """A clip's video packets, counted once per file version: every temporal view of a clip
    asks for its length, and counting reads the whole file."""
    with _av().open(path) as counting:
        return sum(1 for packet in counting.demux(counting.streams.video[0]) if packet.size)


def _video_stream(container, path: Path):
    if not container.streams.video:
        raise Unreadable(f"{path}: no video stream")
    return container.streams.video[0]


def read_frames(path: Path, indices, *, seek: bool = True) -> dict[int, Image.Image]:
    """The frames at ``indices`` — a list, or a function of the clip's frame count that
    returns it — as RGB images, from one open of the file; ``seek`` jumps to the keyframe
    before the first one instead of decoding from the start."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            stream = _video_stream(container, path)
            if callable(indices):
                indices = indices(_frame_count(container, stream, path))
            found = _decode(container, stream, indices, seek)
    except (av.error.FFmpegError, OSError, ValueError, TypeError) as exc:
        raise Unreadable(f"{path}: {exc.__class__.__name__}") from exc
    if not found:
        raise Unreadable(f"{path}: no frame decoded")
    return found


def _decode(container, stream, indices: list[int], seek: bool) -> dict[int, Image.Image]:
    wanted, found = set(indices), {}
    rate, base = float(stream.average_rate), float(stream.time_base)
    start = stream.start_time or 0
    if seek and min(indices) > 0:
        container.seek(start + int(min(indices) / rate / base), stream=stream, backward=True)
    for frame in container.decode(stream):
        index = (
            int(round((frame.pts - start) * base * rate)) if frame.pts is not None else len(found)
        )
        if index in wanted and index not in found:
            # one scaling thread: FFmpeg's pool of scaling threads, once made in a process,
            # is inherited dead by a forked loader worker, which then waits on it for ever
            found[index] = frame.to_image(threads=1)
        if index >= max(indices):
            break
    return found


def nearest_frames(found: dict[int, Image.Image], indices: list[int]) -> list[Image.Image]:
    """Each wanted frame, or the nearest decoded one (a frame count from the header can
    overstate what decodes)."""
    keys = sorted(found)
    return [found[i] if i in found else found[min(keys, key=lambda k: abs(k - i))] for i in indices]


def square_crop(image: Image.Image, crop: int, crops: int) -> Image.Image:
    """Spatial view ``crop`` of ``crops``: with 3, a square at the start, middle and end of
    the long side; with 1, the whole frame (the transform crops the centre)."""
    if crops == 1:
        return image
    w, h = image.size
    side, spare = min(w, h), abs(w - h)
    offset = round(crop * spare / (crops - 1))
    box = (offset, 0, offset + side, side) if w >= h else (0, offset, side, offset + side)
    return image.crop(box)


class VideoClips(torch.utils.data.Dataset):
    """Clips with their class labels, read as ``sampling.views`` items each."""

    def __init__(self, root: Path, samples, classes, transform, sampling: Sampling):
        self.root, self.samples, self.classes = root, samples, classes
        self.transform, self.sampling = transform, sampling
        self.clip_labels = [label for _, label in samples]
        self.labels = [label for label in self.clip_labels for _ in range(sampling.views)]
        self.skipped: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.samples) * self.sampling.views

    def __getitem__(self, index: int):
        clip, view = divmod(index, self.sampling.views)
        segment, crop = divmod(view, self.sampling.crops)
        path, label = self.samples[clip]
        try:
            frames, padded = self.view(path, segment)
        except Unreadable:
            blank = self.transform(Image.new("RGB", (64, 64)))
            return blank.expand(self.sampling.frames, *blank.shape).clone(), UNREADABLE
        images = [self.transform(square_crop(f, crop, self.sampling.crops)) for f in frames]
        return torch.stack(images), label + (PADDED if padded else 0)

    def view(self, path: Path, segment: int) -> tuple[list[Image.Image], bool]:
        """One temporal view: the header's frame count and the frames, from one open."""
        chosen = {}

        def pick(total: int) -> list[int]:
            if total == 0:
                raise Unreadable(f"{path}: no frames")
            chosen["indices"], chosen["padded"] = frame_indices(total, self.sampling, segment)
            return chosen["indices"]

        found = read_frames(path, pick)
        return nearest_frames(found, chosen["indices"]), chosen["padded"]

    def check_file(self, path: Path) -> str | None:
        """``check-data``: whether the clip's header opens and it has frames."""
        try:
            return None if probe(path) else f"clip {path} has no frames"
        except Unreadable as exc:
            return f"unreadable clip {exc}"

    def identity(self) -> str:
        extra = ",".join(map(str, self.clip_labels)) + f"|{self.sampling}|{self.transform!r}"
        return files_identity(
            [p for p, _ in self.samples], self.root, **identity_options(self), extra=extra
        )


# --- layouts ----------------------------------------------------------------------------


def open_clips(
    root: Path,
    split: str,
    *,
    source: str = "auto",
    transform=None,
    classes=None,
    sampling: Sampling = Sampling(),
):
    """Class folders, or (Kinetics) the official CSV beside a folder of clips."""
    listing = root / f"{split}.csv"
    if listing.exists():
        samples, own, missing = _from_csv(root, split, listing)
    else:
        samples, own, missing = _from_folders(root / split)
    to_reference = class_index(own, classes, where=f"{root / split}")
    dataset = VideoClips(
        root,
        [(p, to_reference[label]) for p, label in samples],
        list(classes) if classes is not None else own,
        transform,
        sampling,
    )
    dataset.skipped = {"missing clip": missing} if missing else {}
    return dataset


def _from_folders(folder: Path):
    if not folder.is_dir():
        raise EvalkitError(
            f"video folder not found: {folder} (expected {folder}/<class>/<clip>.mp4)"
        )
    clips = sorted(p for p in folder.glob("*/*") if p.suffix.lower() in VIDEO_SUFFIXES)
    if not clips:
        raise EvalkitError(
            f"no clips in {folder} (expected <class>/<clip> with {', '.join(sorted(VIDEO_SUFFIXES))})"
        )
    own = sorted({p.parent.name for p in clips})
    return [(p, own.index(p.parent.name)) for p in clips], own, 0


def _from_csv(root: Path, split: str, listing: Path):
    """Rows of Kinetics' CSV; a row whose clip is not on disk is counted, not fatal."""
    try:
        rows = list(csv.DictReader(io.StringIO(listing.read_text(encoding="utf-8"))))
    except UnicodeDecodeError as exc:
        raise EvalkitError(f"{listing} is not UTF-8 text: re-encode it") from exc
    needed = {"label", "youtube_id", "time_start", "time_end"}
    if not rows or not needed <= set(rows[0]):
        raise EvalkitError(
            f"{listing} needs the columns label,youtube_id,time_start,time_end[,split]"
        )
    own = sorted({row["label"] for row in rows})
    samples, missing = [], 0
    for row in rows:
        path = _clip_path(root / split, row)
        if path is None:
            missing += 1
        else:
            samples.append((path, own.index(row["label"])))
    if not samples:
        raise EvalkitError(f"none of the {len(rows)} clips of {listing} is under {root / split}")
    return samples, own, missing


def _clip_path(folder: Path, row: dict) -> Path | None:
    """The row's clip, flat or under its label's folder; the official CSVs spell labels with
    spaces ("riding a bike") and the usual download scripts name folders with underscores."""
    stem = (
        f"{row['youtube_id']}_{int(float(row['time_start'])):06d}_{int(float(row['time_end'])):06d}"
    )
    label = row["label"]
    for parent in (folder, folder / label, folder / label.replace(" ", "_")):
        for suffix in sorted(VIDEO_SUFFIXES):
            if (parent / f"{stem}{suffix}").is_file():
                return parent / f"{stem}{suffix}"
    return None


# --- the embedded stand-in --------------------------------------------------------------

MOTIONS = ("left", "right", "up", "down", "clockwise", "anticlockwise", "grow", "shrink")
CLIP_FRAMES, CLIP_SIZE, CLIP_FPS = 32, 64, 8
PER_CLASS = {"train": 48, "val": 8}


def render_clip(motion: str, rng) -> list[np.ndarray]:
    """A shape moving, turning or changing size over a still noisy background; shape,
    colour, start and speed are random, so only the change between frames tells the class."""
    from evalkit.data.embedded import COLOURS, _mask

    size = CLIP_SIZE
    background = np.clip(rng.normal(120, 8, (size, size, 3)) + rng.uniform(-30, 30, 3), 0, 255)
    shape = ("triangle", "square", "cross")[rng.integers(3)]
    colour = np.array(list(COLOURS.values())[rng.integers(3)], dtype=float)
    speed = rng.uniform(0.8, 1.2)
    centre = rng.uniform(0.4, 0.6, 2) * size
    radius, angle = size * rng.uniform(0.18, 0.26), rng.uniform(0, 2 * math.pi)
    step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}.get(motion, (0, 0))
    frames = []
    for t in range(CLIP_FRAMES):
        progress = t - CLIP_FRAMES / 2
        where = centre + np.array(step) * speed * progress
        spin = {"clockwise": 1, "anticlockwise": -1}.get(motion, 0) * 0.12 * speed * progress
        scale = {"grow": 1, "shrink": -1}.get(motion, 0) * 0.025 * speed * progress
        inside = _mask(size, shape, where, radius * (1 + scale), angle + spin)
        frames.append(np.where(inside[..., None], colour, background).astype(np.uint8))
    return frames


def write_clip(path: Path, frames: list[np.ndarray], fps: int = CLIP_FPS):
    av = _av()
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        stream.options = {"qscale": "3"}
        for array in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())


def write_motions(base: Path, names: tuple[str, str] = ("train", "val")) -> Path:
    """The stand-in, its training and validation splits under ``names``."""
    from evalkit.data.embedded import write_once

    def fill(tmp: Path):
        for (split, count), name in zip(PER_CLASS.items(), names, strict=True):
            for label, motion in enumerate(MOTIONS):
                folder = tmp / name / motion
                folder.mkdir(parents=True)
                for index in range(count):
                    rng = np.random.default_rng([11, list(PER_CLASS).index(split), label, index])
                    write_clip(folder / f"{index:04d}.mp4", render_clip(motion, rng))

    spec = {"kind": "motions", "frames": CLIP_FRAMES, "size": CLIP_SIZE, **PER_CLASS}
    key = f"motions-s11-f{CLIP_FRAMES}-t{PER_CLASS['train']}-{names[0]}"
    return write_once(Path(base) / key, fill, spec)


def _kinetics(name: str) -> DataKind:
    return DataKind(
        name=name,
        dirname=name,
        write_embedded=write_motions,
        open_split=open_clips,
        layout=f"{name}/{{train,val}}/<class>/<clip>.mp4 or {name}/{{train,val}}.csv + clips",
        targets="clips",
    )


KINETICS400 = _kinetics("kinetics400")
KINETICS600 = _kinetics("kinetics600")
KINETICS700 = _kinetics("kinetics700")
MOMENTS = DataKind(
    name="moments",
    dirname="Moments_in_Time_Raw",
    write_embedded=lambda base: write_motions(base, ("training", "validation")),
    open_split=open_clips,
    targets="clips",
    layout="Moments_in_Time_Raw/{training,validation}/<class>/<clip>.mp4",
)
