"""FedL2G Fig. 1: each method's "negative effect" on the clients' own objective (the largest rise of their
cross-entropy above its lowest value so far) beside its best test accuracy, from runs.csv.

FedL2G Fig. 4: a t-SNE of the server's guiding vectors (diamonds) among the clients' own representations
of their test samples (circles), coloured by class, from one seed's ``embeddings.npz`` (fedrepro.hetero.job):
one panel per method, (a) FedL2G-l in the logit space and (b) FedL2G-f in the feature space, as the paper's."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd

from fedrepro.report.figures import AXIS_LABELS, figure_title, new_figure, save_figure
from fedrepro.report.style import FIGURE_RC, method_palette

EMBEDDING_KEYS = ("anchors", "space", "features", "labels", "clients")


def tsne_points(arrays: dict[str, np.ndarray], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """2-d t-SNE coordinates of the clients' representations and of the anchors, embedded together."""
    from sklearn.manifold import TSNE

    missing = [k for k in EMBEDDING_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"embeddings lack {missing}")
    feats, anchors = np.asarray(arrays["features"], float), np.asarray(arrays["anchors"], float)
    if feats.shape[1] != anchors.shape[1]:
        raise ValueError(f"features are {feats.shape[1]}-d but anchors {anchors.shape[1]}-d: not one space")
    both = np.concatenate([feats, anchors])
    perplexity = float(min(30.0, max(2.0, (len(both) - 1) / 3)))
    xy = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(both)
    return xy[: len(feats)], xy[len(feats):]


def render_tsne(spec: dict, panels: list[dict[str, np.ndarray]], out_stem: Path) -> None:
    """One panel per method of ``spec["methods"]`` (its embeddings in ``panels``, in that order): circles =
    client representations, diamonds = anchors, one colour per class. Each panel is its own t-SNE (a logit
    and a feature space are not one space)."""
    methods = spec["methods"]
    if len(methods) != len(panels):
        raise ValueError(f"figure {spec.get('name')}: {len(methods)} methods but {len(panels)} embeddings")
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(5.6 * len(panels), 5.0)
        axes = fig.subplots(1, len(panels), squeeze=False).ravel()
        for i, (ax, method, arrays) in enumerate(zip(axes, methods, panels, strict=True)):
            points, anchors = tsne_points(arrays, seed=int(spec.get("seed", 0)))
            labels = np.asarray(arrays["labels"])
            classes = len(anchors)
            cmap = mpl.colormaps["tab10" if classes <= 10 else "turbo"].resampled(classes)
            ax.scatter(points[:, 0], points[:, 1], c=labels, cmap=cmap, vmin=-0.5, vmax=classes - 0.5, s=12,
                       alpha=0.55, linewidths=0, label=f"clients' {arrays['space']} vectors (test samples)")
            ax.scatter(anchors[:, 0], anchors[:, 1], c=np.arange(classes), cmap=cmap, vmin=-0.5,
                       vmax=classes - 0.5, marker="D", s=90, edgecolors="black", linewidths=1.2,
                       label="guiding vectors")
            prefix = f"({chr(ord('a') + i)}) " if len(panels) > 1 else ""
            ax.set(xticks=[], yticks=[], xlabel="t-SNE 1", ylabel="t-SNE 2",
                   title=f"{prefix}{method['label']}, {arrays['space']} space: {len(points)} samples of "
                         f"{len(np.unique(arrays['clients']))} clients")
            ax.legend(loc="best", fontsize="small")
        fig.suptitle(f"{figure_title(spec)}\n{spec.get('setting_label', spec.get('setting', ''))}, "
                     f"seed {spec.get('seed', 0)}")
        save_figure(fig, out_stem)


