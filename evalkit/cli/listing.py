"""``evalkit ls`` and ``evalkit backbones``: what tasks, backbone families, datasets, settings and
models exist, and a model's plan."""

from __future__ import annotations

from evalkit.errors import EvalkitError

LISTS = ("tasks", "suites", "backbones", "datasets", "settings", "models")


def add_ls(sub) -> None:
    """list tasks, backbone families, datasets, a task's settings or a family's models"""
    ls = sub.add_parser(
        "ls",
        help="list tasks, suites, backbones, datasets, settings TASK, models timm|open_clip "
        "[PATTERN]",
    )
    ls.add_argument("what", nargs="?", choices=LISTS, default="tasks")
    ls.add_argument("name", nargs="?", help="settings: the task; models: timm or open_clip")
    ls.add_argument(
        "pattern",
        nargs="?",
        help="models: a glob such as 'resnet*', or a part of the name such as vit_tiny",
    )


def add_backbones(sub) -> None:
    """list backbone families or plan a model"""
    backbones = sub.add_parser("backbones", help="list backbone families or plan a model")
    backbones.add_argument("action", choices=("ls", "info"))
    backbones.add_argument("spec", nargs="?", default="vit22b", help="e.g. vit22b, vit22b/l")
    backbones.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to plan for")
    backbones.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")


def cmd_ls(args, console) -> int:
    from rich.table import Table

    if args.what == "settings":
        return _settings(args.name, console)
    if args.what == "models":
        return _models(args.name, args.pattern, console)
    if args.what == "suites":
        return _suites(console)
    if args.what == "tasks":
        from evalkit.core.catalog import TASKS as registry

        examples = {}
    elif args.what == "datasets":
        from evalkit.data import DATASETS as registry

        examples = {}
    else:
        from evalkit.backbones import BACKBONES as registry
        from evalkit.backbones import EXAMPLES as examples
    third = {"backbones": "examples", "datasets": "how to name it"}.get(args.what)
    table = Table("name", "what", *([third] if third else []))
    for entry in registry.entries():
        own = f"--set dataset={entry.name}" if args.what == "datasets" else ""
        example = examples.get(entry.name, own)
        extra = [example] if third else []
        table.add_row(entry.name, entry.summary, *extra)
    if args.what == "datasets":
        table.add_row(
            "folder:PATH",
            "your own classification set: PATH/<split>/<class>/<image>",
            "--set dataset=folder:PATH",
        )
    console.print(table)
    return 0


def _suites(console) -> int:
    """Every suite: its name (as --task takes it), what it is for, its tasks, where it is from."""
    from rich.markup import escape
    from rich.table import Table

    from evalkit.core.suites import PREFIX, USER_SUITES, all_suites

    table = Table("--task", "what", "tasks", "from")
    for suite in all_suites().values():
        tasks = "\n".join(map(escape, suite.tasks))  # "task[key=value]" is not markup
        table.add_row(PREFIX + suite.name, escape(suite.about), tasks, suite.source)
    console.print(table)
    console.print(
        escape(f"your own: a TOML file of [suites.<name>] tables, named by ${USER_SUITES}"),
        highlight=False,
    )
    return 0


def _settings(task_name: str | None, console) -> int:
    """Every setting of a task: name, default and the values it takes."""
    from rich.table import Table

    from evalkit.core.catalog import TASKS, task_settings
    from evalkit.core.settings_table import settings_rows

    if not task_name:
        raise EvalkitError(
            "evalkit ls settings needs a task: e.g. evalkit ls settings imagenet-linear"
        )
    base, inline = task_settings(task_name)
    entry = TASKS.get(base)
    rows = None if inline else settings_rows(entry.target, entry.params)
    table = Table("setting", "default", "takes", title=f"{entry.canonical}: --set KEY=VALUE")
    for row in rows if rows is not None else built_settings_rows(task_name):
        table.add_row(*row)
    console.print(table)
    return 0


def built_settings_rows(task_name: str) -> list[tuple[str, str, str]]:
    """``settings_rows`` from the task built (its module imported: torch with it)."""
    import dataclasses

    from evalkit.core.catalog import resolve_task
    from evalkit.core.settings_table import setting_row

    task = resolve_task(task_name)
    return [
        setting_row(f.name, getattr(task, f.name), getattr(f.metadata.get("rule"), "text", None))
        for f in dataclasses.fields(task)
        if f.name != "name"
    ]


def _models(family: str | None, pattern: str | None, console) -> int:
    """The model names timm or open_clip can build (with open_clip's published tags)."""
    if family == "timm":
        import timm

        names = timm.list_models(as_glob(pattern))
        tags = {}
    elif family == "open_clip":
        import fnmatch

        try:
            import open_clip
        except ImportError:
            raise EvalkitError(
                "listing open_clip models needs open_clip_torch: pip install 'evalkit[clip]'"
            ) from None

        names = [n for n in open_clip.list_models() if fnmatch.fnmatch(n, as_glob(pattern))]
        tags = {}
        for arch, tag in open_clip.list_pretrained():
            tags.setdefault(arch, []).append(tag)
    else:
        raise EvalkitError(f"evalkit ls models takes timm or open_clip, got {family!r}")
    for name in names:
        console.print(
            f"{family}/{name}" + (f"  tags: {', '.join(tags[name])}" if name in tags else ""),
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"{len(names)} models", highlight=False)
    return 0


def as_glob(pattern: str | None) -> str:
    """A glob as given; a plain name matches anywhere in a model's name, since ``vit_tiny``
    is meant to find ``vit_tiny_patch16_224``, not only a model named exactly that."""
    if not pattern:
        return "*"
    return pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"


def cmd_backbones(args, console) -> int:
    if args.action == "ls":
        args.what = "backbones"
        return cmd_ls(args, console)
    from rich.table import Table

    from evalkit.models import vit22b
    from evalkit.parallel.sizing import report, sizing

    family, _, size = args.spec.partition("/")
    size = size or "22b"
    if family != "vit22b" or size not in vit22b.SIZES:
        raise EvalkitError(
            f"backbones info plans the built-in family: vit22b[/<size>] with size one of "
            f"{', '.join(vit22b.SIZES)}; got {args.spec!r}"
        )
    cfg = vit22b.config(size)
    table = Table(show_header=False, box=None)
    for label, value in report(f"vit22b/{size}", cfg, sizing(cfg, tp=args.tp, dtype=args.dtype)):
        table.add_row(label, value)
    console.print(table)
    return 0
