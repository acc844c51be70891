"""Curve figures a reader can trust: an accuracy axis stays within 0-100 %, and a diverged seed is drawn on its own
(a thin line, a cross where it stopped) instead of pulling the method's mean down where it stops logging."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest

import fedrepro.report.figures as figures
from fedrepro.report.style import method_color

SPEC = {"name": "c", "caption": "curves", "settings": [{"setting": "s", "label": "S"}],
        "methods": [{"method": "fedavg", "label": "FedAvg"}, {"method": "fedprox", "label": "FedProx"}]}
ROUNDS = 6


def frame(accs: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    """runs.csv rows of setting "s": (method, seed) -> test accuracy per round, from round 1."""
    return pd.DataFrame([{"setting": "s", "method": m, "seed": seed, "round": r, "test_acc": acc}
                         for (m, seed), values in accs.items() for r, acc in enumerate(values, start=1)])


def statuses(accs: dict, diverged: set[tuple[str, int]]) -> pd.DataFrame:
    """summary.csv rows of the same runs: status diverged for ``diverged``, complete for the rest."""
    return pd.DataFrame([{"setting": "s", "method": m, "seed": seed,
                          "status": "diverged" if (m, seed) in diverged else "complete"} for m, seed in accs])


@pytest.fixture
def draw(monkeypatch, tmp_path: Path):
    """render_curves without writing files; returns the figure it would have saved."""
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, stem: drawn.append(fig))

    def run(runs: pd.DataFrame, *summary: pd.DataFrame):
        returned = figures.render_curves(SPEC, runs, tmp_path / "c", *summary)
        assert returned is drawn[-1]
        return drawn[-1]

    return run


def lines_of(ax, label: str, marker: str) -> list:
    """The method's drawn lines with that marker (seaborn's empty legend proxies left out)."""
    return [ln for ln in ax.lines if mpl.colors.same_color(ln.get_color(), method_color(label))
            and ln.get_marker() == marker and len(ln.get_xdata())]


def test_an_accuracy_axis_stops_at_100_even_where_the_sd_band_does_not(draw) -> None:
    # mean 96 at the last round, sd 6.9: the band reaches 102.9
    accs = {("fedavg", 0): [50, 80, 100], ("fedavg", 1): [52, 82, 100], ("fedavg", 2): [48, 78, 88],
            ("fedprox", 0): [40, 60, 70], ("fedprox", 1): [42, 62, 72]}
    ax = draw(frame(accs)).axes[0]
    band_top = max(path.vertices[:, 1].max() for band in ax.collections for path in band.get_paths())
    assert band_top > 100
    low, high = ax.get_ylim()
    assert low >= 0 and high == 100


def test_a_diverged_seed_is_left_out_of_the_mean_and_drawn_with_a_cross_where_it_stopped(draw) -> None:
    rng = np.random.default_rng(0)
    accs = {("fedavg", s): list(rng.uniform(60, 97, ROUNDS)) for s in (0, 1)} | {("fedavg", 2): [30.0, 20.0, 10.0]}
    accs |= {("fedprox", s): list(rng.uniform(60, 97, ROUNDS)) for s in (0, 1, 2)}
    fig = draw(frame(accs), statuses(accs, {("fedavg", 2)}))
    ax = fig.axes[0]

    (mean,) = lines_of(ax, "FedAvg", "None")
    assert list(mean.get_xdata()) == list(range(1, ROUNDS + 1))
    assert mean.get_ydata() == pytest.approx(np.mean([accs[("fedavg", 0)], accs[("fedavg", 1)]], axis=0))
    (gone,) = lines_of(ax, "FedAvg", "x")
    assert list(gone.get_xdata()) == [1, 2, 3] and list(gone.get_ydata()) == [30.0, 20.0, 10.0]
    assert gone.get_markevery() == [2]  # the cross only at its last logged point
    assert not lines_of(ax, "FedProx", "x")

    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "FedAvg: × diverged (seed 2, mean over 2 of 3 seeds)" in legend
    assert "the seeds that completed" in fig.legends[0].get_title().get_text()


def test_a_method_whose_every_seed_diverged_has_no_mean(draw) -> None:
    accs = {("fedavg", 0): [20.0, 10.0], ("fedavg", 1): [25.0], ("fedprox", 0): [50.0, 60.0, 70.0]}
    fig = draw(frame(accs), statuses(accs, {("fedavg", 0), ("fedavg", 1)}))
    ax = fig.axes[0]
    assert not lines_of(ax, "FedAvg", "None")
    assert sorted(ln.get_xdata()[-1] for ln in lines_of(ax, "FedAvg", "x")) == [1, 2]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["FedProx", "FedAvg: × diverged (seeds 0, 1, no mean)"]
