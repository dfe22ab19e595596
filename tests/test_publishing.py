"""docs/publishing.md as written: every command of its shell block runs on the embedded
stand-in, and every file its layout block names is then on disk."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from evalkit.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "publishing.md"


def page_blocks() -> tuple[list[list[str]], list[str]]:
    """The commands of the page's shell block (argv without ``evalkit``) and the paths of its
    layout block (``<name>`` parts as glob patterns)."""
    text = PAGE.read_text()
    (commands,) = re.findall(r"```bash\n(.*?)```", text, re.S)
    (layout,) = re.findall(r"```text\n(.*?)```", text, re.S)
    argvs = [shlex.split(line) for line in commands.splitlines() if line.strip()]
    assert all(argv[0] == "evalkit" for argv in argvs), argvs
    paths = [re.sub(r"<[^>]+>", "*", line.split()[0]) for line in layout.splitlines() if line]
    return [argv[1:] for argv in argvs], paths


def test_every_command_of_the_publishing_page_runs_and_writes_its_layout(cli_env):
    commands, paths = page_blocks()
    assert {argv[0] for argv in commands} == {"run", "leaderboard", "explore", "export"}
    for argv in commands:
        assert main(argv) == 0, argv
    for pattern in paths:
        assert list(cli_env.glob(pattern)), pattern
    board = (cli_env / "site" / "board.html").read_text()
    assert '<a href="images/index.html">' in board  # the board links the image site
    assert len(list(cli_env.glob("site/eee/data/imagenet-knn/evalkit/*/*.json"))) == 2
