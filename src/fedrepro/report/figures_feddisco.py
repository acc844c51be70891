"""FedDisco figure kinds: the aggregation-weight probes (Fig. 2), Disco's gain over an (a, b) grid (Fig. 4)
and against one FL argument (Fig. 5), partitions class by client (Fig. 6), global class histograms (Fig. 7),
per-class accuracy (Fig. 8).

Gains pair runs by seed: for every seed where both the method and its baseline finished (status not
"diverged", metric not NaN), d = metric(method) - metric(baseline), in the metric's unit (accuracy in
percent, so gains are points). A gain is the mean of d over those seeds; its spread the sample sd (n-1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from fedrepro.report.figures import figure_title, grid_shape, new_figure, panel_axes, save_figure
from fedrepro.report.style import FIGURE_RC, is_disco_variant, method_palette

METRIC_LABELS = {"best_acc": "best accuracy", "final_acc": "final accuracy", "last_k_acc": "last-k mean accuracy"}
GROUPS = ("head", "middle", "tail")
BAR_COLOR = "#4c72b0"
PER_CLASS = "per_class_acc"
MAX_BUBBLES = 30


def _what(spec: dict) -> str:
    return f"figure {spec.get('name', '?')}"


def _require(spec: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in spec]
    if missing:
        raise ValueError(f"{_what(spec)}: spec lacks {missing}")


def _check_columns(summary: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in summary.columns]
    if missing:
        raise ValueError(f"{what}: summary lacks columns {missing}")


def _one_run_per_seed(summary: pd.DataFrame, setting: str, method: str, what: str) -> pd.DataFrame:
    """The finished runs of one (setting, method); ValueError when there are none at all or seeds repeat."""
    rows = summary[(summary["setting"] == setting) & (summary["method"] == method)]
    if rows.empty:
        raise ValueError(f"{what}: no runs of method {method!r} on setting {setting!r}")
    if "study" in rows.columns and rows["study"].nunique() > 1:
        raise ValueError(f"{what}: ({method}, {setting}) mixes studies {sorted(rows['study'].unique())}")
    repeated = sorted(int(s) for s in rows.loc[rows["seed"].duplicated(), "seed"].unique())
    if repeated:
        raise ValueError(f"{what}: method {method!r} on setting {setting!r} has seeds {repeated} twice")
    return rows[rows["status"] != "diverged"] if "status" in rows.columns else rows


def paired_differences(
    summary: pd.DataFrame, metric: str, setting: str, baseline: str, method: str, what: str = "gain"
) -> pd.Series:
    """metric(method) - metric(baseline) per seed (index, sorted) over the seeds both runs finished."""
    _check_columns(summary, ["setting", "method", "seed", metric], what)
    per_seed = [
        pd.to_numeric(rows[metric], errors="coerce").set_axis(rows["seed"].astype(int)).dropna()
        for rows in (_one_run_per_seed(summary, setting, m, what) for m in (method, baseline))
    ]
    return (per_seed[0] - per_seed[1]).dropna().sort_index().astype(float)


def gain_table(
    summary: pd.DataFrame, metric: str, setting: str, baseline: str, method: str, what: str = "gain"
) -> tuple[float, float, int]:
    """(mean, sample sd, n) of the paired per-seed gain; NaN mean with n = 0, NaN sd with n < 2."""
    d = paired_differences(summary, metric, setting, baseline, method, what)
    n = len(d)
    return (float(d.mean()) if n else math.nan), (float(d.std(ddof=1)) if n > 1 else math.nan), n


def _axis_values(values: list) -> list:
    """Distinct values in ascending order when all are numbers, else in order of first appearance."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numeric else distinct


def _fmt(v: object) -> str:
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def _n_text(ns: list[int]) -> str:
    ns = sorted({n for n in ns if n})
    return f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]}"


def gain_grid_matrix(spec: dict, summary: pd.DataFrame) -> tuple[list, list, np.ndarray, np.ndarray]:
    """(x values, y values, gain[y, x], n[y, x]) for a gain_grid spec; NaN gain where no pair finished."""
    _require(spec, ("metric", "setting", "baseline", "cells"))
    what = _what(spec)
    cells = spec["cells"]
    xs, ys = _axis_values([c["x"] for c in cells]), _axis_values([c["y"] for c in cells])
    gain, n = np.full((len(ys), len(xs)), np.nan), np.zeros((len(ys), len(xs)), dtype=int)
    seen: set[tuple] = set()
    for c in cells:
        if (c["x"], c["y"]) in seen:
            raise ValueError(f"{what}: two cells at x={c['x']}, y={c['y']}")
        seen.add((c["x"], c["y"]))
        i, j = ys.index(c["y"]), xs.index(c["x"])
        mean, _, n[i, j] = gain_table(summary, spec["metric"], spec["setting"], spec["baseline"], c["method"], what)
        gain[i, j] = mean
    return xs, ys, gain, n


