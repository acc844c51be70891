"""Feddle Fig. 2: (a) the cosine of the clients' updates to the true update (sum_j |D_j|/|D| Delta_j over every
client, from the same model) per round, one line per data heterogeneity level (mean over clients, band from the
smallest to the largest client, each averaged over seeds); (b) the cosine between the true updates of different
rounds, one seed's ``true_update_cosines.npz`` (fedrepro.asyncfl.job). Both come from runs with
``async.true_update``."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd

from fedrepro.report.figures import figure_title, new_figure, save_figure
from fedrepro.report.quantities import QUANTITIES
from fedrepro.report.style import FIGURE_RC

SPREAD = ("true_cos_mean", "true_cos_min", "true_cos_max")


def client_cosine_lines(spec: dict, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per setting label: round, mean, min and max of the clients' cosine to the true update, averaged over
    seeds (rounds where no client reported in the round it was sent are left out)."""
    missing = [c for c in SPREAD if c not in runs.columns]
    if missing:
        raise ValueError(f"figure {spec['name']}: runs.csv lacks {missing}: its settings need async.true_update")
    lines = {}
    for setting in spec["settings"]:
        rows = runs[(runs["setting"] == setting["setting"]) & (runs["method"] == spec["method"])]
        rows = rows.dropna(subset=list(SPREAD))
        if rows.empty:
            raise ValueError(f"figure {spec['name']}: no true-update cosines for ({spec['method']}, "
                             f"{setting['setting']})")
        lines[setting["label"]] = rows.groupby("round")[list(SPREAD)].mean().reset_index()
    return lines


def render_update_cosine(spec: dict, runs: pd.DataFrame, arrays: dict[str, np.ndarray], out_stem: Path) -> None:
    """Panel (a): one line per setting with its client band; panel (b): the round-by-round cosine matrix."""
    lines = client_cosine_lines(spec, runs)
    rounds, cosines = np.asarray(arrays["rounds"]), np.asarray(arrays["cosines"])
    if cosines.shape != (len(rounds), len(rounds)) or len(rounds) == 0:
        raise ValueError(f"figure {spec['name']}: the true-update cosines are {cosines.shape} for {len(rounds)} "
                         "rounds")
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(11.0, 4.4)
        left, right = fig.subplots(1, 2, width_ratios=[1.25, 1])
        colours = mpl.colormaps["viridis"].resampled(max(len(lines), 2))
        for i, (label, frame) in enumerate(lines.items()):
            left.plot(frame["round"], frame["true_cos_mean"], color=colours(i), label=label, marker="o", ms=3)
            left.fill_between(frame["round"], frame["true_cos_min"], frame["true_cos_max"], color=colours(i),
                              alpha=0.18, linewidth=0)
        left.axhline(0.0, color="0.5", linewidth=0.8)
        left.set(xlabel=QUANTITIES["round"], ylabel=QUANTITIES["true_cos_mean"],
                 title=f"(a) {spec.get('method_label', spec['method'])}: clients vs the true update")
        left.legend(loc="best", fontsize="small", title="line: mean over clients; band: min-max")
        step = max(1, len(rounds) // 10)  # at most ~10 tick labels per axis
        image = right.imshow(cosines, vmin=-1.0, vmax=1.0, cmap="RdBu_r", origin="lower")
        right.grid(False)  # the style's grid lines would cut the cells
        right.set_xticks(range(0, len(rounds), step), rounds[::step])
        right.set_yticks(range(0, len(rounds), step), rounds[::step])
        right.set(xlabel=QUANTITIES["round"], ylabel=QUANTITIES["round"],
                  title=f"(b) true updates across rounds: {spec.get('setting_label', spec['setting'])}, "
                        f"seed {spec.get('seed', 0)}")
        fig.colorbar(image, ax=right, label="cosine similarity")
        fig.suptitle(figure_title(spec))
        save_figure(fig, out_stem)
