"""The embedded stand-in of the model-vs-human benchmark, written in its layout
(evalkit.data.model_vs_human): four categories, each one class of the embedded ImageNet
stand-in (a shape with its own colour and pattern, ``categories.json``), shown in all 17 sets,
with simulated observers' trials in ``raw-data/``.

- cue-conflict: one category's shape drawn with another's colour and pattern (and a few with
  their own), so a classifier's decisions follow the shape or the texture;
- edge, silhouette, sketch: the outline, the filled outline, a jittered outline, on white;
- stylized: the shape with a random colour and pattern and blotches;
- the twelve parametric sets: the category's image under each distortion at two to four
  conditions named as the benchmark names them (greyscale, contrast, low- and high-pass,
  phase noise, a flat power spectrum, opponent colours, rotation, warps of growing reach for
  the three eidolon sets, uniform noise).

The simulated observers are not people: each follows the shape on 90 % of cue-conflict trials
and is right on the other sets with a chance that falls with the distortion's strength. They
make every human-alignment metric computable on embedded data; their values mean nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from evalkit.data.embedded import draw, write_once

# category → (shape, colour, pattern): each a class of the embedded ImageNet stand-in
CATEGORIES = {
    "circle": ("circle", "red", "solid"),
    "cross": ("cross", "green", "solid"),
    "square": ("square", "green", "striped"),
    "triangle": ("triangle", "blue", "striped"),
}
CONDITIONS = {
    "colour": ("cr", "bw"),
    "contrast": ("c100", "c30", "c10"),
    "high-pass": ("inf", "3.0", "1.0"),
    "low-pass": ("0", "3", "7"),
    "phase-scrambling": ("0", "60", "120"),
    "power-equalisation": ("0", "pow"),
    "false-colour": ("true", "false"),  # the release's spellings (its CSVs and file names)
    "rotation": ("0", "90", "180"),
    "eidolonI": ("1-10-10", "4-10-10", "16-10-10"),
    "eidolonII": ("1-3-10", "4-3-10", "16-3-10"),
    "eidolonIII": ("1-0-10", "4-0-10", "16-0-10"),
    "uniform-noise": ("0.00", "0.10", "0.35"),
}
SUBJECTS = 3


@dataclass(frozen=True)
class StimuliSpec:
    seed: int = 11
    per_category: int = 3
    size: int = 96
    shape_following: float = 0.9  # the simulated observers' shape decisions on cue-conflict

    def key(self) -> str:
        return f"model-vs-human-r2-s{self.seed}-n{self.per_category}-px{self.size}"  # r2: release spellings


def class_folder(category: str) -> str:
    return "-".join(CATEGORIES[category])


def write_stimuli(base: Path, spec: StimuliSpec = StimuliSpec()) -> Path:
    def fill(tmp: Path):
        (tmp / "categories.json").write_text(
            json.dumps({c: [class_folder(c)] for c in CATEGORIES}, indent=1)
        )
        trials = {}
        trials["cue-conflict"] = _cue_conflict(tmp, spec)
        for name in ("edge", "silhouette"):
            trials[name] = _outlines(tmp, spec, name)
        for name, conditions in CONDITIONS.items():
            trials[name] = _sessions(tmp, spec, name, conditions)
        for name in ("sketch", "stylized"):
            trials[name] = _sessions(tmp, spec, name, ("0",))
        for name, rows in trials.items():
            _write_observers(tmp, spec, name, rows)

    return write_once(Path(base) / spec.key(), fill, asdict(spec))


def _rng(spec: StimuliSpec, *keys) -> np.random.Generator:
    return np.random.default_rng([spec.seed, *(sum(map(ord, str(k))) for k in keys)])


def _cue_conflict(tmp: Path, spec: StimuliSpec) -> list[tuple]:
    """(file name, condition, category, texture) of each image written."""
    rows = []
    for shape in CATEGORIES:
        folder = tmp / "datasets" / "cue-conflict" / shape
        folder.mkdir(parents=True)
        for texture in CATEGORIES:
            count = spec.per_category if shape != texture else 1
            for i in range(1, count + 1):
                rng = _rng(spec, "cue", shape, texture, i)
                what = (CATEGORIES[shape][0], *CATEGORIES[texture][1:])
                name = f"{shape}{i}-{texture}{i}.png"
                draw(rng, spec.size, what).image.save(folder / name)
                rows.append((name, "0", shape, texture))
    return rows


def _outlines(tmp: Path, spec: StimuliSpec, kind: str) -> list[tuple]:
    rows = []
    for category, what in CATEGORIES.items():
        folder = tmp / "datasets" / kind / category
        folder.mkdir(parents=True)
        for i in range(1, spec.per_category + 1):
            mask = draw(_rng(spec, kind, category, i), spec.size, what).mask
            shape = mask if kind == "silhouette" else _outline(mask)
            name = f"{category}{i}.png"
            _save(np.where(shape[..., None], 0.0, 1.0).repeat(3, 2), folder / name)
            rows.append((name, "0", category, category))
    return rows


def _sessions(tmp: Path, spec: StimuliSpec, kind: str, conditions) -> list[tuple]:
    folder = tmp / "datasets" / kind / "dnn" / "session-1"
    folder.mkdir(parents=True)
    rows, trial = [], 0
    for condition in conditions:
        for category, what in CATEGORIES.items():
            for i in range(1, spec.per_category + 1):
                trial += 1
                rng = _rng(spec, kind, condition, category, i)
                pixels = _stimulus(rng, spec, kind, condition, what)
                name = f"{trial:04d}_{kind[:3]}_dnn_{condition}_{category}_00_{category}{i}.png"
                _save(pixels, folder / name)
                rows.append((name, condition, category, category))
    return rows


def _stimulus(rng, spec: StimuliSpec, kind: str, condition: str, what) -> np.ndarray:
    if kind == "stylized":
        colour = ("red", "green", "blue")[int(rng.integers(3))]
        drawing = draw(
            rng, spec.size, (what[0], colour, ("solid", "striped")[int(rng.integers(2))])
        )
        pixels = _float(drawing.image)
        return pixels * (0.7 + 0.6 * _blotches(rng, spec.size))[..., None]
    drawing = draw(rng, spec.size, what)
    if kind == "sketch":
        jitter = np.roll(_outline(drawing.mask), tuple(rng.integers(-2, 3, 2)), axis=(0, 1))
        lines = _outline(drawing.mask) | (jitter & (rng.random(jitter.shape) < 0.6))
        return np.where(lines[..., None], 0.2, 0.97).repeat(3, 2)
    return DISTORTIONS[kind](_float(drawing.image), condition, rng)


def _float(image: Image.Image) -> np.ndarray:
    return np.asarray(image, np.float64) / 255.0


def _save(pixels: np.ndarray, path: Path):
    Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(path)


def _outline(mask: np.ndarray) -> np.ndarray:
    inner = mask.copy()
    for axis in (0, 1):
        for shift in (-1, 1):
            inner &= np.roll(mask, shift, axis=axis)
    return mask & ~inner


def _blotches(rng, size: int) -> np.ndarray:
    field = Image.fromarray((rng.random((size // 8, size // 8)) * 255).astype(np.uint8))
    return np.asarray(field.resize((size, size), Image.BICUBIC), np.float64) / 255.0


def _grey(x: np.ndarray) -> np.ndarray:
    return (x @ np.array([0.299, 0.587, 0.114]))[..., None].repeat(3, 2)


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    image = Image.fromarray((np.clip(x, 0, 1) * 255).astype(np.uint8))
    return _float(image.filter(ImageFilter.GaussianBlur(sigma)))


def _spectral(x: np.ndarray, rng, *, phase_noise: float = 0.0, flat: bool = False) -> np.ndarray:
    """Each channel with its phases shifted by up to ``phase_noise`` degrees, or with the
    amplitude spectrum replaced by a 1/f one (``flat``)."""
    out = np.empty_like(x)
    fy, fx = np.meshgrid(np.fft.fftfreq(x.shape[0]), np.fft.fftfreq(x.shape[1]), indexing="ij")
    noise = np.deg2rad(rng.uniform(-phase_noise, phase_noise, fy.shape))
    for c in range(3):
        spectrum = np.fft.fft2(x[..., c])
        amplitude, phase = np.abs(spectrum), np.angle(spectrum) + noise
        if flat:
            radial = 1 / np.maximum(np.hypot(fy, fx), 1 / x.shape[0])
            amplitude = radial * amplitude.sum() / radial.sum()
            amplitude[0, 0] = np.abs(spectrum[0, 0])
        out[..., c] = np.real(np.fft.ifft2(amplitude * np.exp(1j * phase)))
    return out


def _warp(x: np.ndarray, reach: float, coherence: float, rng) -> np.ndarray:
    """Pixels displaced by a smooth random field of ``reach`` px (the eidolon sets' idea:
    local disarray growing with reach); ``coherence`` keeps neighbours moving together."""
    size = x.shape[0]
    smooth = max(1.0, size / 16 * (1 + coherence / 10))
    shifts = [_blur(rng.random((size, size, 3)), smooth)[..., 0] - 0.5 for _ in range(2)]
    scale = reach / max(1e-9, max(np.abs(s).max() for s in shifts))
    ys, xs = np.mgrid[:size, :size]
    rows = np.clip(np.rint(ys + shifts[0] * scale), 0, size - 1).astype(int)
    cols = np.clip(np.rint(xs + shifts[1] * scale), 0, size - 1).astype(int)
    return x[rows, cols]


def _eidolon(x, condition, rng):
    reach, coherence, _ = (float(v) for v in condition.split("-"))
    return _warp(x, reach, coherence, rng)


DISTORTIONS = {
    "colour": lambda x, c, rng: x if c == "cr" else _grey(x),
    "contrast": lambda x, c, rng: 0.5 + float(c[1:]) / 100 * (_grey(x) - 0.5),
    "high-pass": lambda x, c, rng: (
        _grey(x) if c == "inf" else 0.5 + _grey(x) - _blur(_grey(x), float(c))
    ),
    "low-pass": lambda x, c, rng: _grey(x) if c == "0" else _blur(_grey(x), float(c)),
    "phase-scrambling": lambda x, c, rng: _spectral(_grey(x), rng, phase_noise=float(c)),
    "power-equalisation": lambda x, c, rng: (
        _grey(x) if c == "0" else _spectral(_grey(x), rng, flat=True)
    ),
    "false-colour": lambda x, c, rng: x if c == "true" else np.clip(2 * _grey(x) - x, 0, 1),
    "rotation": lambda x, c, rng: np.rot90(x, int(c) // 90).copy(),
    "eidolonI": _eidolon,
    "eidolonII": _eidolon,
    "eidolonIII": _eidolon,
    "uniform-noise": lambda x, c, rng: (
        _grey(x) + rng.uniform(-float(c), float(c), x.shape[:2])[..., None]
    ),
}


def _write_observers(tmp: Path, spec: StimuliSpec, name: str, rows: list[tuple]):
    """One trial file per simulated observer, in the benchmark's columns and naming."""
    folder = tmp / "raw-data" / name
    folder.mkdir(parents=True)
    conditions = list(dict.fromkeys(condition for _, condition, _, _ in rows))
    categories = sorted(CATEGORIES)
    for subject in range(1, SUBJECTS + 1):
        rng = _rng(spec, "observer", name, subject)
        lines = ["subj,Session,trial,rt,object_response,category,condition,imagename"]
        for trial, (file, condition, category, texture) in enumerate(rows, start=1):
            if name == "cue-conflict" and category != texture:
                answer = category if rng.random() < spec.shape_following else texture
            else:
                strength = conditions.index(condition) / max(1, len(conditions) - 1)
                right = rng.random() < 0.95 - 0.45 * strength
                others = [c for c in categories if c != category]
                answer = category if right else others[int(rng.integers(len(others)))]
            image = f"{trial:04d}_{name[:3]}_s{subject:02d}_{condition}_{category}_00_{file.split('_')[-1]}"
            rt = rng.uniform(0.5, 1.5)
            lines.append(
                f"subject-{subject:02d},1,{trial},{rt:.4f},{answer},{category},{condition},{image}"
            )
        (folder / f"{name}_subject-{subject:02d}_session_1.csv").write_text("\n".join(lines) + "\n")
