"""How much of each paper a config shows: of the published cells (config/paper/<paper>.csv), how many sit
beside one of our regenerated cells in some table of the config (a table cell whose paper_table, row and
column map to it, as the table rule looks them up).

    python -m fedrepro.report.coverage --configfile config/paper.yaml
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

from fedrepro.config import REPO, merge_configfiles, resolve_config
from fedrepro.report.tables import paper_key


@dataclass(frozen=True)
class Coverage:
    """Published cells of one study's paper: shown beside ours, and in all."""

    shown: int
    total: int

    def __str__(self) -> str:
        return f"published cells shown: {self.shown} / {self.total}"


def published_keys(path: Path) -> set[tuple[str, str, str]]:
    """(table, row, column) of every cell of a published-numbers file."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        return {(r["table"], r["row"], r["column"]) for r in csv.DictReader(f)}


def shown_keys(study: dict) -> set[tuple[str, str, str]]:
    """(paper table, row, column) of the published cell each table cell of the study mirrors."""
    keys = set()
    for table in study["tables"].values():
        if not table.get("paper_table"):
            continue
        for row in table["rows"]:
            for column in table["columns"]:
                key = paper_key(table, {"paper": None, **row}, {"paper": None, **column})
                if key:
                    keys.add((table["paper_table"], *key))
    return keys


def study_coverage(study: dict, paper_dir: Path = REPO / "config" / "paper") -> Coverage:
    """The study's coverage of its paper's published cells (0 / 0 for a study that names no paper)."""
    if not study.get("paper"):
        return Coverage(0, 0)
    published = published_keys(Path(paper_dir) / f"{study['paper']}.csv")
    return Coverage(len(published & shown_keys(study)), len(published))


def mirrors_a_paper(study: dict) -> bool:
    """Whether the study names a paper and mirrors at least one of its tables (a table with `paper_table`)."""
    return bool(study.get("paper")) and any(t.get("paper_table") for t in study["tables"].values())


def config_coverage(config: dict) -> dict[str, Coverage]:
    """Every study of a resolved config that mirrors a paper table -> its coverage (a study of one's own, which
    mirrors none, has no published cells to count)."""
    return {name: study_coverage(study) for name, study in config["studies"].items() if mirrors_a_paper(study)}


def total(coverage: dict[str, Coverage]) -> Coverage:
    return Coverage(sum(c.shown for c in coverage.values()), sum(c.total for c in coverage.values()))


def report_lines(coverage: dict[str, Coverage], scale: str) -> list[str]:
    width = max(len(s) for s in coverage) if coverage else 0
    overall = f"{'all':<{width}}  {total(coverage)} ({scale} scale)"
    return [*(f"{s:<{width}}  {c}" for s, c in coverage.items()), overall]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", default=[str(REPO / "config" / "config.yaml")],
                        help="config files, later ones overriding earlier keys (as snakemake's --configfile)")
    args = parser.parse_args(argv)
    config = resolve_config(merge_configfiles(*args.configfile), source=", ".join(args.configfile))
    print("\n".join(report_lines(config_coverage(config), config["scale"])))


if __name__ == "__main__":
    main()
