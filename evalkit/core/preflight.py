"""What ``evalkit run`` refuses before it imports torch: an unknown task or suite, a ``--set``
that is not ``key=value`` or names no setting of its task, a malformed ``--model-arg`` and a
backbone that names no family (or no model where its family needs one).

Importing torch and timm takes half a minute on a loaded machine, so a typo must not wait for
it. The settings of a built-in task are read from its class's source (the dataclass fields of
the class and its bases), which imports nothing; where that reading cannot follow a base class
it says nothing, and the task's own check, after the imports, still refuses the key.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

from evalkit.errors import EvalkitError, did_you_mean


def check_run_args(args) -> None:
    """The cheap checks of an ``evalkit run`` command line (``args`` from its parser)."""
    from evalkit.backbones import check_backbone_name
    from evalkit.backbones.options import parse_model_args
    from evalkit.core.suites import expand

    tasks = expand(args.tasks)
    for name in tasks:
        check_task(name, args.overrides)
    parse_model_args(args.model_args)
    for spec in args.backbones if len(tasks) == 1 else []:  # a zoo's fail their own cells
        check_backbone_name(spec)


def check_task(name: str, overrides: list[str]) -> None:
    """``name`` is a registered task, and its settings (bracketed and ``--set``) are
    ``key=value`` pairs naming its settings where its source says which they are."""
    from evalkit.core.catalog import TASKS, task_settings

    base, inline = task_settings(name)
    entry = TASKS.get(base)
    settable = setting_names(entry.target)
    for pair in [*inline, *overrides]:
        key, sep, _ = pair.partition("=")
        if not sep:
            raise EvalkitError(f"--set expects key=value, got {pair!r}")
        if settable is not None and key not in settable:
            hint = did_you_mean(key, sorted(settable), f"evalkit ls settings {entry.canonical}")
            raise EvalkitError(f"task {entry.canonical} has no setting {key!r}: {hint}")


def setting_names(target: str) -> frozenset[str] | None:
    """The settings of the task class ``module:Class``, read from its source; None where
    the source cannot tell (a plugin's class, a base class imported some other way)."""
    module, _, name = target.partition(":")
    fields = dataclass_fields(module, name)
    return None if fields is None else frozenset(fields) - {"name"}


@cache
def dataclass_fields(module: str, name: str) -> frozenset[str] | None:
    """The dataclass fields of class ``name`` of ``module`` and of its bases."""
    tree = module_tree(module)
    found = (
        next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if tree is not None
        else None
    )
    if found is None:
        return None
    fields = set(own_fields(found)) if is_dataclass(found) else set()
    for base in found.bases:
        if ast.unparse(base).split("[")[0] in PLAIN_BASES:
            continue
        where = base_module(tree, module, base)
        inherited = None if where is None else dataclass_fields(*where)
        if inherited is None:
            return None
        fields |= inherited
    return frozenset(fields)


def module_tree(module: str) -> ast.Module | None:
    if not module.startswith("evalkit."):
        return None  # a plugin's task: its own check, after the imports
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"))


def is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target).split(".")[-1] == "dataclass":
            return True
    return False


def own_fields(node: ast.ClassDef) -> list[str]:
    return [
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign)
        and isinstance(item.target, ast.Name)
        and not NOT_FIELDS.intersection(ast.unparse(item.annotation).split("["))
    ]


# Annotations of a dataclass body that make no field (``dataclasses.fields`` leaves them out).
NOT_FIELDS = frozenset(
    {
        "ClassVar",
        "typing.ClassVar",
        "InitVar",
        "dataclasses.InitVar",
        "KW_ONLY",
        "dataclasses.KW_ONLY",
    }
)


# Bases that hold no dataclass fields.
PLAIN_BASES = frozenset({"object", "ABC", "Generic", "Protocol"})


def base_module(tree: ast.Module, module: str, base: ast.expr) -> tuple[str, str] | None:
    """(module, class) a base class of ``module`` is defined in, from its imports."""
    name = ast.unparse(base)
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        return (module, name)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return (imported_module(module, node), alias.name)
    return None


def imported_module(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` imports from (``from .x import y`` too)."""
    if not node.level:
        return node.module or ""
    package = module.rsplit(".", node.level)[0]
    return f"{package}.{node.module}" if node.module else package
