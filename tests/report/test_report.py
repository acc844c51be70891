"""Tests for fedrepro.report: collecting run folders, tables beside published numbers, figures, colours."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
from support.report import make_run

from fedrepro.report.collect import METRIC_COLUMNS, RunDataError, collect_runs, write_csv_atomic
from fedrepro.report.convergence import add_plateau_changes
from fedrepro.report.published import load_published, lookup
from fedrepro.report.style import KNOWN_COLORS, method_color, method_dashes, method_palette
from fedrepro.report.tables import EMBEDDED_NOTE, render_table

FEDDISCO_CSV = Path(__file__).resolve().parents[2] / "config" / "paper" / "feddisco.csv"
SETTINGS = ("c10_niid1", "c10_niid2")
METHODS = ("fedavg", "fedprox")


# best_acc per (setting, method): three seeds each, chosen so mean/std are easy to check by hand.
BEST = {
    ("c10_niid1", "fedavg"): [69.0, 70.0, 71.0],
    ("c10_niid1", "fedprox"): [72.0, 74.0, 76.0],
    ("c10_niid2", "fedavg"): [60.0, 61.0, 65.0],
    ("c10_niid2", "fedprox"): [50.0, 52.0, 51.0],
}


@pytest.fixture
def grid_runs(tmp_path: Path) -> list[Path]:
    dirs = []
    for (setting, method), bests in BEST.items():
        for seed, best in enumerate(bests):
            dirs.append(make_run(tmp_path, setting, method, seed, [best - 10, best, best - 1]))
    return dirs


def table_spec(**overrides) -> dict:
    spec = {
        "name": "table1",
        "caption": "Test accuracy under NIID-1/NIID-2",
        "paper_table": "Table 1",
        "metric": "best_acc",
        "rows": [
            {"method": "fedavg", "label": "FedAvg", "paper": "FedAvg"},
            {"method": "fedprox", "label": "FedProx", "paper": "FedProx"},
        ],
        "columns": [
            {"setting": "c10_niid1", "label": "CIFAR-10 NIID-1", "paper": "CIFAR-10 | NIID-1"},
            {"setting": "c10_niid2", "label": "CIFAR-10 NIID-2 (no_map)", "paper": None},
        ],
    }
    spec.update(overrides)
    return spec


# ---------------------------------------------------------------- collect


def test_collect_runs_shapes_and_values(grid_runs: list[Path]) -> None:
    runs, summary = collect_runs(grid_runs)
    assert len(runs) == 12 * 3
    assert len(summary) == 12
    assert list(runs.columns[:4]) == ["study", "setting", "method", "seed"]
    assert set(METRIC_COLUMNS + ["lr"]) <= set(runs.columns)
    assert list(summary.columns) == [
        "study", "setting", "method", "seed", "status", "diverged_round",
        "final_acc", "best_acc", "last_k_acc", "last_k", "seconds",
    ]  # fmt: skip
    one = runs[(runs.setting == "c10_niid2") & (runs.method == "fedavg") & (runs.seed == 2)]
    assert one["round"].tolist() == [1, 2, 3]
    assert one["test_acc"].tolist() == [55.0, 65.0, 64.0]
    assert one["bytes_down"].tolist() == [2000, 4000, 6000]
    assert one["lr"].tolist() == [0.01] * 3
    row = summary[
        (summary.setting == "c10_niid1") & (summary.method == "fedprox") & (summary.seed == 1)
    ].iloc[0]
    assert (row.best_acc, row.final_acc, row.last_k_acc, row.last_k) == (74.0, 73.0, 73.5, 2)
    assert row.status == "complete" and pd.isna(row.diverged_round)


def test_collect_runs_missing_file_names_path(grid_runs: list[Path]) -> None:
    victim = grid_runs[5] / "metrics.csv"
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=str(victim).replace("\\", "\\\\")):
        collect_runs(grid_runs)


def test_collect_runs_bad_files_name_path(tmp_path: Path) -> None:
    run = make_run(tmp_path, "s", "m", 0, [1.0, 2.0])
    (run / "summary.json").write_text("{not json")
    with pytest.raises(RunDataError, match="summary.json"):
        collect_runs([run])
    run2 = make_run(tmp_path, "s", "m", 1, [1.0, 2.0])
    pd.read_csv(run2 / "metrics.csv").drop(columns="test_acc").to_csv(run2 / "metrics.csv", index=False)
    with pytest.raises(RunDataError, match=r"metrics\.csv.*test_acc"):
        collect_runs([run2])


def test_collect_runs_rejects_folder_key_mismatch(tmp_path: Path) -> None:
    run = make_run(tmp_path, "s", "m", 0, [1.0])
    moved = run.parent / "seed7"
    run.rename(moved)
    with pytest.raises(RunDataError, match="seed7"):
        collect_runs([moved])


def test_write_csv_atomic_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "x.csv"
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    write_csv_atomic(df, out)
    pd.testing.assert_frame_equal(pd.read_csv(out), df, check_dtype=False)
    assert [p.name for p in out.parent.iterdir()] == ["x.csv"]


# ---------------------------------------------------------------- published


def test_published_lookup() -> None:
    pub = load_published(FEDDISCO_CSV)
    assert lookup(pub, "Table 1", "FedAvg", "CIFAR-10 | NIID-1") == (68.47, 0.20)
    assert lookup(pub, "Table 1", "FedAvg", "no such column") is None
    # Table 2 prints no std.
    assert lookup(pub, "Table 2", "FedAvg + Disco", "CIFAR-10 | NIID-1") == (70.05, None)


def test_published_fraction_scaled_to_percent(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("paper,table,row,column,mean,std,unit\np,Table 4,A,B,0.52,,fraction\n")
    pub = load_published(path)
    assert lookup(pub, "Table 4", "A", "B") == pytest.approx((52.0, None))
    assert lookup(pub, "Table 4", "A", "B", percent=False) == pytest.approx((0.52, None))


# ---------------------------------------------------------------- tables


def _cell(tidy: pd.DataFrame, method: str, setting: str) -> pd.Series:
    return tidy[(tidy.method == method) & (tidy.setting == setting)].iloc[0]


def test_render_table_mean_std_and_paper(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    stem = tmp_path / "out" / "table1"
    tidy = render_table(table_spec(), summary, load_published(FEDDISCO_CSV), stem, scale="paper")

    assert len(tidy) == 4
    for (setting, method), vals in BEST.items():
        cell = _cell(tidy, method, setting)
        assert cell.n_seeds == 3 and cell.status == "ok"
        assert cell.ours_mean == pytest.approx(statistics.mean(vals))
        assert cell.ours_std == pytest.approx(statistics.stdev(vals))
    mapped = _cell(tidy, "fedavg", "c10_niid1")
    assert (mapped.paper_mean, mapped.paper_std) == (68.47, 0.20)
    assert mapped["diff"] == pytest.approx(70.0 - 68.47)
    prox = _cell(tidy, "fedprox", "c10_niid1")
    assert prox.paper_mean == 69.33  # FedProx | CIFAR-10 | NIID-1 in Table 1
    unmapped = tidy[tidy.setting == "c10_niid2"]
    assert unmapped.paper_mean.isna().all() and unmapped["diff"].isna().all()

    md = (stem.parent / "table1.md").read_text()
    assert "best test accuracy over rounds" in md and "mean ± std over 3 seeds" in md
    assert "70.00 ± 1.00" in md and "68.47 ± 0.20" in md and "+1.53" in md
    assert EMBEDDED_NOTE not in md
    csv = pd.read_csv(stem.parent / "table1.csv")
    assert list(csv.columns[:9]) == [
        "row", "column", "n_seeds", "ours_mean", "ours_std", "paper_mean", "paper_std", "diff", "status",
    ]  # fmt: skip


def test_render_table_bold_best_and_latex(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    stem = tmp_path / "t"
    render_table(table_spec(), summary, load_published(FEDDISCO_CSV), stem, scale="paper")
    md = (tmp_path / "t.md").read_text()
    assert "**74.00 ± 2.00**" in md  # FedProx wins NIID-1
    assert "**62.00 ± 2.65**" in md  # FedAvg wins NIID-2
    assert "**70.00" not in md and "**51.00" not in md

    tex = (tmp_path / "t.tex").read_text()
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert tex.count(rule) == 1
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"\textbf{74.00 $\pm$ 2.00}" in tex
    assert r"(no\_map)" in tex and "(no_map)" not in tex  # escaped label
    assert r"68.47 $\pm$ 0.20" in tex


def test_render_table_html_for_the_report(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    prox = {"method": "fedprox", "label": "<Prox & co>", "paper": "FedProx"}
    spec = table_spec(rows=[*table_spec()["rows"][:1], prox])
    render_table(spec, summary, load_published(FEDDISCO_CSV), tmp_path / "t", scale="embedded")
    page = (tmp_path / "t.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<tr>") == 3  # header + two methods
    assert "<td><b>74.00 ± 2.00</b></td>" in page and "<td>70.00 ± 1.00</td>" in page
    assert '<td class="paper">68.47 ± 0.20</td><td class="paper">+1.53</td>' in page
    assert "&lt;Prox &amp; co&gt;" in page and "<Prox" not in page  # labels escaped
    assert "not comparable" in page and "best test accuracy over rounds" in page


def test_render_table_diverged_cells(tmp_path: Path) -> None:
    runs = tmp_path / "r"
    dirs = [make_run(runs, "c10_niid1", "fedavg", s, [50.0, 60.0, 58.0], "diverged", 4) for s in range(3)]
    dirs += [make_run(runs, "c10_niid1", "fedprox", s, [60.0, 70.0 + s, 69.0]) for s in range(3)]
    dirs += [make_run(runs, "c10_niid2", "fedavg", s, [60.0, 62.0 + 2 * s, 61.0]) for s in range(2)]
    dirs.append(make_run(runs, "c10_niid2", "fedavg", 2, [10.0, 10.0, 10.0], "diverged", 7))
    # (c10_niid2, fedprox) has no runs at all.
    _, summary = collect_runs(dirs)
    tidy = render_table(table_spec(), summary, load_published(FEDDISCO_CSV), tmp_path / "d", scale="paper")

    all_div = _cell(tidy, "fedavg", "c10_niid1")
    assert all_div.status == "diverged" and all_div.n_seeds == 0 and pd.isna(all_div.ours_mean)
    partial = _cell(tidy, "fedavg", "c10_niid2")
    assert partial.status == "partial" and partial.n_seeds == 2 and partial.n_diverged == 1
    assert partial.ours_mean == pytest.approx(63.0)
    assert _cell(tidy, "fedprox", "c10_niid2").status == "missing"
    assert _cell(tidy, "fedprox", "c10_niid1").ours_mean == pytest.approx(71.0)

    md = (tmp_path / "d.md").read_text()
    assert "diverged (round 4)" in md
    assert "63.00 ± 1.41†" in md
    assert "1 of 3 seeds diverged (round 7)" in md
    assert "| — |" in md
    assert "71.00 ± 1.00" in md


def test_render_table_marks_the_cells_whose_seeds_are_not_at_their_plateau(tmp_path: Path) -> None:
    root = tmp_path / "r"
    flat = [60.0, 70.0, 71.0, 71.5, 71.2, 71.4, 71.3, 71.6]  # 8 evaluations: quarters of 2
    rising = [40.0, 50.0, 55.0, 60.0, 64.0, 68.0, 72.0, 76.0]
    falling = [60.0, 80.0, 79.0, 78.0, 70.0, 65.0, 60.0, 55.0]  # its best came early: settled by best_acc only
    dirs = [make_run(root, "c10_niid1", "fedavg", s, flat) for s in range(2)]
    dirs += [make_run(root, "c10_niid1", "fedprox", 0, flat), make_run(root, "c10_niid1", "fedprox", 1, rising)]
    dirs += [make_run(root, "c10_niid2", m, s, falling) for m in METHODS for s in range(2)]
    runs, summary = collect_runs(dirs)
    cells = add_plateau_changes(summary, runs)

    best = render_table(table_spec(), cells, None, tmp_path / "best", scale="paper")
    assert _cell(best, "fedprox", "c10_niid1").n_moving == 1 and _cell(best, "fedavg", "c10_niid1").n_moving == 0
    assert (best[best.setting == "c10_niid2"].n_moving == 0).all()  # the best over rounds no longer moves
    md = (tmp_path / "best.md").read_text()
    assert "| **73.80 ± 3.11**‡ |" in md and "| 71.60 ± 0.00 |" in md  # FedProx marked, FedAvg not
    assert "the best over all evaluations minus the best over the first three quarters" in md
    assert "‡ FedProx, CIFAR-10 NIID-1: 1 of 2 seeds (seed 1 +8.00)." in md
    assert r"$^\ddagger$" in (tmp_path / "best.tex").read_text()
    assert "‡</td>" in (tmp_path / "best.html").read_text()

    # the same runs under a final-accuracy table: its rule is the quarter means, which the falling runs miss
    final = render_table(table_spec(metric="final_acc"), cells, None, tmp_path / "final", scale="paper")
    assert (final[final.setting == "c10_niid2"].n_moving == 2).all()
    assert _cell(final, "fedprox", "c10_niid1").n_moving == 1
    md = (tmp_path / "final.md").read_text()
    assert "the mean of the last quarter of evaluations minus the mean of the quarter before" in md
    assert "‡ FedAvg, CIFAR-10 NIID-2 (no_map): 2 of 2 seeds (seed 0 -10.00, seed 1 -10.00)." in md

    # a frame without curves (no plateau columns) marks nothing
    plain = render_table(table_spec(), summary, None, tmp_path / "plain", scale="paper")
    assert (plain.n_moving == 0).all() and "‡" not in (tmp_path / "plain.md").read_text()


def test_render_table_embedded_note_only_when_embedded(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    pub = load_published(FEDDISCO_CSV)
    render_table(table_spec(), summary, pub, tmp_path / "emb", scale="embedded")
    render_table(table_spec(), summary, pub, tmp_path / "full", scale="paper")
    assert EMBEDDED_NOTE in (tmp_path / "emb.md").read_text()
    assert "not comparable" not in (tmp_path / "full.md").read_text()


def test_render_table_on_the_papers_data_says_its_levels_compare(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    spec = {**table_spec(), "compare_levels": True}
    render_table(spec, summary, load_published(FEDDISCO_CSV), tmp_path / "lv", scale="embedded")
    for suffix in (".md", ".html"):
        text = (tmp_path / f"lv{suffix}").read_text()
        assert "not comparable" not in text and "own data set at laptop scale" in text  # html escapes the '
        assert "reduced in samples, epochs and rounds" in text


def test_render_table_without_published(grid_runs: list[Path], tmp_path: Path) -> None:
    _, summary = collect_runs(grid_runs)
    spec = table_spec(metric="last_k_acc", paper_table=None)
    tidy = render_table(spec, summary, None, tmp_path / "np", scale="paper")
    assert tidy.paper_mean.isna().all()
    md = (tmp_path / "np.md").read_text()
    assert "last 2 evaluations" in md and ": paper" not in md


# ---------------------------------------------------------------- figures


def test_render_curves_writes_png_and_pdf(grid_runs: list[Path], tmp_path: Path) -> None:
    from matplotlib.image import imread

    from fedrepro.report.figures import render_curves

    runs, _ = collect_runs(grid_runs)
    spec = {
        "name": "curves",
        "caption": "Test accuracy over rounds",
        "kind": "curve",
        "settings": [{"setting": s, "label": s.upper()} for s in SETTINGS],
        "methods": [{"method": "fedavg", "label": "FedAvg"}, {"method": "fedprox", "label": "FedProx+Disco"}],
    }
    stem = tmp_path / "fig" / "curves"
    render_curves(spec, runs, stem)
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert imread(png).std() > 0.01  # not a blank canvas
    with pytest.raises(ValueError, match="no runs"):
        render_curves({**spec, "settings": [{"setting": "nope", "label": "x"}]}, runs, tmp_path / "e")


# ---------------------------------------------------------------- style


def test_method_palette_stable_and_distinct() -> None:
    names = list(KNOWN_COLORS)
    first, second = method_palette(names), method_palette(list(reversed(names)))
    assert first == second
    assert len(set(first.values())) == len(names)
    # Printed spellings map onto the same method.
    assert method_color("FedAVG") == method_color("FedAvg") == KNOWN_COLORS["FedAvg"]
    assert method_color("Fed-GTST") == KNOWN_COLORS["FedGTST"]
    assert method_color("Ours-ID") == KNOWN_COLORS["Feddle-ID"]
    # +Disco variants: same hue family as the base, darker, dashed.
    disco, base = method_color("FedProx + Disco"), method_color("FedProx")
    assert disco != base and disco not in first.values()
    assert method_dashes(["FedProx+Disco", "FedProx"]) == {"FedProx+Disco": (4.0, 2.0), "FedProx": ""}
    # Unknown labels get a deterministic colour (md5, not the per-process salted hash()).
    assert method_color("MyNewMethod") == method_color("MyNewMethod")
    assert method_color("MyNewMethod").startswith("#") and len(method_color("MyNewMethod")) == 7
