"""Learning curves (metric vs round, one panel per setting, one line per method) and shared figure helpers.

The helpers (``new_figure``, ``panel_axes``, ``figure_title``, ``save_figure``) are used by every figure
kind; paper-specific kinds live beside this module (``figures_feddisco``).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
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
# quantities in percent (their words end in "(%)"): an axis of one stays within 0-100
PERCENT = {name for name, words in QUANTITIES.items() if words.endswith("(%)")}
DIVERGED_WIDTH = 0.8  # a diverged seed's own line: thinner than the methods' means


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


def diverged_runs(summary: pd.DataFrame | None) -> set[tuple[str, str, int]]:
    """(setting, method, seed) of every run summary.csv's ``status`` says diverged; none without a summary."""
    if summary is None:
        return set()
    missing = [c for c in ("setting", "method", "seed", "status") if c not in summary.columns]
    if missing:
        raise ValueError(f"summary lacks columns {missing}")
    gone = summary[summary["status"] == "diverged"]
    return set(zip(gone["setting"].astype(str), gone["method"].astype(str), gone["seed"].astype(int), strict=True))


def _seed_list(seeds: list[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, sorted(seeds)))


def _diverged_text(label: str, panels: list[tuple[str | None, list[int], int]]) -> str:
    """The legend entry of a method's diverged seeds: per panel (its label, None alone in the figure; the
    diverged seeds; all its seeds), which seeds diverged and how many seeds its mean is over."""
    parts = []
    for where, seeds, total in panels:
        done = total - len(seeds)
        mean = f"mean over {done} of {total} seeds" if done else "no mean"
        parts.append(f"{_seed_list(seeds)}{f' in {where}' if where else ''}, {mean}")
    # wrapped: two legend columns of these must fit a two-panel figure's width (90 characters overflowed it)
    return textwrap.fill(f"{label}: × diverged ({'; '.join(parts)})", 55)


def render_curves(spec: dict, runs: pd.DataFrame, out_stem: Path, summary: pd.DataFrame | None = None) -> Figure:
    """Write ``out_stem``.png (150 dpi) and .pdf and return the figure: mean curve per method with a band over
    the seeds that completed; each diverged seed (``summary``'s status; without a summary every seed counts as
    complete) is its own thin line ending in a cross at its last logged point, outside the mean, so the mean
    never jumps where a seed stops. An accuracy axis (a percentage) stays within 0-100.

    spec: name, caption, kind="curve", settings [{setting, label}], methods [{method, label}],
    optional y (default test_acc), x (default round), band ("sd", default, or "ci"), max_round (show
    x <= max_round only). Methods without values of y (a statistic they do not log) are left out.
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
    gone = diverged_runs(summary)
    # A diverged run can log inf; drop those points rather than let them blow up the axis.
    data = data.assign(
        method_label=data["method"].map(to_label), **{y: data[y].replace([np.inf, -np.inf], np.nan)},
        diverged=[key in gone for key in zip(data["setting"].astype(str), data["method"].astype(str),
                                              data["seed"].astype(int), strict=True)],
    )
    complete = data[~data["diverged"]]
    seeds = sorted(set(complete.groupby(["setting", "method"])["seed"].nunique()))
    n_text = ("no seed completed" if not seeds else f"n = {seeds[0]}" if len(seeds) == 1
              else f"n = {seeds[0]}–{seeds[-1]}")

    ncols, nrows = grid_shape(len(settings))
    palette, dashes = method_palette(labels), method_dashes(labels)
    with mpl.rc_context(FIGURE_RC):
        # at least 7 inches wide: a single panel would otherwise clip its caption and legend title
        fig = new_figure(max(3.8 * ncols, 7.0), 3.0 * nrows + 1.2)
        axes = panel_axes(fig, len(settings))
        handles: dict[str, object] = {}
        diverged: dict[str, list[tuple[str | None, list[int], int]]] = {}
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
            done = panel[~panel["diverged"] & panel[y].notna()]
            present = [lab for lab in labels if lab in set(done["method_label"])]
            if present:
                sns.lineplot(
                    data=done[done["method_label"].isin(present)],
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
            _draw_diverged(ax, panel, x, y, palette, None if len(settings) == 1 else setting["label"], diverged)
            if y in PERCENT:  # an sd band around a mean near 100% must not push the axis past 100%
                low, high = ax.get_ylim()
                ax.set_ylim(max(low, 0.0), min(high, 100.0))
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(lab, h)
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        order = [lab for lab in labels if lab in handles]
        for lab in labels:
            if lab in diverged:
                text = _diverged_text(lab, diverged[lab])
                handles[text] = Line2D([], [], color=palette[lab], linewidth=DIVERGED_WIDTH, marker="x")
                order.append(text)
        fig.legend(
            [handles[lab] for lab in order],
            order,
            loc="outside lower center",
            ncols=min(len(order), 6 if not diverged else 2),
            title=f"method (line: mean over the seeds that completed; {band_text}, {n_text})",
        )
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)
    return fig


def _draw_diverged(ax, panel: pd.DataFrame, x: str, y: str, palette: dict[str, str], where: str | None,
                   diverged: dict[str, list[tuple[str | None, list[int], int]]]) -> None:
    """Each diverged seed of the panel as a thin line with a cross at its last logged point; records per method
    label (where, its diverged seeds, all its seeds) in ``diverged`` for the legend."""
    for label, rows in panel.groupby("method_label", sort=False):
        gone = sorted(rows.loc[rows["diverged"], "seed"].unique())
        if not gone or rows[y].isna().all():  # a method that does not log y is left out, as for the means
            continue
        diverged.setdefault(label, []).append((where, [int(s) for s in gone], rows["seed"].nunique()))
        for seed in gone:
            logged = rows[(rows["seed"] == seed) & rows[y].notna()].sort_values(x)
            if len(logged):  # a run that diverged before its first evaluation has no point to draw
                ax.plot(logged[x], logged[y], color=palette[label], linewidth=DIVERGED_WIDTH, marker="x",
                        markevery=[len(logged) - 1], markersize=7, markeredgewidth=1.5)


SWEEP_METRICS = {
    "final_acc": "final test accuracy (%)",
    "best_acc": "best test accuracy (%)",
    "last_k_acc": "mean test accuracy over the last k evaluations (%)",
    "last_k_max_acc": "max test accuracy over the last k evaluations (%)",
}


def sweep_points(spec: dict, summary: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per line label: one row per swept value, its x, the mean and sample sd over seeds of ``spec["metric"]``
    and n (seeds with a value; diverged seeds left out). A value without runs keeps NaN (a gap in the line)."""
    metric = spec["metric"]
    for col in ("setting", "method", "status", metric):
        if col not in summary.columns:
            raise ValueError(f"figure {spec.get('name')}: summary lacks column {col!r}")
    done = summary[(summary["status"] != "diverged") & summary[metric].notna()]
    lines = {}
    for line in spec["lines"]:
        setting = line.get("setting", spec.get("setting"))
        if len(line["methods"]) != len(spec["x_values"]):
            raise ValueError(f"figure {spec.get('name')}: line {line['label']!r} has {len(line['methods'])} "
                             f"methods for {len(spec['x_values'])} x_values")
        rows = []
        for x, method in zip(spec["x_values"], line["methods"], strict=True):
            values = done.loc[(done["setting"] == setting) & (done["method"] == method), metric].astype(float)
            rows.append({"x": x, "method": method, "mean": values.mean() if len(values) else math.nan,
                         "sd": values.std(ddof=1) if len(values) > 1 else math.nan, "n": len(values)})
        lines[line["label"]] = pd.DataFrame(rows)
    if all(frame["n"].sum() == 0 for frame in lines.values()):
        raise ValueError(f"figure {spec.get('name')}: no finished runs for any of its points")
    return lines


