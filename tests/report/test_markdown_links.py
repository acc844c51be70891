"""Every relative link of the repository's Markdown (the README, docs/, the committed snapshots' tables and
scorecards) reaches a file that exists: a page moved, a snapshot copied elsewhere or a table rendered in a
temporary folder leaves no dead link behind (its anchor, after #, is not checked)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support.common import REPO

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def tracked_markdown() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / f for f in out.stdout.split("\0") if f]


def test_every_relative_link_of_the_tracked_markdown_reaches_a_file():
    pages = tracked_markdown()
    assert any(p.parts[-4:] == ("laptop-full", "feddisco", "tables", "table1.md") for p in pages)
    dead = [f"{page.relative_to(REPO)}: {target}" for page in pages if page.is_file()
            for target in LINK.findall(page.read_text(encoding="utf-8"))
            if "://" not in target and not target.startswith(("/", "mailto:")) and not (page.parent / target).exists()]
    assert dead == []
