"""docs/deviations.md: the differences from the papers kept on purpose, one table row each, and the links
to its rows that tables and figures carry (their study entry's ``deviations: [D-..., ...]``).

Each row's id cell holds an HTML anchor (``<a id="d-feddisco-x"></a>D-feddisco-x``), so a link is
``docs/deviations.md#<lower-cased id>``; the ids a study may name are the anchors the page defines.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PAGE = "docs/deviations.md"  # relative to the working directory, which is the checkout (as for docs/showcase)
_ROW_ID = re.compile(r'^\|\s*<a id="([^"]+)"></a>(D-[^|\s]+)\s*\|', flags=re.M)


@cache
def _page_ids(path: Path, mtime: float) -> dict[str, str]:
    ids = {}
    for anchor, name in _ROW_ID.findall(path.read_text(encoding="utf-8")):
        if anchor != name.lower():
            raise ValueError(f"{path}: row {name}'s anchor {anchor!r} is not its lower-cased id {name.lower()!r}")
        ids[name] = anchor
    return ids


def deviation_ids(path: Path = REPO / PAGE) -> set[str]:
    """The ids of the page's rows (those whose first cell carries an anchor)."""
    path = Path(path)
    if not path.is_file():
        return set()
    return set(_page_ids(path, path.stat().st_mtime))


def anchor(deviation: str) -> str:
    """The anchor of a row: its id lower-cased ("D-feddisco-x" -> "d-feddisco-x")."""
    return deviation.lower()


def deviation_href(deviation: str, from_dir: str | Path | None = None) -> str:
    """The link to a row, relative to ``from_dir`` (the folder of the file that carries it, relative to the
    working directory) or, without it, relative to the working directory."""
    page = PAGE if from_dir is None else os.path.relpath(PAGE, start=str(from_dir))
    return f"{Path(page).as_posix()}#{anchor(deviation)}"


def linked_deviations(spec: dict) -> list[str]:
    """The ids an artifact's captions link: its own ``deviations``, then those its rows name (a table row's
    ``deviations``: what explains that row's distance from the paper), each once."""
    rows = [d for row in spec.get("rows") or [] for d in row.get("deviations") or []]
    return list(dict.fromkeys([*(spec.get("deviations") or []), *rows]))


def deviations_sentence(ids: list[str]) -> str:
    """The plain-text form of a caption's deviations (LaTeX and PNG captions, which hold no links)."""
    return "Deviations from the paper: " + ", ".join(f"{d} ({PAGE}#{anchor(d)})" for d in ids) + "."