def render_gain_grid(spec: dict, summary: pd.DataFrame, out_stem: Path) -> None:
    """Fig. 4: heatmap of the paired gain (method - baseline, points) over a 2-d hyper-parameter grid.

    Grid positions without a cell, or whose runs all diverged, stay blank.
    """
    xs, ys, gain, n = gain_grid_matrix(spec, summary)
    if np.isnan(gain).all():
        raise ValueError(f"{_what(spec)}: no cell has a finished pair of runs on setting {spec['setting']!r}")
    lim = float(np.nanmax(np.abs(gain))) or 1.0
    metric = METRIC_LABELS.get(spec["metric"], spec["metric"])
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(max(5.5, 0.8 * len(xs) + 2.6), max(3.8, 0.5 * len(ys) + 2.4))
        ax = fig.subplots()
        image = ax.imshow(np.ma.masked_invalid(gain), cmap="RdBu", vmin=-lim, vmax=lim, origin="lower", aspect="auto")
        ax.grid(False)
        for (i, j), g in np.ndenumerate(gain):
            if not np.isnan(g):
                color = "white" if abs(g) > 0.6 * lim else "black"
                ax.text(j, i, f"{g:+.2f}", ha="center", va="center", color=color, fontsize=8)
        ax.set_xticks(range(len(xs)), [_fmt(x) for x in xs])
        ax.set_yticks(range(len(ys)), [_fmt(y) for y in ys])
        ax.set_xlabel(spec.get("x_label", "x"))
        ax.set_ylabel(spec.get("y_label", "y"))
        setting, baseline = spec.get("setting_label", spec["setting"]), spec.get("baseline_label", spec["baseline"])
        ax.set_title(f"{setting}: vs {baseline}\n(paired mean over seeds, {_n_text(n.ravel())})", fontsize=10)
        fig.colorbar(image, ax=ax, label=f"gain in {metric} (points)")
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)


def render_gain_lines(spec: dict, summary: pd.DataFrame, out_stem: Path) -> None:
    """Fig. 5: paired gain (method - baseline) per series against one argument, error bars ±1 sd of d.

    The x values sit at equal spacing (categorical, ascending when numeric), as the paper plots them.
    """
    _require(spec, ("metric", "points", "series"))
    what, points, series = _what(spec), spec["points"], spec["series"]
    xs = _axis_values([p["x"] for p in points])
    if len(xs) != len(points):
        raise ValueError(f"{what}: two points share an x value")
    tables = {
        s.get("label", s["method"]): [
            gain_table(summary, spec["metric"], p["setting"], s["baseline"], s["method"], what) for p in points
        ]
        for s in series
    }
    if all(n == 0 for rows in tables.values() for _, _, n in rows):
        raise ValueError(f"{what}: no point has a finished pair of runs")
    palette = method_palette(list(tables))
    metric = METRIC_LABELS.get(spec["metric"], spec["metric"])
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(max(4.8, 0.9 * len(xs) + 2.5), 4.2)
        ax = fig.subplots()
        ax.axhline(0.0, color="0.3", lw=0.8, ls=":")
        for k, (label, rows) in enumerate(tables.items()):
            pos = np.array([xs.index(p["x"]) for p in points]) + (k - (len(series) - 1) / 2) * 0.06
            order = np.argsort(pos)
            mean, sd = (np.array([r[i] for r in rows])[order] for i in (0, 1))
            ax.errorbar(
                pos[order], mean, yerr=np.nan_to_num(sd), marker="o", capsize=3, color=palette[label], label=label
            )
        ax.set_xticks(range(len(xs)), [_fmt(x) for x in xs])
        ax.set_xlabel(spec.get("x_label", "x"))
        ax.set_ylabel(f"gain in {metric} (points)")
        ns = [n for rows in tables.values() for _, _, n in rows]
        ax.legend(title=f"paired mean ± 1 sd over seeds ({_n_text(ns)})", loc="best")
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)


