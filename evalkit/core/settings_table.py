"""``evalkit ls settings TASK`` without importing torch: each setting's name, default and the
values it takes, read from the task class's source.

Every task module imports torch (seconds on a loaded machine) only to list a few literals.
So the table is read from the source the way ``evalkit.core.preflight`` reads the setting
names: the dataclass fields of the class and its bases, in the order a dataclass gives them,
with defaults and rules evaluated from the literals, module constants and rule constructors
(``setting``, ``one_of``, ``Rule``) they are written with. Where any part is beyond that
reading (a computed default, a base imported some other way, a plugin's task) it answers
None and the caller builds the task instead; a test checks the two agree for every task.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from collections import Counter
from functools import cache
from pathlib import Path

from evalkit.core.preflight import (
    PLAIN_BASES,
    base_module,
    is_dataclass,
    module_tree,
    own_fields,
)


class Unreadable(Exception):
    """The source uses something this reading does not evaluate."""


def settings_rows(target: str, params: dict) -> list[tuple[str, str, str]] | None:
    """(setting, default shown, what it takes) of the task class ``module:Class`` built with
    ``params``, as ``evalkit ls settings`` prints them; None where the source cannot tell."""
    module, _, name = target.partition(":")
    try:
        return _rows(class_fields(module, name), params)
    except (Unreadable, RecursionError, ValueError, TypeError):
        return None


def _rows(fields: dict, params: dict) -> list[tuple[str, str, str]]:
    rows = []
    for field_name, (default, rule_text) in fields.items():
        if field_name == "name":
            continue
        value = params.get(field_name, default)
        if value is MISSING:
            raise Unreadable(f"{field_name} has no default")
        rows.append(setting_row(field_name, value, rule_text))
    return rows


def setting_row(name: str, value, rule_text: str | None) -> tuple[str, str, str]:
    """A setting as ``evalkit ls settings`` prints it: name, value shown, what it takes."""
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    return name, shown, rule_text or type(value).__name__


MISSING = object()  # a field without a default: the catalog's params must give it


@cache
def class_fields(module: str, name: str) -> dict[str, tuple]:
    """Field name → (default, rule text or None) of a dataclass, in the order ``dataclasses``
    gives them: the fields of every dataclass along the method resolution order, most basic
    first, an overridden field kept in its first place with the newest default."""
    tree, node = class_node(module, name)
    if not is_dataclass(node):
        raise Unreadable(f"{module}:{name} is no dataclass")
    fields: dict[str, tuple] = {}
    for base in reversed(method_order((module, name))[1:]):
        if is_dataclass(class_node(*base)[1]):
            fields.update(class_fields(*base))
    scope = Scope(module, tree, frozenset(bindings(node)))
    own = set(own_fields(node))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) in own:
            fields[item.target.id] = scope.field(item.value)
    return fields


def class_node(module: str, name: str) -> tuple[ast.Module, ast.ClassDef]:
    tree = module_tree(module)
    found = next(
        (n for n in getattr(tree, "body", ()) if isinstance(n, ast.ClassDef) and n.name == name),
        None,
    )
    if found is None:
        raise Unreadable(f"{module}:{name}")
    return tree, found


@cache
def method_order(key: tuple[str, str]) -> list[tuple[str, str]]:
    """The class's method resolution order (C3), plain bases such as ``object`` left out."""
    tree, node = class_node(*key)
    bases = []
    for base in node.bases:
        if ast.unparse(base).split("[")[0] in PLAIN_BASES:
            continue
        where = base_module(tree, key[0], base)
        if where is None:
            raise Unreadable(ast.unparse(base))
        bases.append(where)
    return [key, *c3_merge([method_order(b) for b in bases] + [bases])]


def c3_merge(sequences: list[list]) -> list:
    merged, sequences = [], [list(s) for s in sequences if s]
    while sequences:
        head = next((s[0] for s in sequences if not any(s[0] in t[1:] for t in sequences)), None)
        if head is None:
            raise Unreadable("no consistent method order")
        merged.append(head)
        sequences = [[c for c in s if c != head] for s in sequences]
        sequences = [s for s in sequences if s]
    return merged


