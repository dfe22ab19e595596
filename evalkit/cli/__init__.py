"""The ``evalkit`` command: parses arguments and calls the API, printing with rich; no
evaluation logic lives here.

Modules (one per command, each holding its parser and its handler): ``run``, ``listing`` (ls,
backbones), ``table``, ``compare``, ``errors``, ``merge``, ``export``, ``leaderboard``,
``power``, ``explore``, ``convert``, ``plan`` (plan, check-data), ``card``, ``cache``,
``pretrain``, ``reproduce`` (reproduce, sweep) and ``prepare``."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from evalkit import __version__
from evalkit.cli import (
    cache,
    card,
    compare,
    convert,
    errors,
    explore,
    export,
    leaderboard,
    listing,
    merge,
    plan,
    power,
    prepare,
    pretrain,
    reproduce,
    run,
    table,
)
from evalkit.errors import EvalkitError, install_hint
from evalkit.storage.writes import disk_error

# In ``evalkit --help`` order: each command's parser builder and handler.
COMMANDS = {
    "run": (run.add_run, run.cmd_run),
    "ls": (listing.add_ls, listing.cmd_ls),
    "table": (table.add_table, table.cmd_table),
    "compare": (compare.add_compare, compare.cmd_compare),
    "leaderboard": (leaderboard.add_leaderboard, leaderboard.cmd_leaderboard),
    "power": (power.add_power, power.cmd_power),
    "explore": (explore.add_explore, explore.cmd_explore),
    "merge": (merge.add_merge, merge.cmd_merge),
    "export": (export.add_export, export.cmd_export),
    "card": (card.add_card, card.cmd_card),
    "backbones": (listing.add_backbones, listing.cmd_backbones),
    "convert": (convert.add_convert, convert.cmd_convert),
    "check-data": (plan.add_check_data, plan.cmd_check_data),
    "plan": (plan.add_plan, plan.cmd_plan),
    "cache": (cache.add_cache, cache.cmd_cache),
    "pretrain": (pretrain.add_pretrain_command, pretrain.cmd_pretrain),
    "errors": (errors.add_errors_command, errors.cmd_errors),
    "sweep": (reproduce.add_sweep_command, reproduce.cmd_sweep),
    "reproduce": (reproduce.add_reproduce_command, reproduce.cmd_reproduce),
    "prepare": (prepare.add_prepare_command, prepare.cmd_prepare),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line, as every other error is (argparse
    prints the whole usage first, 13 lines for ``run``); the help is one flag away."""

    def error(self, message):
        if message.endswith("expected one argument"):  # argparse reads "-1/2" as an option
            message += "; a value that starts with '-' is written --option=VALUE"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="evalkit", description="Evaluate frozen vision backbones.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    parser.add_argument("--version", action="version", version=f"evalkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


IDLE_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}
LARGE_PAGES = {"THP_MEM_ALLOC_ENABLE": "1"}
HUGE_PAGES_OFFERED = "/sys/kernel/mm/transparent_hugepage/enabled"  # Linux with THP built in


def process_environment() -> dict[str, str]:
    """The variables the command sets before torch loads (a value the user set is kept).

    ``OMP_WAIT_POLICY``: by default an OpenMP thread spins for a while after each parallel
    region, on the core that the threads reading images (``evalkit.data.feeding``) need;
    asleep, it costs a wake-up. ``THP_MEM_ALLOC_ENABLE``: torch asks the kernel to back its CPU
    buffers of 2 MiB or more with 2 MiB pages, so a batch's fresh 38 MB buffer faults in about
    20 pages instead of 9,412. Neither changes what is computed."""
    settings = dict(IDLE_OPENMP)
    if os.path.exists(HUGE_PAGES_OFFERED):
        settings |= LARGE_PAGES
    return {name: os.environ.get(name, value) for name, value in settings.items()}


def main(argv: list[str] | None = None) -> int:
    # Read by OpenMP and torch's CPU allocator when torch loads, so set before any command
    # imports torch.
    os.environ.update(process_environment())
    args = build_parser().parse_args(argv)
    from rich.console import Console
    from rich.markup import escape  # "pip install 'evalkit[clip]'" must keep its [clip]

    console = Console(stderr=False, width=log_width())
    try:
        return COMMANDS[args.command][1](args, console)
    except EvalkitError as exc:
        if args.debug:
            raise
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        return 2
    except ModuleNotFoundError as exc:
        hint = install_hint(exc.name)
        if hint is None or args.debug:  # a package evalkit requires: a broken install, a bug
            raise
        Console(stderr=True).print(
            f"[bold red]error:[/] evalkit {escape(args.command)} needs {exc.name}, an optional "
            f"package: {escape(hint)}",
            highlight=False,
            soft_wrap=True,
        )
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted: finished rows and cached features are kept")
        return 130
    except OSError as exc:
        message = os_error_line(exc)
        if message is None or args.debug:  # any other OS error is a bug to see
            raise
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True
        )
        return 2


PLACE_ERRORS = {  # an output path the user named that cannot hold what is written there
    errno.ENOTDIR: "cannot write {path}: a file stands where that path needs a folder; choose "
    "another output folder (--out)",
    errno.EISDIR: "cannot write {path}: it is a folder where a file is needed; choose a file name",
    errno.ENAMETOOLONG: "cannot write {path}: the name is too long for its file system",
}


def os_error_line(exc: OSError) -> str | None:
    """One line for an OS error that the user's paths or disk caused (no space, no
    permission, a read-only disk, a file where a folder must be), or None for any other."""
    path = exc.filename or "a file"
    if exc.errno in PLACE_ERRORS:
        return PLACE_ERRORS[exc.errno].format(path=path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        return str(disk_error(exc, path))
    return None


def log_width() -> int | None:
    """The width output is laid out at: the terminal's; when output goes to a file or a pipe
    (a log, a CI step), wide enough that no table breaks a word or cuts a name, whatever
    ``$COLUMNS`` says (a CI runner's 80 would fold every label over several lines; rich would
    take 80 columns too)."""
    return None if sys.stdout.isatty() else LOG_WIDTH


LOG_WIDTH = 4096


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
