"""One lazy registry for tasks and backbones, extensible through entry points.

Entries are ``module:attribute`` strings, imported only when an entry is built, so listing
names (``evalkit ls``) never imports torch or builds a model. Other packages add entries
under the entry-point groups ``evalkit.tasks`` and ``evalkit.backbones``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from evalkit.errors import EvalkitError, did_you_mean


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "package.module:attribute"
    summary: str = ""
    alias_of: str | None = None
    params: dict[str, Any] = field(default_factory=dict, hash=False)  # keyword arguments

    @property
    def canonical(self) -> str:
        """The real name: an alias names the entry it stands for."""
        return self.alias_of or self.name

    def load(self) -> Any:
        module_name, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attribute)


LISTINGS = {"task": "tasks", "backbone family": "backbones", "dataset": "datasets"}


PLUGIN = "(plugin)"  # the summary of an entry a plugin's entry point added


class Registry:
    """Names → lazily imported factories, with aliases and close-match suggestions."""

    def __init__(self, kind: str, group: str):
        self.kind = kind
        self.group = group
        self._entries: dict[str, Entry] = {}
        self._plugins_loaded = False

    def add(
        self,
        name: str,
        target: str,
        summary: str = "",
        *,
        aliases: tuple[str, ...] = (),
        **params: Any,
    ):
        """Register ``name`` → ``target``; ``params`` are the keyword arguments it is built with
        (a task variant is a class plus its settings, written once). A name (or alias) that is
        taken is refused: a second registration would silently replace the first."""
        for taken in (name, *aliases):
            if taken in self._entries:
                raise EvalkitError(
                    f"{self.kind} {taken!r} is registered twice ({self._entries[taken].target} "
                    f"and {target}): give one of them another name"
                )
        self._entries[name] = Entry(name, target, summary, params=params)
        for alias in aliases:
            self._entries[alias] = Entry(alias, target, summary, alias_of=name, params=params)

    def names(self, *, with_aliases: bool = False) -> list[str]:
        self._load_plugins()
        return sorted(n for n, e in self._entries.items() if with_aliases or e.alias_of is None)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> Entry:
        self._load_plugins()
        if name not in self._entries:
            listing = f"evalkit ls {LISTINGS.get(self.kind, 'tasks')}"
            hint = did_you_mean(name, self.names(with_aliases=True), listing)
            raise EvalkitError(f"unknown {self.kind} {name!r}: {hint}")
        return self._entries[name]

    def _load_plugins(self):
        if self._plugins_loaded:
            return
        for ep in entry_points(group=self.group):
            taken = self._entries.get(ep.name)
            if taken is not None and taken.target != ep.value:
                owner = "another plugin's" if taken.summary == PLUGIN else "evalkit's"
                raise EvalkitError(
                    f"plugin {self.kind} {ep.name!r} ({ep.value}, from "
                    f"{plugin_package(ep)}) has the name of {owner} {taken.target}: "
                    f"rename its entry point in group {self.group!r}"
                )
            self._entries.setdefault(ep.name, Entry(ep.name, ep.value, PLUGIN))
        self._plugins_loaded = True  # after the loop: a refused clash is refused every time


def plugin_package(ep) -> str:
    """The installed distribution that declares an entry point, for an error naming it."""
    dist = getattr(ep, "dist", None)
    return f"package {dist.name}" if dist is not None else "an installed package"
