"""The scorecard (cells regenerated, distance to the paper, ranking claims), report captions and the
README showcase block."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.common import REPO

from fedrepro.config import merge_configfiles, resolve_config
from fedrepro.report.captions import figure_caption, rst_escape, table_caption
from fedrepro.report.integrity import write_checked_csv
from fedrepro.report.published import load_published, lookup, trials_behind_sd
from fedrepro.report.scorecard import build_scorecard, check_claims, render_markdown, score_table
from fedrepro.report.showcase import BEGIN, END, replace_block, study_section, write_showcase
from fedrepro.report.tables import paper_key
from fedrepro.study import ConfigError

ROWS = [{"method": m, "label": m.upper()} for m in ("a", "b", "c")]
NAN = math.nan


def spec_of(columns: list[dict], claims: list[dict] | None = None, metric: str = "best_acc") -> dict:
    return {"name": "t", "caption": "T", "paper_table": "Table 1", "metric": metric, "rows": ROWS,
            "columns": columns, "claims": claims or []}


def cells_of(spec: dict, ours: list[list[float]], paper: list[list[float]], std: list[list[float]],
             ours_sd: list[list[float]] | None = None, seeds: int = 1) -> pd.DataFrame:
    """The tidy cell frame render_table writes, row-major; NaN ours = a missing cell; by default one seed a cell
    (no sd of ours)."""
    rows = []
    for i, r in enumerate(spec["rows"]):
        for j, c in enumerate(spec["columns"]):
            o = ours[i][j]
            rows.append({"row": r["label"], "column": c["label"], "method": r["method"], "setting": c["setting"],
                         "n_seeds": 0 if math.isnan(o) else seeds, "ours_mean": o,
                         "ours_std": ours_sd[i][j] if ours_sd else NAN, "paper_mean": paper[i][j],
                         "paper_std": std[i][j], "status": "missing" if math.isnan(o) else "ok"})
    return pd.DataFrame(rows)


TWO_COLS = [{"setting": "s1", "label": "one"}, {"setting": "s2", "label": "two"}]


def test_score_table_counts_distances_and_two_sd() -> None:
    spec = spec_of(TWO_COLS)
    ours = [[70.0, 60.0], [72.0, NAN], [65.0, 61.0]]
    paper = [[71.0, 64.0], [70.0, 66.0], [NAN, 60.0]]
    std = [[1.0, NAN], [0.5, 1.0], [NAN, 0.2]]
    s = score_table("study", spec, cells_of(spec, ours, paper, std))
    assert (s.cells, s.regenerated, s.published, s.compared) == (6, 5, 5, 4)
    diffs = [1.0, 4.0, 2.0, 1.0]  # a/one, a/two, b/one, c/two
    assert s.mean_abs_diff == pytest.approx(sum(diffs) / 4) and s.max_abs_diff == pytest.approx(4.0)
    # cells with a published sd: a/one (1 <= 2), b/one (2 > 1), c/two (1 > 0.4)
    assert (s.with_std, s.within_2sd) == (3, 1)
    assert s.summary == "best"


def test_rank_agreement_is_kendall_tau_over_columns_with_three_rows() -> None:
    spec = spec_of(TWO_COLS)
    same, reversed_ = [[3.0, 1.0], [2.0, 2.0], [1.0, 3.0]], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    nan_std = [[NAN] * 2] * 3
    s = score_table("x", spec, cells_of(spec, same, reversed_, nan_std))
    assert s.rank_tau == pytest.approx((-1.0 + 1.0) / 2)
    two_rows = [[3.0, 1.0], [2.0, 2.0], [NAN, NAN]]
    assert math.isnan(score_table("x", spec, cells_of(spec, two_rows, reversed_, nan_std)).rank_tau)


def test_best_claim_holds_fails_and_names_the_failing_column() -> None:
    spec = spec_of(TWO_COLS, [{"best": "a"}])
    ours = [[70.0, 60.0], [69.0, 61.0], [NAN, 50.0]]
    paper = [[71.0, 64.0], [70.0, 63.0], [60.0, 62.0]]
    # three seeds of sd 0.1 a cell: SE of a difference sqrt(0.01 / 3 * 2) = 0.08
    cells = cells_of(spec, ours, paper, [[NAN] * 2] * 3, ours_sd=[[0.1] * 2] * 3, seeds=3)
    (claim,) = check_claims(spec, cells, trials=3)
    assert claim.paper == ("holds (2 of 2): one (vs B) holds: +1.00 (no sd printed); "
                           "two (vs B) holds: +1.00 (no sd printed)")
    assert claim.ours == ("fails (1 hold, 1 fail of 2): one (vs B) holds: +1.00 ± 0.08 (2 SE 0.16; unpaired, 3 and 3 "
                          "seeds); two (vs B) fails: -1.00 ± 0.08 (2 SE 0.16; unpaired, 3 and 3 seeds)")
    assert claim.holds is False
    assert claim.text == "A is best in every column"


def test_claims_respect_lower_is_better_columns_and_ties() -> None:
    columns = [{"setting": "s1", "label": "acc"}, {"setting": "s1", "label": "rounds", "metric": "rounds_to_acc"}]
    spec = {**spec_of(columns, [{"best": "a"}]), "target_acc": 55}
    ours = [[70.0, 10.0], [70.0, 12.0], [60.0, 30.0]]  # a ties b on accuracy and needs the fewest rounds
    # judged on the published side, printed without sds: the sign decides, a tie holding
    (claim,) = check_claims(spec, cells_of(spec, ours, ours, [[NAN] * 2] * 3))
    assert claim.paper == ("holds (2 of 2): acc (vs B) holds: +0.00 (no sd over trials printed); "
                           "rounds (vs B) holds: +2.00 (no sd over trials printed)")
    ours[0][1] = 40.0
    (claim,) = check_claims(spec, cells_of(spec, ours, ours, [[NAN] * 2] * 3))
    assert claim.paper.startswith("fails (1 hold, 1 fail of 2): ") and "rounds (vs B) fails: -28.00" in claim.paper


def test_pairwise_and_column_claims_with_missing_cells() -> None:
    columns = [{"setting": "s1", "label": "without"}, {"setting": "s1", "label": "with", "method_suffix": "-d"}]
    claims = [{"better": "c", "than": "b", "text": "C beats B"},
              {"better_column": "with", "than_column": "without"},
              {"better_column": "with", "than_column": "without", "rows": ["a"]}]
    spec = spec_of(columns, claims)
    ours = [[50.0, 55.0], [60.0, 58.0], [NAN, 70.0]]
    paper = [[50.0, 52.0], [60.0, 61.0], [65.0, 66.0]]
    cells = cells_of(spec, ours, paper, [[NAN] * 2] * 3, ours_sd=[[0.1] * 2] * 3, seeds=3)
    pair, column, one_row = check_claims(spec, cells, trials=3)
    assert pair.text == "C beats B"
    assert pair.ours == ("holds (1 of 1); 1 of 2 without numbers: with holds: +12.00 ± 0.08 (2 SE 0.16; unpaired, 3 "
                         "and 3 seeds)")
    assert pair.holds is None and pair.paper.startswith("holds (2 of 2): ")
    assert column.ours == ("fails (1 hold, 1 fail of 2); 1 of 3 without numbers: A holds: +5.00 ± 0.08 (2 SE 0.16; "
                           "unpaired, 3 and 3 seeds); B fails: -2.00 ± 0.08 (2 SE 0.16; unpaired, 3 and 3 seeds)")
    assert column.holds is False
    assert column.paper.startswith("holds (3 of 3): ")
    assert one_row.ours == "holds (1 of 1): A holds: +5.00 ± 0.08 (2 SE 0.16; unpaired, 3 and 3 seeds)"
    assert one_row.holds is True
    assert one_row.text == "column with beats column without in A"


THREE_COLS = [{"setting": f"s{k}", "label": name} for k, name in ((1, "one"), (2, "two"), (3, "three"))]


def test_a_place_holds_beyond_two_standard_errors_fails_below_minus_two_and_is_within_noise_between() -> None:
    claims = [{"better": "a", "than": "b"}, {"better": "a", "than": "b", "columns": ["s1", "s2"]}]
    spec = spec_of(THREE_COLS, claims)
    ours = [[73.0, 71.0, 67.0], [70.0, 70.0, 70.0], [NAN] * 3]
    # sd 1 over 2 seeds in both cells: SE of the difference sqrt(1/2 + 1/2) = 1
    cells = cells_of(spec, ours, [[NAN] * 3] * 3, [[NAN] * 3] * 3, ours_sd=[[1.0] * 3] * 3, seeds=2)
    every, two_columns = check_claims(spec, cells)
    assert every.ours == ("fails (1 hold, 1 fail, 1 within noise of 3): one holds: +3.00 ± 1.00 (2 SE 2.00; unpaired, "
                          "2 and 2 seeds); two within noise: +1.00 ± 1.00 (2 SE 2.00; unpaired, 2 and 2 seeds); three "
                          "fails: -3.00 ± 1.00 (2 SE 2.00; unpaired, 2 and 2 seeds)")
    assert every.holds is False
    assert two_columns.ours.startswith("within noise (1 hold, 1 within noise of 2): ") and two_columns.holds is None
    # a cell of one seed has no SE: its place is unresolved whatever the sign (the default's NIID-2 cells, two of
    # three seeds diverged, once read "fails: -0.15 (1 seed)"), and the place says why
    one_seed = cells.assign(n_seeds=[1, 2, 2, 2, 2, 2, 0, 0, 0], ours_std=[NAN, 1, 1, 1, 1, 1, NAN, NAN, NAN])
    _, two_columns = check_claims(spec, one_seed)
    assert two_columns.ours == ("within noise (1 within noise, 1 unresolved of 2): one unresolved: +3.00 (1 seed; "
                                "unpaired, 1 and 2 seeds); two within noise: +1.00 ± 1.00 (2 SE 2.00; unpaired, 2 and "
                                "2 seeds)") and two_columns.holds is None
    only_one_seed = cells.assign(n_seeds=1, ours_std=NAN)
    every, _ = check_claims(spec, only_one_seed)
    assert every.ours.startswith("unresolved (3 unresolved of 3): one unresolved: +3.00 (1 seed; unpaired, 1 and 1 "
                                 "seeds)")


def test_a_place_on_a_cell_whose_seeds_still_move_says_so() -> None:
    spec = spec_of(THREE_COLS, [{"better": "a", "than": "b"}])
    ours = [[73.0, 71.0, 67.0], [70.0, 70.0, 70.0], [NAN] * 3]
    cells = cells_of(spec, ours, [[NAN] * 3] * 3, [[NAN] * 3] * 3, ours_sd=[[1.0] * 3] * 3, seeds=2)
    # b's cell in column one and a's in column three have a seed not at its plateau (the tables' n_moving)
    moving = cells.assign(n_moving=[0, 0, 1, 1, 0, 0, 0, 0, 0])
    (claim,) = check_claims(spec, moving)
    assert claim.ours == ("fails (1 hold, 1 fail, 1 within noise of 3): one holds: +3.00 ± 1.00 (2 SE 2.00; unpaired, "
                          "2 and 2 seeds; ‡ seeds not at their plateau); two within noise: +1.00 ± 1.00 (2 SE 2.00; "
                          "unpaired, 2 and 2 seeds); three fails: -3.00 ± 1.00 (2 SE 2.00; unpaired, 2 and 2 seeds; ‡ "
                          "seeds not at their plateau)")
    # the outcome is the seeds' noise's, as before: the mark says what the difference is between
    assert [c.ours.split(":")[0] for c in check_claims(spec, cells)] == [claim.ours.split(":")[0]]
    assert "‡" not in check_claims(spec, cells)[0].ours  # a CSV without n_moving marks nothing


def made_up_runs(values: dict[tuple[str, str], list[float]], seeds=(0, 1, 2, 3, 4),
                 diverged: tuple[tuple[str, str, int], ...] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, summary) of one study: each (method, setting) run's best accuracy per seed; ``diverged``: runs that
    diverged (their value stays out of every cell)."""
    rows = [{"study": "x", "setting": s, "method": m, "seed": seed, "best_acc": v, "last_k": 5,
             "status": "diverged" if (m, s, seed) in diverged else "complete"}
            for (m, s), vs in values.items() for seed, v in zip(seeds, vs, strict=True)]
    summary = pd.DataFrame(rows)
    return summary.assign(round=1, test_acc=summary["best_acc"])[["study", "setting", "method", "seed", "round",
                                                                  "test_acc"]], summary


