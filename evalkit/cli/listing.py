"""``evalkit ls`` and ``evalkit backbones``: what tasks and backbone families exist, and a model's plan."""

from __future__ import annotations

from evalkit.errors import EvalkitError


def add_ls(sub) -> None:
    """list tasks or backbone families"""
    ls = sub.add_parser("ls", help="list tasks or backbone families")
    ls.add_argument("what", nargs="?", choices=("tasks", "backbones"), default="tasks")


def add_backbones(sub) -> None:
    """list backbone families or plan a model"""
    backbones = sub.add_parser("backbones", help="list backbone families or plan a model")
    backbones.add_argument("action", choices=("ls", "info"))
    backbones.add_argument("spec", nargs="?", default="vit22b", help="e.g. vit22b, vit22b/l")
    backbones.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to plan for")
    backbones.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")


def cmd_ls(args, console) -> int:
    from rich.table import Table

    if args.what == "tasks":
        from evalkit.core.catalog import TASKS as registry

        examples = {}
    else:
        from evalkit.backbones import BACKBONES as registry
        from evalkit.backbones import EXAMPLES as examples
    table = Table("name", "what", "examples" if examples else "")
    for entry in registry.entries():
        table.add_row(entry.name, entry.summary, examples.get(entry.name, ""))
    console.print(table)
    return 0


def cmd_backbones(args, console) -> int:
    if args.action == "ls":
        args.what = "backbones"
        return cmd_ls(args, console)
    from rich.table import Table

    from evalkit.models import vit22b
    from evalkit.parallel.planner import plan, report

    family, _, size = args.spec.partition("/")
    size = size or "22b"
    if family != "vit22b" or size not in vit22b.SIZES:
        raise EvalkitError(
            f"backbones info plans the built-in family: vit22b[/<size>] with size one of "
            f"{', '.join(vit22b.SIZES)}; got {args.spec!r}"
        )
    cfg = vit22b.config(size)
    table = Table(show_header=False, box=None)
    for label, value in report(f"vit22b/{size}", cfg, plan(cfg, tp=args.tp, dtype=args.dtype)):
        table.add_row(label, value)
    console.print(table)
    return 0