def negative_effect(losses: pd.Series | list[float]) -> float:
    """The paper's "negative effect" of one run: the maximum increase of the local loss over the lowest value
    it reached in earlier rounds, max_t (l_t - min_{s<t} l_s), or 0 if it never rises. Rounds without a loss
    (FedL2G's warm-up: nobody trains) are skipped; NaN with fewer than two losses."""
    values = [float(v) for v in losses if v is not None and not math.isnan(float(v))]
    if len(values) < 2:
        return math.nan
    lowest, worst = values[0], 0.0
    for v in values[1:]:
        worst = max(worst, v - lowest)
        lowest = min(lowest, v)
    return worst


def negative_effects(spec: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Per method of ``spec["methods"]`` and seed on ``spec["setting"]``: the negative effect of its ``y``
    curve (a loss, by round) and its best test accuracy over rounds (the tables' best_acc)."""
    y = spec.get("y", "train_ce")
    for col in ("setting", "method", "seed", "round", "test_acc", y):
        if col not in runs.columns:
            raise ValueError(f"figure {spec.get('name')}: runs lack column {col!r}")
    rows = []
    for m in spec["methods"]:
        mine = runs[(runs["setting"] == spec["setting"]) & (runs["method"] == m["method"])]
        for seed, curve in mine.groupby("seed"):
            curve = curve.sort_values("round")
            rows.append({"method": m["method"], "label": m["label"], "seed": seed,
                         "negative_effect": negative_effect(curve[y]), "best_acc": float(curve["test_acc"].max())})
    if not rows:
        raise ValueError(f"figure {spec.get('name')}: no runs of {[m['method'] for m in spec['methods']]} "
                         f"on {spec['setting']!r}")
    return pd.DataFrame(rows)


def render_negative_effect(spec: dict, runs: pd.DataFrame, out_stem: Path) -> None:
    """Two bar panels, one bar per method (mean over seeds, whisker +-1 sd): (a) the negative effect on
    ``y`` (default train_ce, the clients' plain cross-entropy), (b) the best test accuracy."""
    y = spec.get("y", "train_ce")
    per_seed = negative_effects(spec, runs)
    labels = [m["label"] for m in spec["methods"]]
    stats = per_seed.groupby("label", sort=False)[["negative_effect", "best_acc"]].agg(["mean", "std"])
    stats = stats.reindex([lab for lab in labels if lab in stats.index])
    seeds = sorted(set(per_seed.groupby("label")["seed"].nunique()))
    n_text = f"n = {seeds[0]}" if len(seeds) == 1 else f"n = {seeds[0]}–{seeds[-1]}"
    colors = method_palette(list(stats.index))
    panels = [("negative_effect", f"negative effect on the\n{AXIS_LABELS.get(y, y)}"),
              ("best_acc", "best test accuracy (%)")]
    with mpl.rc_context(FIGURE_RC):
        fig = new_figure(max(7.0, 1.4 * len(stats) * 2 + 2.0), 4.8)
        axes = fig.subplots(1, 2)
        for i, (ax, (column, ylabel)) in enumerate(zip(axes, panels, strict=True)):
            mean, sd = stats[(column, "mean")], stats[(column, "std")].fillna(0.0)
            x = np.arange(len(stats))
            # bars from zero, each labelled with its mean (the accuracies differ by a few points)
            ax.bar(x, mean, yerr=sd, capsize=4, color=[colors[lab] for lab in stats.index])
            for xi, value, spread in zip(x, mean, sd, strict=True):
                if not math.isnan(value):  # above the whisker
                    ax.annotate(f"{value:.2f}", (xi, value + spread), textcoords="offset points", xytext=(0, 3),
                                ha="center", va="bottom", fontsize="small")
            ax.set_xticks(x, list(stats.index), rotation=20, ha="right")
            ax.set(ylabel=ylabel, title=f"({chr(ord('a') + i)})")
        fig.suptitle(f"{figure_title(spec)}\n{spec.get('setting_label', spec['setting'])}: "
                     f"bars: mean over seeds, whiskers: ±1 sd ({n_text})", wrap=True)
        save_figure(fig, out_stem)