def cells_from_runs(spec: dict, summary: pd.DataFrame) -> pd.DataFrame:
    """The table's cells as the table job computes them: mean and sample sd over each cell's finished seeds."""
    means, sds, ns = [], [], []
    for r in spec["rows"]:
        line_m, line_s, line_n = [], [], []
        for c in spec["columns"]:
            mine = summary[(summary["method"] == r["method"] + c.get("method_suffix", ""))
                           & (summary["setting"] == c["setting"]) & (summary["status"] == "complete")]["best_acc"]
            line_m.append(float(mine.mean()))
            line_s.append(float(mine.std(ddof=1)))
            line_n.append(len(mine))
        means.append(line_m)
        sds.append(line_s)
        ns.append(line_n)
    cells = cells_of(spec, means, [[NAN] * len(spec["columns"])] * len(spec["rows"]),
                     [[NAN] * len(spec["columns"])] * len(spec["rows"]), ours_sd=sds)
    cells["n_seeds"] = [n for line in ns for n in line]
    cells["method"] = [r["method"] + c.get("method_suffix", "") for r in spec["rows"] for c in spec["columns"]]
    return cells


def test_runs_that_share_their_seeds_are_judged_on_their_paired_differences() -> None:
    """A seed effect large against a small consistent gain: paired by seed the gain holds, unpaired it is within
    noise (issue #52, with the shape of the default's FedAvg against FedAvg + Disco)."""
    from fedrepro.report.paired import seed_values

    base = [70.0, 75.0, 80.0, 85.0, 90.0]  # the seed decides most of a run's number
    gain = [1.0, 1.2, 0.8, 1.1, 0.9]
    spec = {**spec_of([{"setting": "s1", "label": "S"}, {"setting": "s1", "label": "S + D", "method_suffix": "-d"}],
                      [{"better_column": "S + D", "than_column": "S", "rows": ["a"]}]),
            "rows": [{"method": "a", "label": "A"}], "seeds": [0, 1, 2, 3, 4]}
    runs, summary = made_up_runs({("a", "s1"): base, ("a-d", "s1"): [b + g for b, g in zip(base, gain, strict=True)]})
    cells = cells_from_runs(spec, summary)
    (unpaired,) = check_claims(spec, cells)
    assert unpaired.ours == ("within noise (1 within noise of 1): A within noise: +1.00 ± 4.99 (2 SE 9.97; unpaired, 5 "
                             "and 5 seeds)")
    (paired,) = check_claims(spec, cells, seeds=seed_values(spec, cells, runs, summary))
    assert paired.ours == "holds (1 of 1): A holds: +1.00 ± 0.07 (2 SE 0.14; paired over 5 seeds)"
    assert paired.holds is True

    # a seed that diverged on one side breaks the pairs: unpaired over each side's own seeds, and it says why
    runs, summary = made_up_runs({("a", "s1"): base, ("a-d", "s1"): [b + g for b, g in zip(base, gain, strict=True)]},
                                 diverged=(("a-d", "s1", 3),))
    cells = cells_from_runs(spec, summary)
    (broken,) = check_claims(spec, cells, seeds=seed_values(spec, cells, runs, summary))
    assert "(2 SE " in broken.ours and "unpaired, seeds differ (0, 1, 2, 4 and 0, 1, 2, 3, 4)" in broken.ours
    assert broken.ours.startswith("within noise")


