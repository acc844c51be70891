"""The words of the Snakemake report's captions (workflow/report/*.rst fill them in): what an artifact
shows, which paper table or figure it mirrors, the scale it ran at and which accuracy summary it uses."""

from __future__ import annotations

import re

from fedrepro.report.deviations import deviation_href
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
KINDS = {
    "curve": "{y} per round, one panel per setting, one colour per method (the same in every figure of every "
             "study); line: mean over the seeds that completed, band: ±1 sd over seeds (the same ones); a diverged "
             "seed: its own thin line, a cross where it stopped",
    "finetune_curve": "{y} on the target domain per fine-tuning epoch, one colour per method; line: mean over "
                      "seeds, band: ±1 sd over seeds",
    "partition": "samples per class (rows) and client (columns) of the seed-{seed} partition, one panel per "
                 "setting",
    "class_histogram": "samples per class of the whole training set, one panel per setting",
    "gain_grid": "accuracy gain of each swept variant over the baseline, a heatmap over the two swept values "
                 "(mean over seeds of the {metric} accuracy)",
    "gain_lines": "accuracy gain of each method over its baseline across settings (mean over seeds of the "
                  "{metric} accuracy)",
    "sweep_line": "{metric} test accuracy against a swept hyper-parameter, one line per series; points: mean "
                  "over seeds, bars: ±1 sd",
    "per_class": "test accuracy per category, one colour per method; bars: mean over seeds, whiskers: ±1 sd",
    "update_cosine": "(a) the cosine of each client's update to the true update (the size-weighted mean of "
                     "every client's update from the same model, Sec. 2 of the paper) per round, one line per "
                     "setting: mean over clients, band from the smallest to the largest, each averaged over "
                     "seeds; (b) the cosine between the true updates of two rounds, seed {seed}",
    "negative_effect": "(a) the negative effect, the largest rise of the {y} above its lowest value in earlier "
                       "rounds (rounds without training skipped), and (b) the best test accuracy over rounds, one "
                       "bar per method; bars: mean over seeds, whiskers: ±1 sd",
    "weight_probe": "(a) the seed-{seed} partition; (b) the {metric} accuracy of (1 - r) w_A + r w_B after one "
                    "round of local training from the same start, against r, for each pair of similar-size "
                    "clients (B nearer the uniform class distribution; line: mean over seeds, band: ±1 sd, star: "
                    "best r); (c), (d) each client's own-model accuracy against its relative dataset size and its "
                    "l2 discrepancy to the uniform distribution, every seed, with the mean within-seed Spearman rho",
    "tsne": "a t-SNE of the server's per-class vectors (diamonds) among the clients' own representations of "
            "their test samples (circles, at most 10 per class and client, in the vectors' space: logits or "
            "features), one colour per class, one panel per method, seed {seed}",
}
Y_WORDS = QUANTITIES


def rst_escape(text: str) -> str:
    """Plain text that reStructuredText shows as is (labels such as "CIFAR-10 | NIID-1" or "*")."""
    return re.sub(r"([\\`*_|<>\[\]])", r"\\\1", str(text))


def deviation_links(spec: dict, report_dir: str) -> str:
    """The reStructuredText list item linking the rows of docs/deviations.md the spec names, relative to the
    report's folder (the results root: `snakemake --report <results_dir>/report.html`); "" for none."""
    ids = spec.get("deviations") or []
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
    """Caption fields of a figure: title, shows, mirrors, scale (already reStructuredText-escaped) and
    deviations (a list item of links, or "")."""
    kind = spec["kind"]
    shows = KINDS[kind].format(y=Y_WORDS.get(spec.get("y", "test_acc"), spec.get("y", "")),
                               seed=spec.get("seed", 0),
                               metric=SUMMARY_WORDS.get(spec.get("metric", "best_acc"), spec.get("metric", "")))
    mirrors = f"{spec['paper_figure']} of the paper" if spec.get("paper_figure") else "no published figure"
    return {
        "title": rst_escape(spec.get("caption") or spec["name"]),
        "shows": rst_escape(shows[0].upper() + shows[1:]),
        "mirrors": rst_escape(mirrors),
        "scale": rst_escape(SCALES[scale]),
        "deviations": deviation_links(spec, report_dir),
    }