def _stats_for(stats: dict[str, dict], entry: dict, what: str) -> dict:
    # Keyed by the setting's key; its label is accepted too.
    found = stats.get(entry["setting"], stats.get(entry.get("label", entry["setting"])))
    if found is None:
        raise ValueError(f"{what}: no partition stats for setting {entry['setting']!r}")
    return found


def class_matrix(stats: dict, what: str = "partition") -> np.ndarray:
    """Client x class sample counts (float array) of one partition stats dict, checked for shape."""
    try:
        counts = np.asarray(stats["class_counts"], dtype=float)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{what}: stats lack a rectangular class_counts ({err})") from err
    classes = stats.get("num_classes", counts.shape[-1] if counts.ndim == 2 else 0)
    if counts.ndim != 2 or counts.shape[0] == 0 or counts.shape[1] != classes:
        raise ValueError(f"{what}: class_counts has shape {counts.shape}, expected (clients, {classes})")
    if stats.get("clients", counts.shape[0]) != counts.shape[0]:
        raise ValueError(f"{what}: stats say {stats['clients']} clients but class_counts has {counts.shape[0]}")
    if (counts < 0).any():
        raise ValueError(f"{what}: class_counts has negative entries")
    return counts


def _panels(spec: dict, stats: dict[str, dict]) -> list[tuple[dict, dict, np.ndarray]]:
    """(settings entry, its stats, its client x class counts) per panel."""
    _require(spec, ("settings",))
    what, panels = _what(spec), []
    for entry in spec["settings"]:
        found = _stats_for(stats, entry, what)
        panels.append((entry, found, class_matrix(found, f"{what}, setting {entry['setting']!r}")))
    return panels


def _integer_ticks(axis, n: int) -> None:
    if n <= 20:
        axis.set_ticks(range(n))
    else:
        axis.set_major_locator(MaxNLocator(integer=True))


def _round_sig(x: float) -> float:
    return float(f"{x:.1g}") if x >= 1 else x


def _bubbles(ax, counts: np.ndarray) -> None:
    k, c = counts.shape
    # The largest bubble about fills one cell of a ~230 x 170 pt plot area.
    top, s_max = counts.max() or 1.0, (0.9 * min(230 / k, 170 / c)) ** 2
    client, cls = np.nonzero(counts)
    ax.scatter(client, cls, s=s_max * counts[client, cls] / top, color=BAR_COLOR, alpha=0.75, lw=0)
    refs = sorted({_round_sig(top * f) for f in (1.0, 0.5, 0.1)} - {0.0}, reverse=True)
    handles = [ax.scatter([], [], s=s_max * r / top, color=BAR_COLOR, alpha=0.75, lw=0) for r in refs]
    ax.legend(
        handles,
        [f"{r:g}" for r in refs],
        title="samples",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
        labelspacing=1.2,
        borderpad=0.2,
    )


def render_partition(spec: dict, stats: dict[str, dict], out_stem: Path) -> None:
    """Fig. 6: class-by-client bubbles (area ∝ samples), one panel per setting; stats keyed by setting.

    A panel with more than ``MAX_BUBBLES`` clients or classes is a heatmap instead (dots would vanish).
    """
    panels = _panels(spec, stats)
    ncols, nrows = grid_shape(len(panels))
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(4.8 * ncols, 3.6 * nrows + 0.6)
        for ax, (entry, found, counts) in zip(panel_axes(fig, len(panels)), panels, strict=True):
            k, c = counts.shape
            if max(k, c) > MAX_BUBBLES:
                image = ax.imshow(counts.T, cmap="Blues", origin="lower", aspect="auto", interpolation="nearest")
                ax.grid(False)
                fig.colorbar(image, ax=ax, label="samples")
            else:
                _bubbles(ax, counts)
            ax.set(xlim=(-0.6, k - 0.4), ylim=(-0.6, c - 0.4), xlabel="client", ylabel="class")
            _integer_ticks(ax.xaxis, k)
            _integer_ticks(ax.yaxis, c)
            title = f"{entry.get('label', entry['setting'])}\nK = {k} clients, {int(counts.sum()):,} samples"
            dropped = int(found.get("dropped", 0))
            ax.set_title(title + (f" ({dropped:,} in no client)" if dropped else ""))
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)