class Scope:
    """Evaluates a module's literal expressions, following its module-level names and its
    imports from other evalkit modules."""

    def __init__(self, module: str, tree: ast.Module, shadowed: frozenset[str] = frozenset()):
        self.module, self.tree, self.shadowed = module, tree, shadowed
        self.bound = Counter(bindings(tree))

    def field(self, node: ast.expr | None) -> tuple:
        if node is None:
            return MISSING, None
        if isinstance(node, ast.Call) and self.callee(node) == "setting":
            if node.keywords or len(node.args) != 2:
                raise Unreadable(ast.unparse(node))
            default, rule = node.args
            return self.value(default), self.value(rule).text
        if isinstance(node, ast.Call) and self.callee(node) == "field":
            raise Unreadable("field()")
        return self.value(node), None

    def callee(self, node: ast.Call) -> str:
        return ast.unparse(node.func).split(".")[-1]

    def value(self, node: ast.expr):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = self.items(node.elts)
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {
                self.value(k): self.entry(v) for k, v in zip(node.keys, node.values, strict=True)
            }
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.JoinedStr):
            return "".join(self.formatted(part) for part in node.values)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.value(node.operand)
        raise Unreadable(ast.unparse(node))

    def entry(self, node: ast.expr):
        """A dict's value: often a function or an object, while a setting reads only the
        keys; it stays opaque unless it is read."""
        try:
            return self.value(node)
        except Unreadable:
            return Opaque(ast.unparse(node))

    def items(self, nodes: list[ast.expr]) -> list:
        out = []
        for node in nodes:
            if isinstance(node, ast.Starred):
                out.extend(self.value(node.value))
            else:
                out.append(self.value(node))
        return out

    def formatted(self, part: ast.expr) -> str:
        if isinstance(part, ast.Constant):
            return part.value
        if (
            isinstance(part, ast.FormattedValue)
            and part.format_spec is None
            and part.conversion == -1
        ):
            return str(self.value(part.value))
        raise Unreadable(ast.unparse(part))

    def call(self, node: ast.Call):
        if node.keywords:
            raise Unreadable(ast.unparse(node))
        name = self.callee(node)
        if name == "Rule":  # its text; the test it runs is not read
            return RuleText(self.value(node.args[0]))
        args = self.items(node.args)
        if name == "one_of":
            return RuleText(f"one of {', '.join(args)}")
        if ast.unparse(node.func) in FUNCTIONS:
            return FUNCTIONS[ast.unparse(node.func)](*args)
        if isinstance(node.func, ast.Attribute):
            owner = self.value(node.func.value)
            if name in METHODS.get(type(owner).__name__, ()):
                return getattr(owner, name)(*args)
        raise Unreadable(ast.unparse(node))

    def name(self, name: str):
        # a name the class body binds, or the module binds more than once, may not be the
        # value a field's default read when the class was made: beyond this reading
        if name in self.shadowed or self.bound[name] > 1:
            raise Unreadable(name)
        for node in self.tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        return self.value(node.value)
                    if isinstance(target, ast.Tuple) and name in names_of(target):
                        if not isinstance(node.value, ast.Tuple):
                            raise Unreadable(name)
                        return self.value(node.value.elts[names_of(target).index(name)])
        where = base_module(self.tree, self.module, ast.Name(name))
        if where is None or where[0] == self.module or not where[0].startswith("evalkit."):
            raise Unreadable(name)
        tree = module_tree(where[0])
        if tree is None:
            raise Unreadable(name)
        return Scope(where[0], tree).name(where[1])


def bindings(body: ast.Module | ast.ClassDef) -> list[str]:
    """Every name the statements of ``body`` bind (assignments, augmented ones, imports,
    functions and classes), once per binding."""
    names = []
    for node in body.body:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names += [e.id for e in ast.walk(target) if isinstance(e, ast.Name)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
    return names


def names_of(target: ast.Tuple) -> list[str | None]:
    return [e.id if isinstance(e, ast.Name) else None for e in target.elts]


class RuleText(str):
    """A rule, as its text."""

    @property
    def text(self) -> str:
        return str(self)


class Opaque:
    """A value the reading did not evaluate: showing it is beyond the reading too."""

    def __init__(self, source: str):
        self.source = source

    def __repr__(self) -> str:
        raise Unreadable(self.source)

    __str__ = __repr__


def package_folder(package: str) -> Path:
    """The folder of an evalkit package, found without running its ``__init__``."""
    spec = importlib.util.find_spec(package) if package.startswith("evalkit") else None
    if spec is None or not spec.submodule_search_locations:
        raise Unreadable(package)
    return Path(next(iter(spec.submodule_search_locations)))


# What the reading calls: pure functions, and methods by their owner's type.
FUNCTIONS = {
    "tuple": tuple,
    "sorted": sorted,
    "list": list,
    "json.loads": json.loads,
    "resources.files": package_folder,
}
METHODS = {
    "str": {"join"},
    "PosixPath": {"joinpath", "read_text"},
    "WindowsPath": {"joinpath", "read_text"},
}
