"""Video: decoding with a seek to the sampled frames against decoding every frame of the file
and converting the sampled ones (10-s clips at 30 fps, 320 px, a keyframe every 12 frames;
8 frames at stride 4 from the middle); decode + extraction clips/s with
``timm/vit_tiny_patch16_224`` and the share of that time spent decoding; and temporal-head
training steps/s on cached per-frame features against decoding and extracting every step.

Targets: the seek faster than decoding everything; training on cached features ≥ 20× the
decode-every-step baseline.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import best_time, report
from evalkit import load_backbone
from evalkit.data.clips import (
    Sampling,
    VideoClips,
    frame_indices,
    read_frames,
    render_clip,
    write_clip,
)
from evalkit.heads.temporal import HeadConfig, build_head

CLIPS, FRAMES, FPS = 8, 300, 30


def long_clip(path: Path, seed: int):
    """Ten seconds: the stand-in's motion slowed to 300 frames at 128 px."""
    short = render_clip("right", np.random.default_rng(seed))
    frames = [
        np.kron(short[i * len(short) // FRAMES], np.ones((2, 2, 1), dtype=np.uint8))
        for i in range(FRAMES)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_clip(path, frames, fps=FPS)


def decode_everything(path: Path, indices: list[int]) -> list:
    """The baseline: every frame of the file decoded, the sampled ones converted."""
    import av

    wanted, out = set(indices), []
    with av.open(str(path)) as container:
        for number, frame in enumerate(container.decode(container.streams.video[0])):
            if number in wanted:
                out.append(frame.to_image())
    return out


def main():
    torch.manual_seed(0)
    sampling = Sampling(frames=8, stride=4)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(CLIPS):
            long_clip(root / "train" / "right" / f"{i}.mp4", i)
        paths = sorted((root / "train" / "right").glob("*.mp4"))
        indices = frame_indices(FRAMES, sampling, 0)[0]
        seek_s = best_time(lambda: [read_frames(p, indices) for p in paths]) / CLIPS
        all_s = best_time(lambda: [decode_everything(p, indices) for p in paths]) / CLIPS
        backbone = load_backbone("timm/vit_tiny_patch16_224")
        clips = VideoClips(root, [(p, 0) for p in paths], ["right"], backbone.transform(), sampling)
        decode_s = best_time(lambda: [clips[i] for i in range(CLIPS)]) / CLIPS
        batch = torch.stack([clips[i][0] for i in range(CLIPS)])
        extract_s = (
            best_time(lambda: backbone.extract(batch.flatten(0, 1), layers=(-1,), pool="cls"))
            / CLIPS
        )
        cached = torch.randn(CLIPS, 8, backbone.info.embed_dim)
        head = build_head(HeadConfig("temporal", depth=2), backbone.info.embed_dim, 400, 8)
        optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)

        def step(x):
            loss = torch.nn.functional.cross_entropy(head(x), torch.zeros(len(x), dtype=torch.long))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        cached_s = best_time(lambda: step(cached))
        start = time.perf_counter()
        with torch.no_grad():
            frames = torch.stack([clips[i][0] for i in range(CLIPS)])
            again = backbone.extract(
                frames.flatten(0, 1), layers=(-1,), pool="cls"
            ).pooled.unflatten(0, (CLIPS, 8))
        step(again)
        decoding_step_s = time.perf_counter() - start
    report(
        "video",
        {
            "decode_ms_per_clip_seek": round(seek_s * 1e3, 1),
            "decode_ms_per_clip_all": round(all_s * 1e3, 1),
            "seek_speedup": round(all_s / seek_s, 1),
            "clips_per_s_decode_and_extract": round(1 / (decode_s + extract_s), 2),
            "decoding_share": round(decode_s / (decode_s + extract_s), 2),
            "head_steps_per_s_cached": round(1 / cached_s, 1),
            "head_steps_per_s_decoding_each_step": round(1 / decoding_step_s, 2),
            "head_speedup": round(decoding_step_s / cached_s, 1),
            "target": "seek_speedup > 1, head_speedup >= 20",
        },
    )


if __name__ == "__main__":
    main()