def render_class_histogram(spec: dict, stats: dict[str, dict], out_stem: Path) -> None:
    """Fig. 7: samples per class summed over clients, one panel per setting, max/min ratio noted."""
    panels = _panels(spec, stats)
    ncols, nrows = grid_shape(len(panels))
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(3.6 * ncols, 3.0 * nrows + 0.6)
        for ax, (entry, _, counts) in zip(panel_axes(fig, len(panels)), panels, strict=True):
            totals = counts.sum(axis=0)
            ax.bar(range(len(totals)), totals, color=BAR_COLOR, width=0.8)
            ratio = f"max/min = {totals.max() / totals.min():.1f}" if totals.min() > 0 else "a class is empty"
            title = f"{entry.get('label', entry['setting'])}\n{int(totals.sum()):,} samples, {ratio}"
            ax.set(xlabel="class", ylabel="samples (all clients)", title=title)
            _integer_ticks(ax.xaxis, len(totals))
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)


def _parse_per_class(value: object) -> list | None:
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.strip():
        return json.loads(value)
    return None


def per_class_table(summary: pd.DataFrame, setting: str, method: str, what: str = "per_class") -> tuple:
    """(mean, sample sd, n) per class over the finished seeds of one (setting, method) with per_class_acc."""
    if PER_CLASS not in summary.columns:
        raise ValueError(f"{what}: summary has no {PER_CLASS} column (no run recorded per-class accuracy)")
    _check_columns(summary, ["setting", "method", "seed"], what)
    rows = _one_run_per_seed(summary, setting, method, what)
    lists = [v for v in map(_parse_per_class, rows[PER_CLASS]) if v is not None]
    if not lists:
        raise ValueError(f"{what}: no finished run of method {method!r} on setting {setting!r} has {PER_CLASS}")
    if len({len(v) for v in lists}) > 1:
        raise ValueError(f"{what}: {PER_CLASS} of {method!r} on {setting!r} has differing lengths")
    acc = np.array(lists, dtype=float)  # null (class absent from the test set) -> NaN
    sd = acc.std(axis=0, ddof=1) if len(acc) > 1 else np.full(acc.shape[1], np.nan)
    return acc.mean(axis=0), sd, len(acc)


def head_middle_tail(acc: np.ndarray, class_order: list[int] | None = None) -> dict[str, float]:
    """Mean accuracy of the head / middle / tail thirds of ``class_order`` (default: class index order,
    the paper's frequency-sorted long tail; C = 10 splits 4/3/3 as Fig. 8), plus avg and the
    population sd over classes."""
    acc = np.asarray(acc, dtype=float)
    order = list(range(len(acc))) if class_order is None else list(class_order)
    if sorted(order) != list(range(len(acc))) or len(acc) < 3:
        raise ValueError(f"class_order {order} is not a permutation of {len(acc)} (>= 3) classes")
    parts = np.array_split(np.array(order), 3)
    out = {g: float(np.nanmean(acc[p])) for g, p in zip(GROUPS, parts, strict=True)}
    return out | {"avg": float(np.nanmean(acc)), "sd": float(np.nanstd(acc))}


def render_per_class(spec: dict, summary: pd.DataFrame, out_stem: Path) -> None:
    """Fig. 8: per-class accuracy (mean over seeds, ±1 sd bars) per method on one setting, classes in
    ``class_order`` (default: index order) and head/middle/tail thirds shaded, their means in the legend."""
    _require(spec, ("setting", "methods"))
    what, methods = _what(spec), spec["methods"]
    tables = {
        m.get("label", m["method"]): per_class_table(summary, spec["setting"], m["method"], what) for m in methods
    }
    sizes = {len(mean) for mean, _, _ in tables.values()}
    if len(sizes) > 1:
        raise ValueError(f"{what}: methods report different numbers of classes {sorted(sizes)}")
    n_classes = sizes.pop()
    order = spec.get("class_order") or list(range(n_classes))
    try:
        groups = {label: head_middle_tail(mean, order) for label, (mean, _, _) in tables.items()}
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from err
    palette, width = method_palette(list(tables)), 0.8 / len(tables)
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(min(16.0, max(6.5, 0.3 * n_classes * len(tables) + 2.5)), 4.8)
        ax = fig.subplots()
        spans = dict(zip(GROUPS, np.array_split(np.arange(n_classes), 3), strict=True))
        for name, pos in spans.items():
            if name == "middle":
                ax.axvspan(pos[0] - 0.5, pos[-1] + 0.5, color="0.92", zorder=0)
            ax.text(pos.mean(), 1.01, name, transform=ax.get_xaxis_transform(), ha="center")
        for j, (label, (mean, sd, n)) in enumerate(tables.items()):
            g = groups[label]
            text = " · ".join(f"{k} {g[k]:.1f}" for k in (*GROUPS, "avg", "sd"))
            ax.bar(
                np.arange(n_classes) + (j - (len(tables) - 1) / 2) * width,
                mean[order],
                width,
                yerr=np.nan_to_num(sd[order]),
                color=palette[label],
                hatch="//" if is_disco_variant(label) else None,
                edgecolor="white",
                lw=0,
                label=f"{label} (n = {n}): {text}",
                error_kw={"lw": 0.8, "capsize": 1.5},
                zorder=2,
            )
            for name, pos in spans.items():  # the group's mean, dashed across its classes
                ax.hlines(g[name], pos[0] - 0.45, pos[-1] + 0.45, colors=palette[label], linestyles="--", zorder=3)
        ax.set_xticks(range(n_classes), [str(c) for c in order])
        ax.set_xlim(-0.6, n_classes - 0.4)
        ax.set_xlabel("class (head → tail)" + ("" if spec.get("class_order") else ": index order"))
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{spec['setting']}", pad=16)
        fig.legend(
            loc="outside lower center",
            ncols=1,
            title="mean over seeds, bars ±1 sd; head/middle/tail/avg: mean over classes, sd: over classes",
        )
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)