def test_cells_on_other_settings_never_pair() -> None:
    from fedrepro.report.paired import paired_differences

    assert paired_differences(("s1", {0: 1.0, 1: 2.0}), ("s2", {0: 0.0, 1: 1.0})) == (None, "unpaired, other settings")
    assert paired_differences(("s1", {0: 1.0, 1: 2.0}), ("s1", {0: 0.5, 1: 1.0})) == ([0.5, 1.0],
                                                                                     "paired over 2 seeds")
    assert paired_differences(("s1", {0: 1.0}), ("s1", {0: 0.5}))[0] is None  # one seed: nothing to pair


def test_a_best_claim_is_checked_against_the_strongest_other_row() -> None:
    columns = [{"setting": "s1", "label": "acc"}, {"setting": "s1", "label": "rounds", "metric": "rounds_to_acc"}]
    spec = {**spec_of(columns, [{"best": "a"}]), "target_acc": 55}
    ours = [[75.5, 10.0], [72.0, 30.0], [74.0, 12.0]]  # C is the runner-up in both columns (fewer rounds: better)
    cells = cells_of(spec, ours, [[NAN] * 2] * 3, [[NAN] * 2] * 3, ours_sd=[[0.5, 1.0]] * 3, seeds=2)
    (claim,) = check_claims(spec, cells)
    assert claim.ours == ("within noise (1 hold, 1 within noise of 2): acc (vs C) holds: +1.50 ± 0.50 (2 SE 1.00; "
                          "unpaired, 2 and 2 seeds); rounds (vs C) within noise: +2.00 ± 1.00 (2 SE 2.00; unpaired, 2 "
                          "and 2 seeds)")


