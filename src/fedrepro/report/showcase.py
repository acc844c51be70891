"""The README's showcase: one figure and one study's scorecard section from the last run, written
between two marker lines so that every `make run` refreshes it and nothing else in the README changes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from fedrepro.io import atomic_write
from fedrepro.report.collect import write_text_atomic

BEGIN = "<!-- showcase:begin -->"
END = "<!-- showcase:end -->"
NOTE = ("<!-- written by `make run` (rule showcase, config key `showcase`); "
        "edits between the markers are overwritten -->")


def study_section(scorecard_md: str, study: str) -> str:
    """The scale statement and one study's section (``## study`` up to the next ``## ``) of a scorecard."""
    statement = next((p for p in scorecard_md.split("\n\n") if p.startswith("**")), "")
    match = re.search(rf"^## {re.escape(study)}\n(.*?)(?=^## |\Z)", scorecard_md, flags=re.M | re.S)
    if match is None:
        raise ValueError(f"the scorecard has no section for study {study!r}")
    section = match.group(1).strip()
    # the convergence subsection ends the section; its lists of runs and cells that miss can run to a hundred
    # lines, so the README keeps its counts and points to the full scorecard for the names
    cut = re.search(r"^(Runs that miss the plateau rule|Cells whose seed sd exceeds).*", section, flags=re.M | re.S)
    if cut:
        section = section[:cut.start()] + "The runs and cells that miss are listed by name in `results/scorecard.md`."
    return f"{statement}\n\n{section}\n"


def showcase_block(figure: str, caption: str, excerpt: str) -> str:
    """The Markdown between the markers: the figure (a path relative to the README) and the excerpt."""
    return f"{NOTE}\n\n![{caption}]({figure})\n\n*{caption}*\n\n{excerpt.strip()}\n"


def replace_block(readme: str, block: str, where: str = "README") -> str:
    """``readme`` with the text between its one pair of markers replaced by ``block``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"{where}: needs exactly one line {BEGIN} followed by one line {END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def write_showcase(readme: Path, figure_png: Path, scorecard_md: Path, study: str, caption: str,
                   figure_out: Path, excerpt_out: Path) -> bool:
    """Copy the figure, write the excerpt, and rewrite the README's block; True if the README changed."""
    readme, figure_out, excerpt_out = Path(readme), Path(figure_out), Path(excerpt_out)
    if not readme.is_file():
        raise FileNotFoundError(f"showcase.readme: {readme} does not exist (relative to the working directory)")
    atomic_write(figure_out, lambda tmp: shutil.copyfile(figure_png, tmp))
    excerpt = study_section(Path(scorecard_md).read_text(), study)
    write_text_atomic(excerpt, excerpt_out)
    rel = Path(figure_out).resolve().relative_to(readme.resolve().parent).as_posix()
    old = readme.read_text()
    new = replace_block(old, showcase_block(rel, caption, excerpt), str(readme))
    if new != old:  # an unchanged README keeps its timestamp
        write_text_atomic(new, readme)
    return new != old
