"""FedL2G Fig. 4: a t-SNE of the server's guiding vectors (diamonds) among the clients' own representations
of their test samples (circles), coloured by class, from one seed's ``embeddings.npz`` (fedrepro.hetero.job):
one panel per method, (a) FedL2G-l in the logit space and (b) FedL2G-f in the feature space, as the paper's."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np

from fedrepro.report.figures import figure_title, new_figure, save_figure
from fedrepro.report.style import FIGURE_RC

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