def test_the_published_side_uses_the_printed_sd_over_the_papers_trials_or_else_the_sign(tmp_path: Path) -> None:
    spec = spec_of(TWO_COLS, [{"better": "a", "than": "b"}])
    paper = [[71.0, 61.0], [70.0, 60.5], [NAN, NAN]]
    std = [[0.75, NAN], [0.75, NAN], [NAN, NAN]]  # column two prints no sd
    cells = cells_of(spec, [[NAN] * 2] * 3, paper, std)
    # 3 trials: SE sqrt(2 x 0.75² / 3) = 0.61, +1.00 within 2 SE; 5 trials: SE 0.47, it holds
    (three,) = check_claims(spec, cells, trials=3)
    assert three.paper == ("within noise (1 hold, 1 within noise of 2): one within noise: +1.00 ± 0.61 (2 SE 1.22); "
                           "two holds: +0.50 (no sd printed)")
    (five,) = check_claims(spec, cells, trials=5)
    assert five.paper == "holds (2 of 2): one holds: +1.00 ± 0.47 (2 SE 0.95); two holds: +0.50 (no sd printed)"
    (unknown,) = check_claims(spec, cells)  # sds not over trials (or no trial count): the sign alone
    assert unknown.paper.startswith("holds (2 of 2): one holds: +1.00 (no sd over trials printed);")
    assert unknown.ours == "not checkable (no numbers)"
    # the scorecard takes each study's trial count from its paper (FedDisco: 5 trials, FedL2G: 3)
    csv = tmp_path / "t.csv"
    cells.to_csv(csv, index=False)
    for study_paper, verdict in (("feddisco", five.paper), ("fedl2g", three.paper)):
        (score,) = build_scorecard([("s", spec, csv)], "paper", tmp_path / "sc.md", tmp_path / "sc.html",
                                   papers={"s": study_paper})
        assert score.claims[0].paper == verdict
    assert f'<td class="noise">{three.paper}</td>' in (tmp_path / "sc.html").read_text()
    assert trials_behind_sd("feddle", "Table 1") == 3
    assert trials_behind_sd("feddisco", "Table 10") is None  # its ± is over a run's last 10 rounds