def render_sweep_line(spec: dict, summary: pd.DataFrame, out_stem: Path) -> None:
    """Write ``out_stem``.png and .pdf: a metric against a swept hyper-parameter (Feddle's Figs. 8, 9), one
    line per series (e.g. in-domain / out-of-domain server data), mean over seeds with ±1 sd error bars.

    spec: name, caption, kind="sweep_line", metric (a per-run summary column), x_values (the swept values),
    lines [{label, methods (one per x value), setting (default spec["setting"])}], x_label, optional y_label
    and x_scale: "linear", "log" or "categorical" (evenly spaced, e.g. a sweep that includes 0 next to 1e-3).
    """
    lines = sweep_points(spec, summary)
    x_scale = spec.get("x_scale", "linear")
    if x_scale not in ("linear", "log", "categorical"):
        raise ValueError(f"figure {spec.get('name')}: x_scale {x_scale!r} is not linear, log or categorical")
    if x_scale == "log" and min(spec["x_values"]) <= 0:
        raise ValueError(f"figure {spec.get('name')}: a log x axis needs positive x_values")
    positions = list(range(len(spec["x_values"]))) if x_scale == "categorical" else list(spec["x_values"])
    ns = sorted({int(n) for frame in lines.values() for n in frame["n"] if n})
    n_text = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]}"
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(7.0, 4.4)
        ax = fig.subplots()
        # series are no methods (e.g. in- / out-of-domain server data): distinct colours and markers, not the
        # methods' shared palette
        for i, (label, frame) in enumerate(lines.items()):
            ax.errorbar(positions, frame["mean"], yerr=frame["sd"].fillna(0.0), label=label,
                        color=mpl.colormaps["tab10"](i % 10), marker="osD^v"[i % 5], capsize=3)
        if x_scale == "log":
            ax.set_xscale("log")
        ax.set_xticks(positions, [f"{v:g}" for v in spec["x_values"]])
        ax.minorticks_off()
        ax.set_xlabel(spec.get("x_label", "swept value"))
        ax.set_ylabel(spec.get("y_label", SWEEP_METRICS.get(spec["metric"], spec["metric"])))
        ax.legend(loc="best", title=f"mean over seeds; bars: ±1 sd, {n_text}")
        fig.suptitle(figure_title(spec), wrap=True)
        save_figure(fig, out_stem)
