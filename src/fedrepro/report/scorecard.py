"""The scorecard: per study table, how many cells we regenerated, how far they are from the published
ones, and whether the paper's ranking claims hold in our numbers.

It reads the tidy cell CSVs the table rule writes (one row per cell, row-major over the table spec's
rows and columns), so any study that declares tables (and, optionally, `claims`) plugs in.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedrepro.report.collect import MACHINE, write_text_atomic
from fedrepro.report.convergence import StudyConvergence, convergence_blocks, study_convergence
from fedrepro.report.derived import LAST_K_MAX, SUMMARY_METRICS, lower_is_better, metric_key
from fedrepro.report.integrity import read_aggregate
from fedrepro.report.paired import SeedValues, paired_differences, seed_values
from fedrepro.report.published import trials_behind_sd
from fedrepro.report.tables import MOVING, decimals
from fedrepro.study import column_refs

EMBEDDED_STATEMENT = (
    "**Embedded scale.** These runs use small stand-in data sets that ship with scikit-learn, small "
    "models and few rounds, while the published numbers come from the papers' own data sets at full "
    "scale: the numbers are **not comparable** with the published ones, so this scorecard compares "
    "**rankings only** (rank agreement and the papers' ranking claims)."
)
EMBEDDED_LEVELS_STATEMENT = (
    "**Embedded scale.** Tables on the papers' own data sets, reduced in samples, epochs and rounds (each "
    "table's deviations say how): {tables}. Their **levels and rankings** compare with the published ones, so "
    "the scorecard shows |Δ| = |ours − published| for them and counts the accuracy cells within {points:g} "
    "points of the published value, naming every other cell with the table's deviations as its reasons."
)
STAND_IN_STATEMENT = (
    "The other tables run on small stand-in data sets that ship with scikit-learn, small models and few rounds: "
    "their numbers are **not comparable** with the published ones, so for them this scorecard compares "
    "**rankings only** (rank agreement and the papers' ranking claims)."
)
PAPER_STATEMENT = (
    "**Paper scale.** |Δ| = |ours − published| over the cells that have both; \"within 2 sd\" counts the "
    "cells whose difference is at most twice the published standard deviation, among the cells the "
    "paper prints a standard deviation for (many tables print none)."
)
SUMMARIES = {
    "final_acc": "final",
    "best_acc": "best",
    "last_k_acc": "mean of last k",
    "target_acc": "final (after fine-tuning)",
    "best_target_acc": "best (over fine-tuning epochs)",
    "last_k_max_acc": "max of last k",
    "last_k_sd_acc": "sd over the last k rounds",
}
HAVE_VALUE = ("ok", "partial")
# issue #23: a table on the paper's own data (compare_levels) is informative when each cell lies within this many
# points of its published value, or the scorecard names the cell and the table's deviations as the reasons
LEVEL_POINTS = 8.0
# the metrics that rule applies to: accuracies, in percentage points (not rounds, bytes or seconds)
LEVEL_METRICS = (*SUMMARY_METRICS, LAST_K_MAX)
RANK_MIN_ROWS = 3  # Kendall's tau over fewer rows says little
# a claim's place: it holds (fails) where the difference in its favour exceeds (falls below minus) NOISE_SE
# standard errors, and is within noise otherwise
NOISE_SE = 2
HOLDS, FAILS, WITHIN_NOISE, UNRESOLVED = "holds", "fails", "within noise", "unresolved"
ONE_SEED = "1 seed"  # our side of a place without an SE: nothing to judge the difference against
MOVING_NOTE = f"{MOVING} seeds not at their plateau"  # the tables' mark of such cells


@dataclass
class ClaimResult:
    """One ranking claim, checked in our numbers and in the published ones: each a verdict line (the outcome,
    the tally of its places, each place's difference ± its standard error)."""

    text: str
    ours: str
    paper: str
    holds: bool | None  # in ours; None: within noise somewhere, or cells missing (and failing nowhere)


@dataclass
class TableScore:
    study: str
    table: str
    caption: str
    paper_table: str | None
    summary: str
    cells: int
    regenerated: int
    published: int
    compared: int
    mean_abs_diff: float
    max_abs_diff: float
    with_std: int
    within_2sd: int
    rank_tau: float
    claims: list[ClaimResult] = field(default_factory=list)
    compare_levels: bool = False  # the table's cells run on the paper's own data sets (its spec's key)
    level_cells: int = 0  # accuracy cells with both numbers
    level_misses: list[str] = field(default_factory=list)  # those beyond LEVEL_POINTS, each with its reasons


def accuracy_summary(spec: dict) -> str:
    """Which number the table's cells show: final, best or mean of last k (or a per-column metric)."""
    metrics = [metric_key(spec, c) for c in spec["columns"]]
    return "; ".join(metric_words(m) for m in dict.fromkeys(metrics))


def metric_words(key: str) -> str:
    """A cell metric's key (fedrepro.report.derived.metric_key) in words: "round_bytes_up@mean*1e-06" ->
    "round bytes up (mean over evaluations, x 1e-06)"; "cache_mb@20" -> "cache mb at round 20"."""
    if key in SUMMARIES:
        return SUMMARIES[key]
    if key.startswith("rounds_to_"):
        return f"rounds to {key.removeprefix('rounds_to_')}% accuracy"
    name, _, how = key.partition("@")
    words = name.replace("_", " ")
    if how.startswith("mean"):
        scale = how.removeprefix("mean").removeprefix("*")
        return f"{words} (mean over evaluations" + (f", x {scale})" if scale else ")")
    return f"{words} at round {how}" if how else words


def _grid(spec: dict, cells: pd.DataFrame, column: str) -> list[list[float]]:
    """cells[column] as a rows x columns grid (NaN where the cell has no value of ours)."""
    n_rows, n_cols = len(spec["rows"]), len(spec["columns"])
    if len(cells) != n_rows * n_cols:
        raise ValueError(f"table {spec['name']}: {len(cells)} cells in its CSV, but the spec has "
                         f"{n_rows} rows x {n_cols} columns; rerun the table rule")
    values = pd.to_numeric(cells[column], errors="coerce").tolist()
    if column == "ours_mean":
        values = [v if s in HAVE_VALUE else math.nan for v, s in zip(values, cells["status"], strict=True)]
    return [values[i * n_cols:(i + 1) * n_cols] for i in range(n_rows)]


def _columns_of(spec: dict, names: list[str] | None) -> list[int]:
    if names is None:
        return list(range(len(spec["columns"])))
    return [j for j, c in enumerate(spec["columns"]) if column_refs(c) & set(names)]


def _column_index(spec: dict, name: str) -> int:
    hits = [j for j, c in enumerate(spec["columns"]) if name in column_refs(c)]
    if len(hits) != 1:
        raise ValueError(f"table {spec['name']}: claim column {name!r} must name exactly one column")
    return hits[0]


def _row_index(spec: dict, method: str) -> int:
    rows = [r["method"] for r in spec["rows"]]
    if method not in rows:
        raise ValueError(f"table {spec['name']}: claim row {method!r} is not one of {rows}")
    return rows.index(method)


def _beats(a: float, b: float, lower: bool) -> bool:
    # compared at the printed precision (2 decimals), as the tables bold: a tie counts as holding
    a, b = round(a, 2), round(b, 2)
    return a <= b if lower else a >= b


@dataclass(frozen=True)
class Estimate:
    """A cell's mean with the sd (sample, ddof=1) and the number of seeds or trials behind it; sd NaN where
    none is known (one seed, or none printed)."""

    mean: float
    sd: float
    n: int
    moving: bool = False  # seeds of the cell not at their plateau (its table's ‡, n_moving)
    seeds: SeedValues = None  # its setting and per-seed numbers, where it can pair (fedrepro.report.paired)


@dataclass(frozen=True)
class Place:
    """One place a claim is checked: the difference of the two means in the claim's favour (for a
    lower-is-better column, the other's minus the claimed one's) and its standard error (NaN: none known,
    ``no_se`` says why; the outcome is then the sign's, a tie at two decimals holding); printed with the
    decimals of the means compared."""

    name: str
    diff: float
    se: float
    no_se: str
    sign_holds: bool
    digits: int = 2
    moving: bool = False  # a cell compared has seeds not at their plateau: a difference of runs still moving
    test: str = ""  # our places: paired over n seeds, or unpaired and why (fedrepro.report.paired)

    @property
    def outcome(self) -> str:
        if math.isnan(self.se):
            # one seed of ours has no noise estimate: unresolved, never a verdict by sign; a published mean
            # printed without its sd is the paper's own claim, checked by its sign
            if self.no_se == ONE_SEED:
                return UNRESOLVED
            return HOLDS if self.sign_holds else FAILS
        if self.diff > NOISE_SE * self.se:
            return HOLDS
        return FAILS if self.diff < -NOISE_SE * self.se else WITHIN_NOISE

    def text(self) -> str:
        diff = f"{self.diff:+.{self.digits}f}"
        notes = "".join(f"; {note}" for note in (self.test, MOVING_NOTE if self.moving else "") if note)
        if math.isnan(self.se):
            return f"{self.name} {self.outcome}: {diff} ({self.no_se}{notes})"
        return (f"{self.name} {self.outcome}: {diff} ± {self.se:.{self.digits}f} "
                f"({NOISE_SE:g} SE {NOISE_SE * self.se:.{self.digits}f}{notes})")


def _place(name: str, a: Estimate, b: Estimate, lower: bool, no_se: str, ours: bool) -> Place:
    """Claimed cell ``a`` against ``b``. Where the two pair by seed (same setting, the same seeds:
    fedrepro.report.paired) the difference is the mean of the per-seed differences and its SE sd_d / sqrt(n);
    otherwise the difference of the two means, SE sqrt(sd_a²/n_a + sd_b²/n_b) (two independent means). A place
    of ours names its test either way; a published one (trials, never seeds) takes the unpaired rule unnamed."""
    differences, test = paired_differences(a.seeds, b.seeds) if ours else (None, "")
    if differences is not None:
        d = [-x for x in differences] if lower else differences
        diff = statistics.fmean(d)
        se = statistics.stdev(d) / math.sqrt(len(d))
    else:
        diff = b.mean - a.mean if lower else a.mean - b.mean
        se = math.sqrt(a.sd ** 2 / a.n + b.sd ** 2 / b.n) if min(a.n, b.n) > 0 else math.nan
        if test == "unpaired":
            test = f"unpaired, {a.n} and {b.n} seeds"
    return Place(name, diff, se, no_se, _beats(a.mean, b.mean, lower), max(decimals(a.mean), decimals(b.mean)),
                 a.moving or b.moving, test)


def _places(spec: dict, claim: dict, grid: list[list[Estimate]], no_se: str, ours: bool) -> list[Place]:
    """The places the claim can be checked in ``grid`` (those with both means); a `best` claim's place pits the
    claimed row against the strongest other row of the column."""
    lower = [lower_is_better(metric_key(spec, c)) for c in spec["columns"]]
    col_label = [c["label"] for c in spec["columns"]]
    row_label = [r["label"] for r in spec["rows"]]
    places = []
    if "best" in claim:
        i = _row_index(spec, claim["best"])
        for j in _columns_of(spec, claim["columns"]):
            others = [k for k, line in enumerate(grid) if k != i and not math.isnan(line[j].mean)]
            if math.isnan(grid[i][j].mean) or not others:
                continue
            column = [line[j].mean for line in grid]
            k = (min if lower[j] else max)(others, key=column.__getitem__)
            places.append(_place(f"{col_label[j]} (vs {row_label[k]})", grid[i][j], grid[k][j], lower[j], no_se, ours))
    elif "better" in claim:
        i, k = _row_index(spec, claim["better"]), _row_index(spec, claim["than"])
        for j in _columns_of(spec, claim["columns"]):
            if not (math.isnan(grid[i][j].mean) or math.isnan(grid[k][j].mean)):
                places.append(_place(col_label[j], grid[i][j], grid[k][j], lower[j], no_se, ours))
    else:
        j, k = _column_index(spec, claim["better_column"]), _column_index(spec, claim["than_column"])
        rows = range(len(grid)) if claim["rows"] is None else [_row_index(spec, m) for m in claim["rows"]]
        for i in rows:
            if not (math.isnan(grid[i][j].mean) or math.isnan(grid[i][k].mean)):
                places.append(_place(row_label[i], grid[i][j], grid[i][k], lower[j], no_se, ours))
    return places


def _verdict(places: list[Place], total: int) -> tuple[str | None, str]:
    """(the claim's outcome, None if no place could be checked; the verdict line): it holds if it holds in every
    place, fails if it fails in any, is unresolved where every place is (one seed), and is within noise otherwise;
    then each place's difference."""
    if not places:
        return None, "not checkable (no numbers)"
    count = {o: sum(p.outcome == o for p in places) for o in (HOLDS, FAILS, WITHIN_NOISE, UNRESOLVED)}
    n = len(places)
    outcome = (FAILS if count[FAILS] else HOLDS if count[HOLDS] == n else UNRESOLVED if count[UNRESOLVED] == n
               else WITHIN_NOISE)
    words = {HOLDS: "hold", FAILS: "fail", WITHIN_NOISE: "within noise", UNRESOLVED: "unresolved"}
    tally = f"{n} of {n}" if outcome == HOLDS else ", ".join(
        f"{k} {words[o]}" for o, k in count.items() if k) + f" of {n}"
    missing = f"; {total - n} of {total} without numbers" if n < total else ""
    return outcome, f"{outcome} ({tally}){missing}: " + "; ".join(p.text() for p in places)


def claim_text(spec: dict, claim: dict) -> str:
    """The claim in words: its `text`, or one built from its keys and the table's labels."""
    if claim.get("text"):
        return claim["text"]
    label = {r["method"]: r["label"] for r in spec["rows"]}
    where = "every column" if claim["columns"] is None else ", ".join(claim["columns"])
    if "best" in claim:
        return f"{label[claim['best']]} is best in {where}"
    if "better" in claim:
        return f"{label[claim['better']]} beats {label[claim['than']]} in {where}"
    rows = "every row" if claim["rows"] is None else ", ".join(label[m] for m in claim["rows"])
    return f"column {claim['better_column']} beats column {claim['than_column']} in {rows}"


def _estimates(means: list[list[float]], sds: list[list[float]], ns: list[list[float]],
               moving: list[list[float]] | None = None,
               seeds: list[list[SeedValues]] | None = None) -> list[list[Estimate]]:
    moving = moving or [[0.0] * len(line) for line in means]
    seeds = seeds or [[None] * len(line) for line in means]
    return [[Estimate(m, s, 0 if math.isnan(n) else int(n), bool(k > 0), v)
             for m, s, n, k, v in zip(*lines, strict=True)]
            for lines in zip(means, sds, ns, moving, seeds, strict=True)]


def check_claims(spec: dict, cells: pd.DataFrame, trials: int | None = None,
                 seeds: list[list[SeedValues]] | None = None) -> list[ClaimResult]:
    """Each of the table's `claims`, checked in our means (sd over the cell's seeds; where two cells pair by seed,
    ``seeds`` from fedrepro.report.paired, on the per-seed differences) and in the published ones (their printed
    sd over ``trials``, the paper's trial count; None: the table's sds are not over trials)."""
    # a cells CSV from before the plateau marks has no n_moving: nothing marked
    moving = _grid(spec, cells, "n_moving") if "n_moving" in cells.columns else None
    ours = _estimates(_grid(spec, cells, "ours_mean"), _grid(spec, cells, "ours_std"), _grid(spec, cells, "n_seeds"),
                      moving, seeds)
    paper_mean = _grid(spec, cells, "paper_mean")
    paper_sd = _grid(spec, cells, "paper_std") if trials else [[math.nan] * len(line) for line in paper_mean]
    paper = _estimates(paper_mean, paper_sd, [[trials or 0] * len(line) for line in paper_mean])
    paper_no_se = "no sd printed" if trials else "no sd over trials printed"
    out = []
    for claim in spec.get("claims", []):
        claim = {"columns": None, "rows": None, **claim}
        total = _n_places(spec, claim)
        ours_places = _places(spec, claim, ours, ONE_SEED, ours=True)
        outcome, ours_text = _verdict(ours_places, total)
        _, paper_text = _verdict(_places(spec, claim, paper, paper_no_se, ours=False), total)
        # a claim holds only where it holds in every place it makes; one place against it is enough to fail
        holds = False if outcome == FAILS else (True if outcome == HOLDS and len(ours_places) == total else None)
        out.append(ClaimResult(claim_text(spec, claim), ours_text, paper_text, holds))
    return out


def _n_places(spec: dict, claim: dict) -> int:
    if "better_column" in claim:
        return len(spec["rows"]) if claim["rows"] is None else len(claim["rows"])
    return len(_columns_of(spec, claim["columns"]))


def _rank_tau(ours: list[list[float]], paper: list[list[float]]) -> float:
    """Mean over columns of Kendall's tau between our and the published means (rows with both)."""
    # imported here: scipy.stats takes ~0.75 s to import, and every snakemake start (which reads this module
    # through the captions) would pay it
    from scipy.stats import kendalltau

    taus = []
    for j in range(len(ours[0]) if ours else 0):
        pairs = [(o[j], p[j]) for o, p in zip(ours, paper, strict=True) if not (math.isnan(o[j]) or math.isnan(p[j]))]
        if len(pairs) >= RANK_MIN_ROWS:
            tau = kendalltau(*zip(*pairs, strict=True)).statistic
            if not math.isnan(tau):
                taus.append(tau)
    return sum(taus) / len(taus) if taus else math.nan


def _level_misses(spec: dict, ours: list[list[float]], paper: list[list[float]]) -> tuple[int, list[str]]:
    """(the accuracy cells with both numbers, each of them more than LEVEL_POINTS from its published value as
    "row / column: ours vs published (Δ); reasons: the row's deviations, then the table's"); compared at the
    printed two decimals."""
    in_points = [metric_key(spec, c) in LEVEL_METRICS for c in spec["columns"]]
    compared, misses = 0, []
    for row, ours_line, paper_line in zip(spec["rows"], ours, paper, strict=True):
        ids = dict.fromkeys([*(row.get("deviations") or []), *(spec.get("deviations") or [])])
        reasons = ", ".join(ids) or "none named"
        for column, points, o, p in zip(spec["columns"], in_points, ours_line, paper_line, strict=True):
            if not points or math.isnan(o) or math.isnan(p):
                continue
            compared += 1
            if round(abs(o - p), 2) > LEVEL_POINTS:
                misses.append(f"{row['label']} / {column['label']}: ours {o:.2f} vs published {p:.2f} "
                              f"(Δ {o - p:+.2f}); reasons: {reasons}")
    return compared, misses


def score_table(study: str, spec: dict, cells: pd.DataFrame, trials: int | None = None,
                seeds: list[list[SeedValues]] | None = None) -> TableScore:
    """The scorecard line of one table from its tidy cell CSV (``render_table``'s frame); ``trials``: how many
    trials the published sds are over, ``seeds``: each cell's per-seed numbers (check_claims)."""
    ours, paper = _grid(spec, cells, "ours_mean"), _grid(spec, cells, "paper_mean")
    std = [v for line in _grid(spec, cells, "paper_std") for v in line]
    flat = [(o, p, s) for o, p, s in zip([v for line in ours for v in line], [v for line in paper for v in line],
                                          std, strict=True)]
    both = [(abs(o - p), s) for o, p, s in flat if not (math.isnan(o) or math.isnan(p))]
    with_std = [(d, s) for d, s in both if not math.isnan(s)]
    level_cells, misses = _level_misses(spec, ours, paper)
    return TableScore(
        study=study, table=spec["name"], caption=spec.get("caption", ""), paper_table=spec.get("paper_table"),
        summary=accuracy_summary(spec), cells=len(flat),
        regenerated=sum(not math.isnan(o) for o, _, _ in flat),
        published=sum(not math.isnan(p) for _, p, _ in flat),
        compared=len(both),
        mean_abs_diff=sum(d for d, _ in both) / len(both) if both else math.nan,
        max_abs_diff=max((d for d, _ in both), default=math.nan),
        with_std=len(with_std), within_2sd=sum(d <= 2 * s for d, s in with_std),
        rank_tau=_rank_tau(ours, paper), claims=check_claims(spec, cells, trials, seeds),
        compare_levels=bool(spec.get("compare_levels")), level_cells=level_cells, level_misses=misses,
    )


def _num(x: float, fmt: str = ".2f") -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def _two_sd(s: TableScore) -> str:
    if not s.compared:
        return "—"
    if not s.with_std:
        return "paper prints no sd"
    without = s.compared - s.with_std
    return f"{s.within_2sd} of {s.with_std}" + (f" ({without} cells without a published sd)" if without else "")


def _table_rows(scores: list[TableScore], scale: str) -> tuple[list[str], list[list[str]]]:
    head = ["table", "mirrors", "cells show", "regenerated", "with a published number"]
    distances = []  # the columns of the tables that compare levels
    if any(s.compare_levels for s in scores):
        distances = ["mean abs diff", "max abs diff"]
        # the published sd is the papers' spread at their full regime: a yardstick at paper scale only
        distances += ["within 2 published sd"] if scale == "paper" else []
    head += [*distances, "rank agreement (Kendall τ)"]
    rows = []
    for s in scores:
        line = [s.table, s.paper_table or "no published table", s.summary, f"{s.regenerated} of {s.cells}",
                str(s.published)]
        if s.compare_levels:
            line += [_num(s.mean_abs_diff), _num(s.max_abs_diff)] + ([_two_sd(s)] if scale == "paper" else [])
        else:
            line += ["rankings only"] * len(distances)
        line.append(_num(s.rank_tau, "+.2f"))
        rows.append(line)
    return head, rows


def _claim_rows(scores: list[TableScore]) -> list[list[str]]:
    return [[s.table, c.text, c.paper, c.ours] for s in scores for c in s.claims]


def _levels(scores: list[TableScore]) -> list[tuple[str, list[str]]]:
    """Each table that compares levels (and has accuracy cells to compare): its levels line, and its cells
    beyond LEVEL_POINTS."""
    return [(f"{s.table}: cells within {LEVEL_POINTS:g} points of the published value: "
             f"{s.level_cells - len(s.level_misses)} of {s.level_cells}", s.level_misses)
            for s in scores if s.compare_levels and s.level_cells]


def _scale_statement(scale: str, scores: list[TableScore]) -> str:
    if scale == "paper":
        return PAPER_STATEMENT
    levels = [s for s in scores if s.compare_levels]
    if not levels:
        return EMBEDDED_STATEMENT
    by_study: dict[str, list[str]] = {}
    for s in levels:
        by_study.setdefault(s.study, []).append(s.table)
    tables = "; ".join(f"{study} {', '.join(names)}" for study, names in by_study.items())
    statement = EMBEDDED_LEVELS_STATEMENT.format(tables=tables, points=LEVEL_POINTS)
    return statement + (" " + STAND_IN_STATEMENT if len(levels) < len(scores) else "")


def _intro(scale: str, scores: list[TableScore]) -> list[str]:
    return [
        _scale_statement(scale, scores),
        "Rank agreement: Kendall's τ between our and the published means of the rows of each column, "
        f"averaged over the columns with at least {RANK_MIN_ROWS} such rows (+1: same order, −1: reversed). "
        "A claim is checked in our means and, to check the claim itself, in the published ones, at each of its "
        "places (a column, or a row for a claim between columns; a “best” claim's place pits the claimed row "
        "against the strongest other row). There the difference of the two means in the claim's favour **holds** "
        f"when it exceeds {NOISE_SE:g} standard errors, **fails** when it falls below minus {NOISE_SE:g} SE, and is "
        "**within noise** otherwise. Where both of our cells run on the same setting with the same seeds (a seed "
        "fixes a run's partition, initial weights, client sampling and batches, so two such runs differ only by "
        "their method), the place is **paired**: the difference is the mean of the per-seed differences and "
        "SE = sd_d / sqrt(n), leaving out the seed-to-seed spread both cells share. Otherwise (other settings, "
        "seeds that differ because one diverged, and every published place) it is **unpaired**: "
        "SE = sqrt(sd_a²/n_a + sd_b²/n_b), from our sd over seeds (sample sd) or the published sd over the "
        "paper's trials; each of our places says which test it took. A place where we have one seed has no SE and is "
        "**unresolved**; a published pair printed without sds is judged by its sign, ties at two decimals "
        "holding. A claim holds if it holds in every place, fails if it fails in any, "
        "is unresolved if no place could be judged, and is within noise otherwise. A place that compares a cell "
        f"with seeds not at their plateau (its table's ‡) says “{MOVING_NOTE}”: a difference between runs "
        "still moving, which more training could change.",
    ]


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", r"\|") for c in r] for r in [head, *rows]]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in esc[1:])]


def coverage_line(shown_total: tuple[int, int] | list[int], what: str = "") -> str:
    """'published cells shown: N / total': of the paper's published cells, those beside one of ours."""
    shown, total = shown_total
    return f"Published cells shown{what}: {shown} / {total}."


def machines_line(summary: pd.DataFrame) -> str | None:
    """Which machines a study's runs (summary.csv) came from: each distinct CPU model and torch CPU capability
    with its number of runs, most runs first; None when no run recorded its machine."""
    counts = machine_counts(summary)
    return machines_text(counts) if counts else None


def machine_counts(summary: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(CPU, torch CPU capability) -> runs of summary.csv's rows, "not recorded" where a run has none; empty
    when no run recorded its machine (summary.csv without the machine columns)."""
    if not set(MACHINE) <= set(summary.columns):
        return {}
    machines = summary[MACHINE].fillna("").replace("", "not recorded")
    return {(str(cpu), str(capability)): int(n) for (cpu, capability), n in machines.value_counts().items()}


def machines_text(counts: dict[tuple[str, str], int]) -> str:
    """The machines line of ``counts`` (machine_counts, or their sum over studies): most runs first, then by name."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    parts = [f"{cpu} ({capability}): {n} run{'s' * (n != 1)}" for (cpu, capability), n in ordered]
    return f"Machines (CPU, torch CPU capability) the runs came from: {'; '.join(parts)}."


def convergence_markdown(conv: StudyConvergence, heading: str = "###") -> list[str]:
    """A study's convergence subsection: runs at their plateau, cells' seed sd, methods at chance, and the runs
    and cells that miss by name."""
    statements, tables = convergence_blocks(conv)
    lines = [f"{heading} Convergence", ""]
    for text in statements:
        lines += [text, ""]
    for title, head, rows in tables:
        lines += [f"{title}:", "", *_md_table(head, rows), ""]
    return lines


def study_markdown(study: str, scores: list[TableScore], scale: str, heading: str = "##",
                   coverage: tuple[int, int] | None = None,
                   convergence: StudyConvergence | None = None, machines: str | None = None) -> list[str]:
    """One study's section: how many published cells it shows, the machines its runs came from (``machines``:
    machines_line), the table of tables, its claims, then whether its runs are finished (``convergence``)."""
    lines = [f"{heading} {study}", ""]
    if coverage is not None:
        lines += [coverage_line(coverage), ""]
    if machines:
        lines += [machines, ""]
    head, rows = _table_rows(scores, scale)
    lines += _md_table(head, rows)
    levels = _levels(scores)
    if levels:
        lines += ["", "Levels, for the tables on the paper's own data sets:", ""]
        for line, misses in levels:
            lines += [f"- {line}", *(f"  - {m}" for m in misses)]
    claims = _claim_rows(scores)
    if claims:
        held = sum(c.holds is True for s in scores for c in s.claims)
        failed = sum(c.holds is False for s in scores for c in s.claims)
        whose = "the paper" if any(s.paper_table for s in scores) else "this study (its own, no paper's)"
        lines += ["", f"Ranking claims of {whose}: {held} of {len(claims)} hold in our numbers, {failed} fail, "
                  f"{len(claims) - held - failed} within noise or without numbers.", ""]
        lines += _md_table(["table", "claim", "in the published numbers", "in ours"], claims)
    if convergence is not None:
        lines += ["", *convergence_markdown(convergence, heading + "#")]
    return lines + [""]


def _overall(coverage: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(c[0] for c in coverage.values()), sum(c[1] for c in coverage.values())


def render_markdown(scores: list[TableScore], scale: str, coverage: dict[str, tuple[int, int]] | None = None,
                    convergence: dict[str, StudyConvergence] | None = None,
                    machines: dict[str, str | None] | None = None) -> str:
    """The whole scorecard as Markdown; ``coverage``: study -> (published cells shown, published cells);
    ``convergence``: study -> its runs' plateaus and cells' seed sd; ``machines``: study -> machines_line."""
    lines = ["# Scorecard: the papers' tables regenerated", ""]
    for para in _intro(scale, scores):
        lines += [para, ""]
    if coverage:
        lines += [coverage_line(_overall(coverage), f", all studies ({scale} scale)"), ""]
    for study in dict.fromkeys(s.study for s in scores):
        lines += study_markdown(study, [s for s in scores if s.study == study], scale,
                                coverage=(coverage or {}).get(study), convergence=(convergence or {}).get(study),
                                machines=(machines or {}).get(study))
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:80em}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border-bottom:1px solid #ddd;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f3f3f3}.holds{color:#1a7f37}.fails{color:#b42318}
.noise{color:#9a6700}.na{color:#777}"""


def _html_cell(text: str) -> str:
    cls = next((c for prefix, c in ((HOLDS, "holds"), (FAILS, "fails"), (WITHIN_NOISE, "noise"), (UNRESOLVED, "noise"),
                                     ("not checkable", "na")) if text.startswith(prefix)), "")
    return f'<td class="{cls}">{html.escape(text)}</td>' if cls else f"<td>{html.escape(text)}</td>"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["<table><thead><tr>", *(f"<th>{html.escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        out += ["<tr>", *(_html_cell(c) for c in r), "</tr>"]
    return "".join(out + ["</tbody></table>"])


def _html_list(items: list[tuple[str, list[str]]]) -> str:
    """A list of (line, its sub-items) as nested HTML lists."""
    out = ["<ul>"]
    for line, subs in items:
        inner = "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in subs) + "</ul>" if subs else ""
        out.append(f"<li>{html.escape(line)}{inner}</li>")
    return "".join(out + ["</ul>"])


def _md_inline(text: str) -> str:
    # the statements use **bold** only
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(scores: list[TableScore], scale: str, coverage: dict[str, tuple[int, int]] | None = None,
                convergence: dict[str, StudyConvergence] | None = None,
                machines: dict[str, str | None] | None = None) -> str:
    """The whole scorecard as a standalone HTML page (for the Snakemake report)."""
    body = ["<h1>Scorecard: the papers' tables regenerated</h1>",
            *(f"<p>{_md_inline(p)}</p>" for p in _intro(scale, scores))]
    if coverage:
        body.append(f"<p>{html.escape(coverage_line(_overall(coverage), f', all studies ({scale} scale)'))}</p>")
    for study in dict.fromkeys(s.study for s in scores):
        mine = [s for s in scores if s.study == study]
        body.append(f"<h2>{html.escape(study)}</h2>")
        if coverage and study in coverage:
            body.append(f"<p>{html.escape(coverage_line(coverage[study]))}</p>")
        if machines and machines.get(study):
            body.append(f"<p>{html.escape(machines[study])}</p>")
        body.append(_html_table(*_table_rows(mine, scale)))
        levels = _levels(mine)
        if levels:
            body += ["<h3>Levels</h3>", _html_list(levels)]
        claims = _claim_rows(mine)
        if claims:
            body += ["<h3>Ranking claims</h3>",
                     _html_table(["table", "claim", "in the published numbers", "in ours"], claims)]
        if convergence and study in convergence:
            statements, tables = convergence_blocks(convergence[study])
            body += ["<h3>Convergence</h3>", *(f"<p>{_md_inline(t)}</p>" for t in statements)]
            for title, head, rows in tables:
                body += [f"<p>{html.escape(title)}:</p>", _html_table(head, rows)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Scorecard</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def build_scorecard(tables: list[tuple[str, dict, Path]], scale: str, md_out: Path, html_out: Path,
                    coverage: dict[str, tuple[int, int]] | None = None,
                    runs: dict[str, tuple[Path, Path]] | None = None,
                    papers: dict[str, str | None] | None = None,
                    shown_runs: dict[str, tuple[list[tuple[str, str]], list[int] | None]] | None = None,
                    figures: dict[str, list[dict]] | None = None) -> list[TableScore]:
    """Score every (study, table spec, cell CSV) and write the Markdown and HTML scorecards, with each
    study's published cells shown / published cells (``coverage``, fedrepro.report.coverage) and, given its
    (runs.csv, summary.csv) in ``runs``, its convergence section (fedrepro.report.convergence) and the machines
    its runs came from; ``papers``: study -> its paper's key, whose trial count
    (fedrepro.report.published.TRIALS) gives the published sds' SE. A study's runs.csv and summary.csv are
    refused unless whole (their checksums) and holding every seed of every run of ``shown_runs`` (study ->
    (setting, method) runs, seeds; by default the runs they hold: fedrepro.report.integrity.require_runs).
    ``figures``: study -> its figures' job specs, whose per-run numbers judge their runs' plateau too."""
    cells = [(study, spec, pd.read_csv(path)) for study, spec, path in tables]
    convergence, machines, aggregated = {}, {}, {}
    for study, paths in (runs or {}).items():
        shown, seeds = (shown_runs or {}).get(study, (None, None))
        aggregated[study] = study_runs, summary = tuple(read_aggregate(path, shown, seeds) for path in paths)
        convergence[study] = study_convergence(study, study_runs, summary,
                                               [(spec, c) for s, spec, c in cells if s == study],
                                               (figures or {}).get(study, []))
        machines[study] = machines_line(summary)
    scores = [score_table(study, spec, table_cells,
                          trials_behind_sd((papers or {}).get(study), spec.get("paper_table")),
                          seed_values(spec, table_cells, *aggregated[study]) if study in aggregated else None)
              for study, spec, table_cells in cells]
    write_text_atomic(render_markdown(scores, scale, coverage, convergence, machines), Path(md_out))
    write_text_atomic(render_html(scores, scale, coverage, convergence, machines), Path(html_out))
    return scores