def test_nothing_to_check_says_so() -> None:
    spec = spec_of(TWO_COLS, [{"best": "a"}])
    empty = [[NAN] * 2] * 3
    (claim,) = check_claims(spec, cells_of(spec, empty, empty, empty))
    assert claim.ours == claim.paper == "not checkable (no numbers)"


def test_cell_csv_that_does_not_fit_the_spec_is_an_error() -> None:
    spec = spec_of(TWO_COLS)
    cells = cells_of(spec, [[1.0, 2.0]] * 3, [[NAN] * 2] * 3, [[NAN] * 2] * 3).iloc[:-1]
    with pytest.raises(ValueError, match="5 cells in its CSV, but the spec has 3 rows x 2 columns"):
        score_table("x", spec, cells)


def test_embedded_scorecard_compares_rankings_only_paper_scale_shows_distances(tmp_path: Path) -> None:
    spec = spec_of(TWO_COLS, [{"best": "a"}])
    csv = tmp_path / "t.csv"
    cells_of(spec, [[70.0, 60.0], [69.0, 59.0], [1.0, 2.0]], [[71.0, 64.0], [70.0, 63.0], [60.0, 62.0]],
             [[1.0, NAN], [NAN, NAN], [NAN, NAN]], ours_sd=[[0.1] * 2] * 3, seeds=3).to_csv(csv, index=False)
    build_scorecard([("s", spec, csv)], "embedded", tmp_path / "sc.md", tmp_path / "sc.html")
    md = (tmp_path / "sc.md").read_text()
    assert "not comparable" in md and "rankings only" in md and "mean abs diff" not in md and "points" not in md
    assert "| t | Table 1 | best | 6 of 6 | 6 |" in md
    assert "1 of 1 hold in our numbers, 0 fail, 0 within noise or without numbers" in md
    html = (tmp_path / "sc.html").read_text()
    assert ('<td class="holds">holds (2 of 2): one (vs B) holds: +1.00 ± 0.08 (2 SE 0.16; unpaired, 3 and 3 seeds);'
            in html)
    assert "not comparable" in html
    at_paper = {**spec, "compare_levels": True}  # what a paper-scale config resolves an absent key to
    paper = render_markdown([score_table("s", at_paper, pd.read_csv(csv))], "paper")
    assert "not comparable" not in paper and "| mean abs diff | max abs diff | within 2 published sd |" in paper
    # one cell with a published sd, within 2 sd (|70 - 71| <= 2); the other five have none
    assert "| 1 of 1 (5 cells without a published sd) |" in paper
    no_sd = [score_table("s", at_paper, pd.read_csv(csv).assign(paper_std=NAN))]
    assert "| paper prints no sd |" in render_markdown(no_sd, "paper")


def test_a_table_on_the_papers_data_compares_levels_at_embedded_scale_and_names_the_cells_off(tmp_path: Path) -> None:
    reasons = ["D-s-fewer-rounds", "D-s-fewer-samples"]
    levels = {**spec_of(TWO_COLS), "name": "lv", "compare_levels": True, "deviations": reasons}
    stand_in = {**spec_of(TWO_COLS), "name": "si", "compare_levels": False, "deviations": reasons}
    # A / one is 10 points off, A / two 7 (within 8), every other cell 1
    ours, paper = [[60.0, 57.0], [69.0, 59.0], [59.0, 61.0]], [[70.0, 64.0], [70.0, 60.0], [60.0, 62.0]]
    tables = []
    for spec in (levels, stand_in):
        cells_of(spec, ours, paper, [[NAN] * 2] * 3).to_csv(tmp_path / f"{spec['name']}.csv", index=False)
        tables.append(("s", spec, tmp_path / f"{spec['name']}.csv"))
    build_scorecard(tables, "embedded", tmp_path / "sc.md", tmp_path / "sc.html")
    md = (tmp_path / "sc.md").read_text()
    assert "| mean abs diff | max abs diff | rank agreement (Kendall τ) |" in md  # no 2-sd count below paper scale
    assert "| lv | Table 1 | best | 6 of 6 | 6 | 3.50 | 10.00 |" in md  # (10 + 7 + 4 * 1) / 6
    assert "| si | Table 1 | best | 6 of 6 | 6 | rankings only | rankings only |" in md
    named = "A / one: ours 60.00 vs published 70.00 (Δ -10.00); reasons: D-s-fewer-rounds, D-s-fewer-samples"
    assert f"- lv: cells within 8 points of the published value: 5 of 6\n  - {named}\n" in md
    assert "A / two:" not in md and "si: cells within" not in md
    statement = md.split("\n\n")[1]
    assert "papers' own data sets" in statement and ": s lv." in statement and "levels and rankings" in statement
    assert "The other tables run on small stand-in data sets" in statement and "rankings only" in statement
    page = (tmp_path / "sc.html").read_text()
    assert "<h3>Levels</h3>" in page and f"<li>{named}</li>" in page
    alone = render_markdown([score_table("s", levels, pd.read_csv(tmp_path / "lv.csv"))], "embedded")
    assert "stand-in" not in alone and "not comparable" not in alone
    # a row that names its own deviations gives them first, then the table's, each once
    rows = [{**ROWS[0], "deviations": ["D-s-delays", "D-s-fewer-rounds"]}, *ROWS[1:]]
    own = score_table("s", {**levels, "rows": rows}, pd.read_csv(tmp_path / "lv.csv"))
    assert own.level_misses == ["A / one: ours 60.00 vs published 70.00 (Δ -10.00); reasons: D-s-delays, "
                                "D-s-fewer-rounds, D-s-fewer-samples"]


