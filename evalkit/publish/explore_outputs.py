"""A setup's per-image file in one shape for every classification-type family (linear probe,
kNN, few-shot, zero-shot, LiT, calibration, model-vs-human): per image its truth, the answer
shown, right or wrong and how sure a mistake was; the flips of a pair and a setup's mistakes.
Dense files keep a score per image and no right or wrong (``explore_dense``).
"""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.publish.board_reading import relative_ids

FLIPS = {  # kind → (title, whether A is right, whether B is right)
    "right-to-wrong": ("right → wrong (A right, B wrong)", True, False),
    "wrong-to-right": ("wrong → right (A wrong, B right)", False, True),
}


def columns_of(path: Path) -> set[str]:
    """The columns of a per-image file, read from its schema alone."""
    import pyarrow.parquet as pq

    return set(pq.read_schema(path).names)


def right_or_wrong(path: Path) -> bool:
    """Whether a per-image file says per image right or wrong (else it keeps scores: dense)."""
    return bool({"correct", "correct_share"} & columns_of(path))


def outputs(path: Path):
    """A setup's per-image file as one frame for every family, indexed by image key: ``image``
    (the id as saved), ``truth``, ``guess`` (what the card prints), ``right``, ``score`` (how
    sure a mistake was, for ordering; NaN where nothing says) and ``predicted`` (the class a
    mistake went to, or None where the file names none: few-shot)."""
    import pandas as pd

    frame = pd.read_parquet(path)
    columns = set(frame.columns)
    if {"category", "decision", "correct"} <= columns:
        shaped = _human(frame)
    elif "correct_share" in columns:
        shaped = _few_shot(frame)
    elif "correct" in columns:
        shaped = _classification(frame)
    else:
        raise EvalkitError(
            f"{path.name} holds no per-image right or wrong: explore shows classification-type "
            "tasks and model-vs-human (dense tasks: evalkit errors)"
        )
    ids = frame["image"].astype(str).tolist()
    if "set" in columns and frame["image"].duplicated().any():  # one stimulus in two sets
        ids = [f"{s}:{i}" for s, i in zip(frame["set"], ids, strict=True)]
    shaped.insert(0, "image", frame["image"].astype(str).to_numpy())
    shaped.index = relative_ids(ids)  # absolute ids of old files pair with today's relative ones
    return shaped


def _classification(frame):
    import numpy as np
    import pandas as pd

    truth = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    guess = frame["prediction_name"] if "prediction_name" in frame else frame["prediction"]
    if "top5_probabilities" in frame:
        score = np.array([p[0] if len(p) else np.nan for p in frame["top5_probabilities"]])
    elif "confidence" in frame:
        score = frame["confidence"].to_numpy(float)
    else:  # older files: raw scores only, which are not a confidence to print
        score = np.full(len(frame), np.nan)
    shown = [
        f"{g} ({s:.2f})" if np.isfinite(s) else str(g) for g, s in zip(guess, score, strict=True)
    ]
    return pd.DataFrame(
        {
            "truth": truth.astype(str).to_numpy(),
            "guess": shown,
            "right": frame["correct"].astype(bool).to_numpy(),
            "score": score,
            "predicted": guess.astype(str).to_numpy(),
        }
    )


def _few_shot(frame):
    """Few-shot keeps whether each draw's probe was right: an image counts as right when more
    than half its draws were, and a mistake is surer the more draws missed it."""
    import pandas as pd

    truth = frame["label_name"] if "label_name" in frame else frame["label"].astype(str)
    share = frame["correct_share"].astype(float)
    draws = [len(d) for d in frame["correct_by_seed"]] if "correct_by_seed" in frame else None
    shown = [
        f"{round(s * n)}/{n} draws right" if draws else f"{s:.0%} of draws right"
        for s, n in zip(share, draws or [0] * len(share), strict=True)
    ]
    return pd.DataFrame(
        {
            "truth": truth.astype(str).to_numpy(),
            "guess": shown,
            "right": (share > 0.5).to_numpy(),
            "score": (1.0 - share).to_numpy(),
            "predicted": [None] * len(frame),
        }
    )


def _human(frame):
    import numpy as np
    import pandas as pd

    sets = frame["set"].astype(str) if "set" in frame else [""] * len(frame)
    return pd.DataFrame(
        {
            "truth": frame["category"].astype(str).to_numpy(),
            "guess": [
                f"{d} ({s})" if s else str(d) for d, s in zip(frame["decision"], sets, strict=True)
            ],
            "right": frame["correct"].astype(bool).to_numpy(),
            "score": np.full(len(frame), np.nan),  # a decision carries no confidence
            "predicted": frame["decision"].astype(str).to_numpy(),
        }
    )


def joined(a, b):
    """The images both setups scored, in A's order, with each side's columns suffixed."""
    return a.merge(b, how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))


def flips(both, kind: str):
    _, a_right, b_right = FLIPS[kind]
    return both[(both["right_a"] == a_right) & (both["right_b"] == b_right)]


def mistakes(frame):
    """A setup's mistakes, surest first (file order where nothing says how sure)."""
    wrong = frame[~frame["right"]]
    return wrong.sort_values("score", ascending=False, kind="stable", na_position="last")
