"""Headless Chromium for the slow tests that look at pages as a person would: the flags this
machine's closed network needs, and a page's own measurements read back from its DOM."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    """The browser's path, or the test skipped saying how to install it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium: apt-get install chromium")
    return browser


def flags(profile: Path, *extra: str) -> list[str]:
    """Headless, no sandbox (root), nothing fetched in the background, a fresh profile."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *extra,
    ]


def measured(page: Path, measure: str, profile: Path):
    """The JavaScript function body ``measure`` run in ``page`` once it has loaded; the value
    it returns, written into the page as JSON and read back from the dumped DOM."""
    script = (
        '<script>window.addEventListener("load", () => {'
        f"const found = (() => {{ {measure} }})();"
        'const out = document.createElement("pre"); out.id = "measured";'
        "out.textContent = JSON.stringify(found); document.body.appendChild(out);"
        "});</script>"
    )
    page.write_text(page.read_text().replace("</body>", script + "</body>"))
    argv = [chromium(), *flags(profile, "--window-size=1000,1400", "--dump-dom", page.as_uri())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout)
    assert found, done.stderr[-2000:]
    return json.loads(found[1])