# ------------------------------------------------------------------ claims in the study files


def _table_specs(study: dict):
    """The tables as the workflow fills them in (common.smk table_spec: labels from methods/settings)."""
    for name, t in study["tables"].items():
        # a simulated table (FedDisco Table 6) labels its own rows and columns
        rows = [{"label": r["label"] if "label" in r else study["methods"][r["method"]].get("label", r["method"]),
                 "paper": None, **r} for r in t["rows"]]
        cols = [{"label": c["label"] if "label" in c else study["settings"][c["setting"]].get("label", c["setting"]),
                 "paper": None, **c} for c in t["columns"]]
        yield {**t, "name": name, "rows": rows, "columns": cols}


@pytest.mark.parametrize("config", ["config/config.yaml", "config/laptop-full.yaml", "config/paper.yaml"])
def test_declared_claims_check_against_the_published_numbers(config: str) -> None:
    cfg = resolve_config(merge_configfiles("config/config.yaml", config))
    verdicts = {}
    for name, study in cfg["studies"].items():
        published = load_published(REPO / "config" / "paper" / f"{study['paper']}.csv")
        for spec in _table_specs(study):
            rows = []
            for r in spec["rows"]:
                for c in spec["columns"]:
                    key = paper_key(spec, r, c) if spec["paper_table"] else None
                    hit = lookup(published, spec["paper_table"], *key) if key else None
                    rows.append({"ours_mean": NAN, "ours_std": NAN, "n_seeds": 0, "status": "missing",
                                 "paper_mean": hit[0] if hit else NAN, "paper_std": hit[1] if hit else NAN})
            trials = trials_behind_sd(study["paper"], spec["paper_table"])
            for claim in check_claims(spec, pd.DataFrame(rows).fillna({"paper_std": NAN}), trials):
                verdicts[(name, spec["name"], claim.text)] = claim.paper
    assert verdicts, "no claims declared"
    # Table 2's "Disco improves ..." claims compare its columns without and with Disco, and only the + Disco
    # columns map to a published number (the paper prints the baselines' own in Table 1)
    assert all(not v.startswith("not checkable") or re.match(r"Disco improves \w+ ", k[2])
               for k, v in verdicts.items()), verdicts
    if config == "config/paper.yaml":
        # FedDisco's CINIC-10 NIID-2 lead (+0.34) is within 2 SE of its 5 trials' printed sds
        assert verdicts[("feddisco", "table1", "FedDisco is best in every column")].startswith(
            "within noise (6 hold, 1 within noise of 7): HAM10000 NIID-1 (vs SCAFFOLD) holds: +3.97 ± 0.32 "
            "(2 SE 0.63);")
        assert "CINIC-10 NIID-2 (vs SCAFFOLD) within noise: +0.34 ± 0.20 (2 SE 0.39)" in verdicts[
            ("feddisco", "table1", "FedDisco is best in every column")]
        assert verdicts[("feddisco", "table7", "KL divergence is the best discrepancy metric")] == (
            "holds (1 of 1): Acc (vs L2) holds: +0.06 (no sd printed)")
        assert verdicts[("fedgtst", "table6", "FedGTST is best for every left-out domain")].startswith(
            "holds (5 of 5); 1 of 6 without numbers: C (vs FedSR) holds: +2.90 ± 0.45 (2 SE 0.90);")


def _study_with_claims(claims: list[dict]) -> dict:
    study = yaml.safe_load((REPO / "tests" / "data" / "tiny_study.yaml").read_text())
    study["tables"]["t1"]["claims"] = claims
    return {"studies": {"feddisco": study}}


