"""Progress of long work (feature extraction, head training, checks, preparation) where users
run it: a transient rich bar with rate and time left in a terminal, and a plain line every few
seconds (stage, done/total, rate, time left) when stderr is a file, a pipe or a CI log, where a
bar would print nothing useful. A no-op when disabled, so callers never branch on it.

``status`` is a format string over the fields passed to ``update`` (e.g.
``"loss {task.fields[loss]:.4f}"``); ``"rate"`` (items per second) is accepted for old callers
and adds nothing, as every view shows the rate.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

LINE_SECONDS = 5.0  # how often a non-terminal gets a line; EVALKIT_PROGRESS_SECONDS overrides


def _nothing(advance=1, **fields):
    return None


class ProgressBar:
    def __init__(
        self, enabled: bool, total: int, description: str, *, status: str = "", unit: str = "img"
    ):
        self.enabled, self.total, self.description = enabled, total, description
        self.status = "" if status == "rate" else status
        self.unit = unit
        self.view = None

    def __enter__(self):
        if not self.enabled:
            return _nothing
        stream = sys.stderr
        terminal = getattr(stream, "isatty", lambda: False)()
        self.view = (TerminalBar if terminal else ProgressLines)(self, stream)
        return self.view.advance

    def __exit__(self, *exc):
        if self.view is not None:
            self.view.close(failed=exc[0] is not None)


class TerminalBar:
    """rich's transient bar: description, bar, done/total, rate, status, time left."""

    def __init__(self, spec: ProgressBar, stream):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
        columns += [_rate_column(spec.unit), TextColumn(spec.status), TimeRemainingColumn()]
        self.bar = Progress(*columns, transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task(spec.description, total=spec.total, loss=float("nan"))

    def advance(self, advance=1, **fields):
        self.bar.update(self.task, advance=advance, **fields)

    def close(self, failed: bool):
        self.bar.__exit__(None, None, None)


def _rate_column(unit: str):
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.1f} {unit}/s" if task.speed else f"… {unit}/s")

    return RateColumn()


class ProgressLines:
    """One line every ``EVALKIT_PROGRESS_SECONDS`` (default 5) to a stream that is not a
    terminal, and a last line with the total time when any line was written."""

    def __init__(self, spec: ProgressBar, stream):
        self.spec, self.stream = spec, stream
        self.every = float(os.environ.get("EVALKIT_PROGRESS_SECONDS", LINE_SECONDS))
        self.start = self.last = time.monotonic()
        self.done, self.fields, self.lines = 0, {"loss": float("nan")}, 0

    def advance(self, advance=1, **fields):
        self.done += advance
        self.fields.update(fields)
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.write(self.line(now))

    def line(self, now: float) -> str:
        spec, elapsed = self.spec, now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        text = f"{spec.description}: {self.done:,}/{spec.total:,}"
        if spec.total:
            text += f" ({self.done / spec.total:.0%})"
        text += f", {rate:,.1f} {spec.unit}/s"
        if rate > 0 and spec.total:
            text += f", about {duration(max(spec.total - self.done, 0) / rate)} left"
        status = self.status_text()
        return f"{text}, {status}" if status else text

    def status_text(self) -> str:
        if not self.spec.status:
            return ""
        try:
            return self.spec.status.format(task=SimpleNamespace(fields=self.fields)).strip()
        except (KeyError, ValueError, TypeError):
            return ""

    def write(self, text: str):
        self.lines += 1
        print(text, file=self.stream, flush=True)

    def close(self, failed: bool):
        if not self.lines:
            return
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        end = "stopped" if failed else "done"
        counted = f"{self.done:,}/{self.spec.total:,}"
        speed = f"{rate:,.1f} {self.spec.unit}/s"
        self.write(f"{self.spec.description}: {end}, {counted} in {duration(elapsed)} ({speed})")


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: how a person reads a wait."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