# ---------------------------------------------------------------- Fig. 2: weight probes

PROBE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _probe_values(summary: pd.DataFrame, metric: str, setting: str, method: str, what: str) -> dict[int, float]:
    """seed -> metric of the finished runs of one probe method (no runs: {}; diverged or NaN seeds left out)."""
    rows = summary[(summary["setting"] == setting) & (summary["method"] == method)]
    if rows.empty:
        return {}
    rows = _one_run_per_seed(summary, setting, method, what)
    values = pd.to_numeric(rows[metric], errors="coerce").set_axis(rows["seed"].astype(int)).dropna()
    return {int(s): float(v) for s, v in values.items()}


def weight_probe_tables(spec: dict, summary: pd.DataFrame, stats: dict[int, dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two tables behind Fig. 2, from the probe runs and each seed's partition stats.

    pairs: one row per (pair, r, seed): the aggregate's metric, the pair's clients A and B (A farther from
    uniform, weight 1 - r), their discrepancy gap and relative size gap. clients: one row per (client,
    seed): its own model's metric, its relative size n_k / n and its l2 discrepancy to uniform.
    """
    from fedrepro.algorithms.weighting import PAIR_SIZE_TOLERANCE, client_discrepancy, client_pairs

    _require(spec, ("metric", "setting", "pairs", "clients"))
    what, metric, setting = _what(spec), spec["metric"], spec["setting"]
    _check_columns(summary, ["setting", "method", "seed", metric], what)
    pair_rows, client_rows = [], []
    for seed, found in sorted(stats.items()):
        counts = class_matrix(found, f"{what}, seed {seed}")
        sizes, disc = counts.sum(axis=1), client_discrepancy(counts)
        pairs = client_pairs(counts, spec.get("size_tolerance", PAIR_SIZE_TOLERANCE))
        for cell in spec["pairs"]:
            value = _probe_values(summary, metric, setting, cell["method"], what).get(seed)
            if value is None or cell["pair"] >= len(pairs):
                continue
            a, b = pairs[cell["pair"]]
            pair_rows.append({"pair": cell["pair"], "r": float(cell["r"]), "seed": seed, "value": value, "a": a, "b": b,
                              "disc_gap": float(disc[a] - disc[b]),
                              "size_gap": float(abs(sizes[a] - sizes[b]) / max(sizes[a], sizes[b]))})
        for cell in spec["clients"]:
            value = _probe_values(summary, metric, setting, cell["method"], what).get(seed)
            if value is None or cell["client"] >= len(counts):
                continue
            client_rows.append({"client": cell["client"], "seed": seed, "value": value,
                                "relative_size": float(sizes[cell["client"]] / sizes.sum()),
                                "discrepancy": float(disc[cell["client"]])})
    pair_cols = ["pair", "r", "seed", "value", "a", "b", "disc_gap", "size_gap"]
    client_cols = ["client", "seed", "value", "relative_size", "discrepancy"]
    pairs_df, clients_df = pd.DataFrame(pair_rows, columns=pair_cols), pd.DataFrame(client_rows, columns=client_cols)
    if pairs_df.empty and clients_df.empty:
        raise ValueError(f"{what}: no finished probe run on setting {setting!r} matches a seed's partition stats")
    return pairs_df, clients_df


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN with fewer than 3 points or a constant side."""
    x, y = pd.Series(np.asarray(x, dtype=float)), pd.Series(np.asarray(y, dtype=float))
    if len(x) < 3 or x.nunique() < 2 or y.nunique() < 2:
        return math.nan
    return float(np.corrcoef(x.rank(), y.rank())[0, 1])


def _mean_spearman(clients: pd.DataFrame, column: str) -> tuple[float, int]:
    """Spearman's rho of the metric against ``column`` within each seed, averaged over seeds (its n)."""
    rhos = [spearman(g[column], g["value"]) for _, g in clients.groupby("seed")]
    rhos = [r for r in rhos if not math.isnan(r)]
    return (float(np.mean(rhos)) if rhos else math.nan), len(rhos)


def render_weight_probe(spec: dict, summary: pd.DataFrame, stats: dict[int, dict], out_stem: Path) -> None:
    """Fig. 2: (a) the partition of ``spec["seed"]``; (b) the accuracy of (1 - r) w_A + r w_B against r per
    pair (mean over seeds, band ±1 sd, star at the best r); (c), (d) each client's own-model accuracy against
    its relative size and its l2 discrepancy to uniform, every seed, with the mean within-seed Spearman rho.

    ``stats``: seed -> the setting's partition stats for that seed (the pairs and sizes are per seed).
    """
    pairs, clients = weight_probe_tables(spec, summary, stats)
    seed = spec.get("seed", 0)
    metric = METRIC_LABELS.get(spec["metric"], spec["metric"])
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(18.0, 4.6)
        ax_a, ax_b, ax_c, ax_d = panel_axes(fig, 4)
        if seed in stats:
            counts = class_matrix(stats[seed], f"{_what(spec)}, seed {seed}")
            _bubbles(ax_a, counts)
            k, c = counts.shape
            ax_a.set(xlim=(-0.6, k - 0.4), ylim=(-0.6, c - 0.4), xlabel="client", ylabel="class")
            _integer_ticks(ax_a.xaxis, k)
            _integer_ticks(ax_a.yaxis, c)
            ax_a.set_title(f"(a) data distributions (seed {seed})")
        else:
            ax_a.set_axis_off()
            ax_a.set_title(f"(a) no partition stats for seed {seed}")
        for i, (p, rows) in enumerate(pairs.groupby("pair")):
            color = PROBE_COLORS[i % len(PROBE_COLORS)]
            by_r = rows.groupby("r")["value"]
            r, mean, sd = by_r.mean().index.to_numpy(), by_r.mean().to_numpy(), by_r.std(ddof=1).to_numpy()
            n = int(rows["seed"].nunique())
            label = (f"pair {p + 1}: d_A - d_B = {rows['disc_gap'].mean():.2f}, sizes within "
                     f"{rows['size_gap'].max():.0%} (n = {n})")
            ax_b.plot(r, mean, marker="o", ms=3, color=color, label=label)
            ax_b.fill_between(r, mean - np.nan_to_num(sd), mean + np.nan_to_num(sd), color=color, alpha=0.15, lw=0)
            best = int(np.nanargmax(mean))
            ax_b.plot(r[best], mean[best], marker="*", ms=14, color=color, mec="black", mew=0.6, zorder=4)
        ax_b.axvline(0.5, color="0.3", lw=0.8, ls=":")
        ax_b.set(xlabel="r (weight of model B, the client nearer uniform)", ylabel=f"{metric} of the aggregate (%)",
                 title="(b) aggregation (1 - r) w_A + r w_B")
        if not pairs.empty:
            ax_b.legend(loc="best", fontsize=7, title="mean ± 1 sd over seeds; ★ best r", title_fontsize=7)
        for ax, column, xlabel, panel in ((ax_c, "relative_size", "relative dataset size n_k / n", "(c) dataset size"),
                                          (ax_d, "discrepancy", "discrepancy (l2 to uniform)", "(d) discrepancy")):
            for i, (s, rows) in enumerate(clients.groupby("seed")):
                ax.scatter(rows[column], rows["value"], s=22, color=PROBE_COLORS[i % len(PROBE_COLORS)],
                           label=f"seed {s}", alpha=0.85, lw=0)
            rho, n = _mean_spearman(clients, column)
            ax.set(xlabel=xlabel, ylabel=f"{metric} of the client's own model (%)",
                   title=f"{panel}\nSpearman ρ = {rho:+.2f} (mean over {n} seeds)" if n else panel)
            if not clients.empty:
                ax.legend(loc="best", fontsize=7)
        fig.suptitle(figure_title(spec), wrap=True)  # long captions wrap, never clip
        save_figure(fig, out_stem)
