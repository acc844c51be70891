"""Learning curves (metric vs round, one panel per setting, one line per method) and shared figure helpers.

The helpers (``new_figure``, ``panel_axes``, ``figure_title``, ``save_figure``) are used by every figure
kind; paper-specific kinds live beside this module (``figures_feddisco``).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedrepro.io import atomic_write
from fedrepro.report.deviations import deviations_sentence
from fedrepro.report.quantities import QUANTITIES
from fedrepro.report.style import FIGURE_RC, method_dashes, method_palette

AXIS_LABELS = QUANTITIES
BANDS = {
    "sd": ("sd", "band: ±1 sd over seeds"),
    "ci": (("ci", 95), "band: 95% bootstrap CI over seeds"),
}
MAX_COLS = 4


def _save_atomic(fig: Figure, path: Path, **kwargs) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix[1:], **kwargs))


def new_figure(width: float, height: float) -> Figure:
    """A bare Figure on an Agg canvas: no pyplot state, no GUI backend, nothing left open.

    Call it (and draw, and save) inside ``mpl.rc_context(FIGURE_RC)``.
    """
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def panel_axes(fig: Figure, n: int, **kwargs) -> list:
    """``n`` axes in a grid of at most ``MAX_COLS`` columns; the unused trailing cells are hidden."""
    ncols, nrows = grid_shape(n)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return list(axes[:n])


def grid_shape(n: int) -> tuple[int, int]:
    """(columns, rows) that ``panel_axes`` uses for ``n`` panels."""
    ncols = min(MAX_COLS, n)
    return ncols, math.ceil(n / ncols)


def figure_title(spec: dict) -> str:
    """The spec's caption, or its name when the caption is empty, and on a line of its own the rows of
    docs/deviations.md it names (plain text: an image holds no link; the report's caption links them)."""
    title = spec.get("caption") or spec.get("name", "")
    deviations = spec.get("deviations") or []
    return f"{title}\n{deviations_sentence(deviations)}" if deviations else title


def save_figure(fig: Figure, out_stem: Path) -> None:
    """Write ``out_stem``.png (150 dpi) and ``out_stem``.pdf, each atomically."""
    out_stem = Path(out_stem)
    _save_atomic(fig, out_stem.parent / (out_stem.name + ".png"), dpi=150)
    # No creation date, so rerunning an unchanged figure gives identical bytes.
    _save_atomic(fig, out_stem.parent / (out_stem.name + ".pdf"), metadata={"CreationDate": None})


def render_curves(spec: dict, runs: pd.DataFrame, out_stem: Path) -> None:
    """Write ``out_stem``.png (150 dpi) and .pdf: mean curve per method with a band over seeds.

    spec: name, caption, kind="curve", settings [{setting, label}], methods [{method, label}],
    optional y (default test_acc), x (default round), band ("sd", default, or "ci"), max_round (show
    x <= max_round only) and log_y. Methods without values of y (a statistic they do not log) are left out.
    """
    y, x = spec.get("y", "test_acc"), spec.get("x", "round")
    band = spec.get("band", "sd")
    if band not in BANDS:
        raise ValueError(f"figure {spec.get('name')}: band {band!r} not in {sorted(BANDS)}")
    errorbar, band_text = BANDS[band]
    for col in ("setting", "method", "seed", x, y):
        if col not in runs.columns:
            raise ValueError(f"figure {spec.get('name')}: runs lack column {col!r}")
    settings, methods = spec["settings"], spec["methods"]
    labels = [m["label"] for m in methods]
    to_label = {m["method"]: m["label"] for m in methods}

    data = runs[runs["setting"].isin([s["setting"] for s in settings]) & runs["method"].isin(to_label)]
    if spec.get("max_round"):
        data = data[data[x] <= spec["max_round"]]
    if data.empty:
        raise ValueError(f"figure {spec.get('name')}: no runs for its settings and methods")
    # A diverged run can log inf; drop those points rather than let them blow up the axis.
    data = data.assign(
        method_label=data["method"].map(to_label), **{y: data[y].replace([np.inf, -np.inf], np.nan)}
    )
    seeds = sorted(set(data.groupby(["setting", "method"])["seed"].nunique()))
    n_text = f"n = {seeds[0]}" if len(seeds) == 1 else f"n = {seeds[0]}–{seeds[-1]}"

    ncols, nrows = grid_shape(len(settings))
    palette, dashes = method_palette(labels), method_dashes(labels)
    with mpl.rc_context(FIGURE_RC):
        # at least 7 inches wide: a single panel would otherwise clip its caption and legend title
        fig = new_figure(max(3.8 * ncols, 7.0), 3.0 * nrows + 1.2)
        axes = panel_axes(fig, len(settings))
        handles: dict[str, object] = {}
        for ax, setting in zip(axes, settings, strict=True):
            panel = data[data["setting"] == setting["setting"]]
            ax.set_title(setting["label"])
            ax.set_xlabel(AXIS_LABELS.get(x, x))
            ax.set_ylabel(AXIS_LABELS.get(y, y))
            if x in ("round", "epoch"):  # counted things: no ticks at round 1.5
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if panel[y].notna().sum() == 0:
                ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", va="center", color="0.4")
                continue
            present = [lab for lab in labels if lab in set(panel.loc[panel[y].notna(), "method_label"])]
            sns.lineplot(
                data=panel[panel["method_label"].isin(present)],
                x=x,
                y=y,
                hue="method_label",
                hue_order=present,
                palette=palette,
                style="method_label",
                style_order=present,
                dashes=dashes,
                errorbar=errorbar,
                seed=0,
                ax=ax,
            )
            if spec.get("log_y"):
                ax.set_yscale("log")
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(lab, h)
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        order = [lab for lab in labels if lab in handles]
        fig.legend(
            [handles[lab] for lab in order],
            order,
            loc="outside lower center",
            ncols=min(len(order), 6),
            title=f"method (line: mean over seeds; {band_text}, {n_text})",
        )
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)
