"""One transient rich progress bar for long work (feature extraction, head training); a no-op
when disabled, so callers never branch on it. ``status`` is a format string over the fields
passed to ``update`` (e.g. ``"loss {task.fields[loss]:.4f}"``), or ``"rate"`` for items/s."""

from __future__ import annotations


class ProgressBar:
    def __init__(
        self, enabled: bool, total: int, description: str, *, status: str = "", unit: str = "img"
    ):
        self.enabled, self.total, self.description = enabled, total, description
        self.status, self.unit = status, unit

    def __enter__(self):
        if not self.enabled:
            return lambda advance=1, **fields: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            self._status_column(), TimeRemainingColumn(), transient=True,
        )  # fmt: skip
        self.bar.__enter__()
        task = self.bar.add_task(self.description, total=self.total, loss=float("nan"))
        return lambda advance=1, **fields: self.bar.update(task, advance=advance, **fields)

    def _status_column(self):
        from rich.progress import ProgressColumn, TextColumn
        from rich.text import Text

        if self.status != "rate":
            return TextColumn(self.status)
        unit = self.unit

        class RateColumn(ProgressColumn):
            def render(self, task):
                return Text(f"{task.speed:.1f} {unit}/s" if task.speed else f"… {unit}/s")

        return RateColumn()

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