@pytest.mark.parametrize(("claims", "message"), [
    ([{"best": "fedprx"}], r"claims\.0: best: 'fedprx' is not a row's method \(did you mean 'fedprox'\?\)"),
    ([{"better": "fedavg", "than": "moon"}], r"than: 'moon' is not a row's method"),
    ([{"best": "fedavg", "columns": ["iid5"]}], r"columns: 'iid5' names no column \(did you mean 'iid4'\?\)"),
    ([{"better_column": "iid4", "than_column": "x"}], r"than_column: 'x' must name exactly one column"),
    ([{"best": "fedavg", "rows": ["fedavg"]}], r"rows: only better_column claims take `rows`"),
    ([{"best": "fedavg", "better": "fedprox", "than": "fedavg"}],
     r"tables\.t1\.claims\.0: a claim is one of \{best\} \| \{better, than\} \| "
     r"\{better_column, than_column\}; this one has \['best', 'better', 'than'\]"),
    ([{"than": "fedavg"}], r"this one has \['than'\]"),
    ([{"bets": "fedavg"}], r"unknown key 'bets' \(did you mean 'best'\?\)"),
])
def test_bad_claims_fail_with_the_key_named(claims, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(_study_with_claims(claims))


def test_claim_defaults_come_from_the_schema() -> None:
    cfg = resolve_config(_study_with_claims([{"best": "fedavg"}]))
    assert cfg["studies"]["feddisco"]["tables"]["t1"]["claims"] == [
        {"best": "fedavg", "columns": None, "rows": None, "text": ""}]
    assert resolve_config(_study_with_claims([]))["showcase"] is None


def test_showcase_must_name_a_study_and_its_figure() -> None:
    cfg = _study_with_claims([])
    with pytest.raises(ConfigError, match=r"showcase\.figure: study 'feddisco' has no figure 'curve' "
                                          r"\(did you mean 'curves'\?\)"):
        resolve_config({**cfg, "showcase": {"study": "feddisco", "figure": "curve"}})
    with pytest.raises(ConfigError, match=r"showcase\.study: unknown study 'fedgtst'"):
        resolve_config({**cfg, "showcase": {"study": "fedgtst", "figure": "curves"}})


# ------------------------------------------------------------------ captions


def test_captions_name_the_paper_artifact_scale_and_summary() -> None:
    import docutils.core

    spec = spec_of([{"setting": "s", "label": "CIFAR-10 | NIID-1"}], metric="last_k_acc")
    cap = table_caption({**spec, "caption": "Table 3: *partial* | `x`"}, "embedded")
    assert cap["mirrors"] == "Table 1 of the paper" and cap["summary"] == "mean of the last k evaluations"
    assert cap["scale"].startswith("embedded") and "not comparable" in cap["scale"]
    levels = table_caption({**spec, "compare_levels": True}, "embedded")["scale"]
    assert levels.startswith("embedded") and "not comparable" not in levels and "paper's own data set" in levels
    html = docutils.core.publish_parts(f"**{cap['title']}**", writer="html")["body"]
    assert "Table 3: *partial* | `x`" in html  # shown as written, not as reStructuredText markup
    assert rst_escape("a_b|c") == r"a\_b\|c"
    fig = figure_caption({"name": "f", "kind": "curve", "y": "jac_norm", "paper_figure": "Figure 2"}, "paper")
    assert fig["shows"].startswith("Global Jacobian norm ") and " per round, " in fig["shows"]
    assert "band: ±1 sd over seeds" in fig["shows"]
    assert fig["mirrors"] == "Figure 2 of the paper" and fig["scale"].startswith("paper")


# ------------------------------------------------------------------ README showcase

SCORECARD = """# Scorecard

**Embedded scale.** Not comparable.

Rank agreement: ...

## feddisco

| table | mirrors |
|---|---|
| table1 | Table 1 |

### Convergence

Runs at their plateau: **1 of 2 (50%)**.

Runs that miss the plateau rule:

| setting | method | seed |
|---|---|---|
| x | b | 0 |

## fedgtst

| table | mirrors |
|---|---|
| table1 | Table 1 |
"""


def test_study_section_takes_the_statement_and_one_study() -> None:
    text = study_section(SCORECARD, "feddisco")
    assert text.startswith("**Embedded scale.** Not comparable.")
    assert "| table1 | Table 1 |" in text and "fedgtst" not in text
    # the README keeps the convergence counts; the runs that miss are named in the full scorecard only
    assert "**1 of 2 (50%)**" in text and "| x | b | 0 |" not in text and "listed by name in" in text
    with pytest.raises(ValueError, match="no section for study 'fedl2g'"):
        study_section(SCORECARD, "fedl2g")


def test_replace_block_needs_one_pair_of_markers() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert replace_block(text, "new\n") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    for bad in ("no markers", f"{END}\n{BEGIN}\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"):
        with pytest.raises(ValueError, match="needs exactly one line"):
            replace_block(bad, "x")


def test_write_showcase_is_idempotent_and_touches_only_the_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# project\n\nintro\n\n{BEGIN}\nplaceholder\n{END}\n\n## more\n")
    (tmp_path / "fig.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "scorecard.md").write_text(SCORECARD)
    args = dict(readme=readme, figure_png=tmp_path / "fig.png", scorecard_md=tmp_path / "scorecard.md",
                study="feddisco", caption="Curves (feddisco, embedded scale)",
                figure_out=tmp_path / "docs" / "showcase" / "figure.png",
                excerpt_out=tmp_path / "docs" / "showcase" / "scorecard.md")
    assert write_showcase(**args) is True
    text = readme.read_text()
    assert text.startswith("# project\n\nintro\n\n") and text.endswith(f"{END}\n\n## more\n")
    assert "![Curves (feddisco, embedded scale)](docs/showcase/figure.png)" in text
    assert "| table1 | Table 1 |" in text and "fedgtst" not in text and "placeholder" not in text
    assert (tmp_path / "docs" / "showcase" / "figure.png").read_bytes() == b"\x89PNG fake"
    assert write_showcase(**args) is False and readme.read_text() == text
    with pytest.raises(FileNotFoundError, match="showcase.readme"):
        write_showcase(**{**args, "readme": tmp_path / "nope.md"})


def test_the_readme_has_the_showcase_markers() -> None:
    text = (REPO / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text.split(BEGIN)[1].split(END)[0]
    assert re.search(r"docs/showcase/figure\.png", block) or "make run" in block


def test_make_run_builds_the_report_and_make_test_installs_the_browser() -> None:
    make = (REPO / "Makefile").read_text()
    run = make.split("\nrun:")[1].split("\n\n")[0]
    assert "snakemake --cores" in run and run.index("--cores") < run.index("--report results/report.html")
    test, browser = make.split("\ntest:")[1].split("\n")[0], make.split("\nbrowser:")[1].split("\n\n")[0]
    assert "browser" in test.split()
    assert "apt-get install" in browser and "chromium chromium-driver" in browser


def test_cell_metrics_read_as_words() -> None:
    from fedrepro.report.scorecard import accuracy_summary

    spec = {"name": "t", "metric": "last_k_max_acc", "target_acc": 55, "columns": [
        {"setting": "a"}, {"setting": "a", "metric": "rounds_to_acc"},
        {"setting": "a", "metric": "round_bytes_up", "reduce": "mean", "scale": 1.0e-6},
        {"setting": "a", "metric": "cache_mb", "round": 20}]}
    assert accuracy_summary(spec) == ("max of last k; rounds to 55% accuracy; round bytes up (mean over "
                                      "evaluations, x 1e-06); cache mb at round 20")


def test_scorecard_has_a_convergence_section_per_study_naming_the_runs_that_miss(tmp_path: Path) -> None:
    spec = spec_of(TWO_COLS)
    csv = tmp_path / "t.csv"
    cells = cells_of(spec, [[70.0, 60.0], [69.0, 59.0], [1.0, 2.0]], [[NAN] * 2] * 3, [[NAN] * 2] * 3)
    cells.assign(n_seeds=3, ours_std=[0.5, 3.0, 1.0, 1.0, 0.2, 0.2]).to_csv(csv, index=False)
    flat, climbing = [50, 60, 70, 70, 70, 70, 70, 70], [10, 20, 30, 40, 50, 60, 70, 80]
    runs = pd.DataFrame([dict(setting="x", method=m, seed=0, round=r + 1, test_acc=a)
                         for m, curve in (("a", flat), ("b", climbing)) for r, a in enumerate(curve)])
    summary = pd.DataFrame([dict(setting="x", method=m, seed=0, status="complete", final_acc=70.0,
                                 per_class_acc="[70.0, 70.0]") for m in "ab"])
    write_checked_csv(runs, tmp_path / "runs.csv")  # as the aggregation writes them
    write_checked_csv(summary, tmp_path / "summary.csv")
    # the runs of x are in no table; a figure of their final accuracies reports them: the quarter means judge them
    figure = {"kind": "sweep_line", "metric": "final_acc", "drawn_runs": [["x", "a"], ["x", "b"]]}
    build_scorecard([("s", spec, csv)], "embedded", tmp_path / "sc.md", tmp_path / "sc.html",
                    runs={"s": (tmp_path / "runs.csv", tmp_path / "summary.csv")}, figures={"s": [figure]})
    md, page = (tmp_path / "sc.md").read_text(), (tmp_path / "sc.html").read_text()
    assert "### Convergence" in md and "**1 of 2 (50%)**" in md
    assert "| x | b | 0 | 8 | mean 75.00 vs 55.00 before (+20.00, quarter-mean) | complete |" in md
    assert "**5 of 6 (83%)**" in md and "| t | A | two | 3.00 | 3 |" in md
    assert "<h3>Convergence</h3>" in page and "<strong>1 of 2 (50%)</strong>" in page
    # drawn only as curves, no number of theirs is reported: listed as not judged, never as at their plateau
    build_scorecard([("s", spec, csv)], "embedded", tmp_path / "sc.md", tmp_path / "sc.html",
                    runs={"s": (tmp_path / "runs.csv", tmp_path / "summary.csv")},
                    figures={"s": [{**figure, "kind": "curve"}]})
    md = (tmp_path / "sc.md").read_text()
    assert "**none**" in md and "2 runs, a on x (1 seed), b on x (1 seed)." in md
    assert "Runs that miss the plateau rule" not in md
