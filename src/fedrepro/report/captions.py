"""The words of the Snakemake report's captions (workflow/report/*.rst fill them in): what an artifact
shows, which paper table or figure it mirrors, the scale it ran at and which accuracy summary it uses."""

from __future__ import annotations

import re

from fedrepro.report.deviations import deviation_href, linked_deviations
from fedrepro.report.figure_kinds import figure_kind
from fedrepro.report.quantities import QUANTITIES
from fedrepro.report.scorecard import accuracy_summary

SCALES = {
    "embedded": "embedded (laptop scale: stand-in data sets that ship with scikit-learn, small models, few "
                "rounds; the published numbers are not comparable, only rankings are)",
    "paper": "paper (the paper's data sets, models, rounds and seeds)",
}
# an embedded table whose spec sets compare_levels (its cells run on the paper's own data set)
EMBEDDED_LEVELS = ("embedded (laptop scale: the paper's own data set, reduced in samples, epochs and rounds, see "
                   "the deviations; levels compare with the published numbers as well as rankings)")
SUMMARY_WORDS = {
    "final_acc": "final (after the last round)",
    "best_acc": "best (over rounds)",
    "last_k_acc": "mean of the last k evaluations",
    "last_k_max_acc": "maximum of the last k evaluations",
}
Y_WORDS = QUANTITIES


def rst_escape(text: str) -> str:
    """Plain text that reStructuredText shows as is (labels such as "CIFAR-10 | NIID-1" or "*")."""
    return re.sub(r"([\\`*_|<>\[\]])", r"\\\1", str(text))


def deviation_links(spec: dict, report_dir: str) -> str:
    """The reStructuredText list item linking the rows of docs/deviations.md the spec names, relative to the
    report's folder (the results root: `snakemake --report <results_dir>/report.html`); "" for none."""
    ids = linked_deviations(spec)
    if not ids:
        return ""
    links = ", ".join(f"`{rst_escape(d)} <{deviation_href(d, report_dir)}>`__" for d in ids)
    return f"- Deviations from the paper: {links}."


def table_caption(spec: dict, scale: str, report_dir: str = "results") -> dict[str, str]:
    """Caption fields of a table: title, mirrors, scale, summary (already reStructuredText-escaped) and
    deviations (a list item of links, or "")."""
    mirrors = f"{spec['paper_table']} of the paper" if spec.get("paper_table") else "no published table"
    metric = spec.get("metric", "")
    summary = SUMMARY_WORDS.get(metric, accuracy_summary(spec))
    return {
        "title": rst_escape(spec.get("caption") or spec["name"]),
        "mirrors": rst_escape(mirrors),
        "scale": rst_escape(EMBEDDED_LEVELS if scale == "embedded" and spec.get("compare_levels") else SCALES[scale]),
        "summary": rst_escape(summary),
        "deviations": deviation_links(spec, report_dir),
    }


def figure_caption(spec: dict, scale: str, report_dir: str = "results") -> dict[str, str]:
    """Caption fields of a figure: title, shows (its kind's words, fedrepro.report.figure_kinds), mirrors, scale
    (already reStructuredText-escaped) and deviations (a list item of links, or "")."""
    shows = figure_kind(spec["kind"]).shows.format(
        y=Y_WORDS.get(spec.get("y", "test_acc"), spec.get("y", "")), seed=spec.get("seed", 0),
        metric=SUMMARY_WORDS.get(spec.get("metric", "best_acc"), spec.get("metric", "")))
    mirrors = f"{spec['paper_figure']} of the paper" if spec.get("paper_figure") else "no published figure"
    return {
        "title": rst_escape(spec.get("caption") or spec["name"]),
        "shows": rst_escape(shows[0].upper() + shows[1:]),
        "mirrors": rst_escape(mirrors),
        "scale": rst_escape(SCALES[scale]),
        "deviations": deviation_links(spec, report_dir),
    }
