"""Whether a study's numbers are finished results: each run at its plateau, seeds that agree, no method at chance.

The scorecard's convergence section. A run is at its plateau when the number its tables report no longer moves
by more than ``PLATEAU_POINTS`` (a run still climbing, or falling, by more is a snapshot, not a result), judged
on that number's own statistic of its test-accuracy curve:

- best over rounds (table metric ``best_acc``): the best over all evaluations exceeds the best over the first
  three quarters of them by at most ``PLATEAU_POINTS``;
- max of the last k (``last_k_max_acc``, Feddle's reporting): the reported number is a max over a window of the
  last evaluations, so the max over the last quarter is compared with the max over the quarter before;
- final, mean of the last k, or any other accuracy: the mean of the last quarter against the mean of the quarter
  before;
- a fine-tuning cell whose pre-training hands on the model of its best round (``keep_best``): its pre-training's
  best over rounds, as above.

A run is judged as well by the per-run number of every figure that shows one of it (a heatmap of best-over-rounds
gains: best over rounds; fedrepro.report.figure_kinds, ``reports``), and must meet the rule of each of its tables'
and figures' metrics. A run of which no table or figure reports a number (drawn only as per-round curves, such as
Feddle's Fig. 2 of update cosines over the first rounds) has no reported number to settle: it is listed as not
judged, never counted as at its plateau. A run that early stopping ended (summary.csv's ``stopped_round``) is judged
like any other but named apart: early stopping ends it a patience after its best, so when its last quarter is
longer than that patience the rule holds by construction, and says its best stopped rising for that long, not that
its curve had settled.

A table cell's seeds agree when their standard deviation is at most ``SEED_SD_POINTS``; a method sits at chance
when its final accuracy, averaged over seeds, is within ``CHANCE_POINTS`` of 100 / classes.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedrepro.report.collect import DIVERGED_BECAUSE, KEYS, STOPPED
from fedrepro.report.derived import metric_key
from fedrepro.report.figure_kinds import figure_metrics

PLATEAU_POINTS = 1.0
SEED_SD_POINTS = 2.0
CHANCE_POINTS = 2.0
# targets the embedded default is held to (issue: at least 90% of runs at plateau, 80% of cells with sd <= 2)
PLATEAU_TARGET = 0.9
SEED_SD_TARGET = 0.8
# the plateau rules, by the table metric they follow (any other: QUARTER_MEAN)
QUARTER_MEAN, BEST_OVER_ROUNDS, LAST_K_MAX = "quarter-mean", "best-over-rounds", "last-k-max"
RULE_OF_METRIC = {"best_acc": BEST_OVER_ROUNDS, "last_k_max_acc": LAST_K_MAX}
_STATISTIC = {QUARTER_MEAN: "mean", BEST_OVER_ROUNDS: "best", LAST_K_MAX: "max"}


@dataclass
class PlateauCheck:
    """One plateau rule applied to a run: the statistic it compares, ``last`` (the last quarter's mean or max,
    or the best over all evaluations) against ``before`` (the quarter before, or the first three quarters)."""

    rule: str
    before: float
    last: float

    @property
    def change(self) -> float:
        return self.last - self.before

    @property
    def passes(self) -> bool:
        return abs(self.change) <= PLATEAU_POINTS

    def text(self) -> str:
        return f"{_STATISTIC[self.rule]} {self.last:.2f} vs {self.before:.2f} before ({self.change:+.2f}, {self.rule})"


@dataclass
class RunPlateau:
    setting: str
    method: str
    seed: int
    evaluations: int
    quarter_before: float
    last_quarter: float
    status: str = "complete"
    checks: list[PlateauCheck] = field(default_factory=list)  # the rules of its tables; none: the quarter means
    stopped_round: int | None = None  # the round early stopping ended it at
    diverged_round: int | None = None
    diverged_because: str = ""  # its round's loss and first non-finite quantity, where the run recorded them

    def __post_init__(self) -> None:
        if not self.checks:
            self.checks = [PlateauCheck(QUARTER_MEAN, self.quarter_before, self.last_quarter)]

    @property
    def change(self) -> float:
        return self.last_quarter - self.quarter_before

    @property
    def at_plateau(self) -> bool:
        # a diverged run has no plateau whatever its curve did before it stopped
        return self.status == "complete" and all(c.passes for c in self.checks)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


@dataclass
class CellSpread:
    table: str
    row: str
    column: str
    sd: float
    seeds: int


@dataclass
class AtChance:
    setting: str
    method: str
    final_acc: float
    chance: float


@dataclass
class StudyConvergence:
    study: str
    runs: list[RunPlateau] = field(default_factory=list)
    too_short: list[tuple[str, str, int]] = field(default_factory=list)  # fewer than 4 evaluations
    unjudged: list[tuple[str, str, int]] = field(default_factory=list)  # no table or figure reports their number
    cells: list[CellSpread] = field(default_factory=list)
    at_chance: list[AtChance] = field(default_factory=list)

    @property
    def runs_at_plateau(self) -> int:
        return sum(r.at_plateau for r in self.runs)

    @property
    def cells_agreeing(self) -> int:
        return sum(c.sd <= SEED_SD_POINTS for c in self.cells)


def quarter_means(acc: np.ndarray) -> tuple[float, float] | None:
    """(mean of the quarter before the last, mean of the last quarter) of a run's evaluations, in order;
    None with fewer than 4 evaluations (no quarter to compare)."""
    check = plateau_check(acc, QUARTER_MEAN)
    return None if check is None else (check.before, check.last)


def plateau_check(acc: np.ndarray, rule: str) -> PlateauCheck | None:
    """``rule`` applied to a run's test accuracies (in order of evaluation); None with fewer than 4 evaluations
    (no quarter to compare)."""
    n, q = len(acc), len(acc) // 4
    if q == 0:
        return None
    if rule == BEST_OVER_ROUNDS:
        return PlateauCheck(rule, float(np.max(acc[:n - q])), float(np.max(acc)))
    statistic = np.max if rule == LAST_K_MAX else np.mean
    return PlateauCheck(rule, float(statistic(acc[n - 2 * q:n - q])), float(statistic(acc[n - q:])))


def cell_rule(spec: dict, column: dict, setting: str, method: str) -> str:
    """The plateau rule of the number a table cell reports: its metric's, or the best over rounds for a fine-tuning
    cell whose pre-training hands on the model of its best round (``kept_best_runs``)."""
    if [setting, method] in spec.get("kept_best_runs", []):
        return BEST_OVER_ROUNDS
    return RULE_OF_METRIC.get(metric_key(spec, column), QUARTER_MEAN)


def plateau_change_column(rule: str) -> str:
    """The column of a table's cells frame holding each run's change of ``rule``'s statistic (add_plateau_changes)."""
    return f"plateau_change[{rule}]"


def add_plateau_changes(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with each run's change under every plateau rule (PlateauCheck.change, from its curve in
    ``runs``; NaN for a run with fewer than 4 evaluations or no curve), so a table can mark the cells whose runs
    still move (fedrepro.report.tables)."""
    curves = {key: g.sort_values("round")["test_acc"].to_numpy(dtype=float)
              for key, g in runs.groupby(KEYS)} if len(runs) else {}
    out = summary.copy()
    for rule in _STATISTIC:
        changes = []
        for run in out[KEYS].itertuples(index=False):
            acc = curves.get(tuple(run))
            check = None if acc is None else plateau_check(acc, rule)
            changes.append(math.nan if check is None else check.change)
        out[plateau_change_column(rule)] = changes
    return out


def run_plateaus(runs: pd.DataFrame, summary: pd.DataFrame,
                 rules: dict[tuple[str, str], list[str]] | None = None
                 ) -> tuple[list[RunPlateau], list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """Every run's plateau checks (runs.csv rows: one per run and evaluation) by the rules of the tables and figures
    that report its number (``rules``: (setting, method) -> rules, plateau_rules; None: every run by the quarter
    means), the runs too short to judge, and the runs ``rules`` lacks (no reported number: not judged)."""
    keys = [(str(r.setting), str(r.method), int(r.seed)) for r in summary.itertuples(index=False)]
    status = dict(zip(keys, summary["status"], strict=True))
    stopped = {k: int(v) for k, v in zip(keys, summary.get(STOPPED, [None] * len(keys)), strict=True) if pd.notna(v)}
    absent = [None] * len(keys)  # a frame without the column (summaries written before it, or by hand)
    diverged = {k: (int(r) if pd.notna(r) else None, str(why) if pd.notna(why) else "")
                for k, s, r, why in zip(keys, summary["status"], summary.get("diverged_round", absent),
                                        summary.get(DIVERGED_BECAUSE, absent), strict=True)
                if s == "diverged"}
    plateaus, short, unjudged = [], [], []
    for (setting, method, seed), curve in runs.groupby(["setting", "method", "seed"], sort=True):
        acc = curve.sort_values("round")["test_acc"].to_numpy(dtype=float)
        key = (str(setting), str(method), int(seed))
        if rules is not None and key[:2] not in rules:
            unjudged.append(key)
            continue
        means = quarter_means(acc)
        run_status = status.get(key, "complete")
        if means is None and run_status != "complete":
            # a run that diverged before its fourth evaluation is a miss like any diverged run, never left out
            last = float(acc[-1]) if len(acc) else float("nan")
            plateaus.append(RunPlateau(*key, evaluations=len(acc), quarter_before=last, last_quarter=last,
                                       status=run_status, diverged_round=diverged.get(key, (None, ""))[0],
                                       diverged_because=diverged.get(key, (None, ""))[1]))
            continue
        if means is None:
            short.append(key)
            continue
        checks = [plateau_check(acc, rule) for rule in (rules[key[:2]] if rules is not None else [QUARTER_MEAN])]
        plateaus.append(RunPlateau(*key, evaluations=len(acc), quarter_before=means[0], last_quarter=means[1],
                                   status=run_status, checks=checks, stopped_round=stopped.get(key),
                                   diverged_round=diverged.get(key, (None, ""))[0],
                                   diverged_because=diverged.get(key, (None, ""))[1]))
    return plateaus, short, unjudged


def _accuracy_columns(spec: dict) -> set[int]:
    # an `average_of` column is no cell of runs: its spread restates that of the cells it averages
    return {j for j, c in enumerate(spec["columns"]) if "average_of" not in c and metric_key(spec, c).endswith("_acc")}


def plateau_rules(tables: list[tuple[dict, pd.DataFrame]], figures: Sequence[dict] = ()
                  ) -> dict[tuple[str, str], list[str]]:
    """(setting, method) -> the plateau rules of the metrics of the table accuracy cells that show its runs and
    of the per-run numbers the figures (job specs) show of them."""
    rules: dict[tuple[str, str], set[str]] = {}
    for spec, cells in tables:
        n_cols, accuracy_cols = len(spec["columns"]), _accuracy_columns(spec)
        for i, cell in enumerate(cells.itertuples(index=False)):
            if i % n_cols in accuracy_cols:
                rule = cell_rule(spec, spec["columns"][i % n_cols], str(cell.setting), str(cell.method))
                rules.setdefault((str(cell.setting), str(cell.method)), set()).add(rule)
    for run, metrics in figure_metrics(figures).items():
        rules.setdefault(run, set()).update(RULE_OF_METRIC.get(m, QUARTER_MEAN) for m in metrics)
    return {key: sorted(found) for key, found in rules.items()}


def accuracy_cells(spec: dict, cells: pd.DataFrame) -> list[CellSpread]:
    """The table's accuracy cells (cost columns such as MB or seconds left out) with their seed sd."""
    n_cols, accuracy_cols = len(spec["columns"]), _accuracy_columns(spec)
    out = []
    for i, cell in enumerate(cells.itertuples(index=False)):
        if i % n_cols not in accuracy_cols or cell.status not in ("ok", "partial") or cell.n_seeds < 2:
            continue
        if not math.isfinite(float(cell.ours_std)):
            continue
        out.append(CellSpread(spec["name"], str(cell.row), str(cell.column), float(cell.ours_std), int(cell.n_seeds)))
    return out


def chance_level(summary: pd.DataFrame) -> list[AtChance]:
    """Method x setting whose final accuracy (mean over seeds) is within CHANCE_POINTS of 100 / classes; the
    number of classes is the length of the runs' per-class accuracy list."""
    if "per_class_acc" not in summary.columns:
        return []
    out = []
    for (setting, method), group in summary.groupby(["setting", "method"], sort=True):
        lists = [json.loads(v) for v in group["per_class_acc"] if isinstance(v, str) and v]
        if not lists:
            continue
        chance = 100.0 / len(lists[0])
        final = float(group["final_acc"].mean())
        if final <= chance + CHANCE_POINTS:
            out.append(AtChance(str(setting), str(method), final, chance))
    return out


def study_convergence(study: str, runs: pd.DataFrame, summary: pd.DataFrame,
                      tables: list[tuple[dict, pd.DataFrame]], figures: Sequence[dict] = ()) -> StudyConvergence:
    """A study's convergence: its runs' plateaus (each by the rules of the tables and figures, job specs, that
    report its number), its tables' accuracy cells' seed sd, methods at chance."""
    plateaus, short, unjudged = run_plateaus(runs, summary, plateau_rules(tables, figures))
    cells = [c for spec, table_cells in tables for c in accuracy_cells(spec, table_cells)]
    return StudyConvergence(study, plateaus, short, unjudged, cells, chance_level(summary))


def _missed(run: RunPlateau) -> str:
    """The checks a (complete) run misses."""
    return "; ".join(c.text() for c in run.checks if not c.passes)


def _status(run: RunPlateau) -> str:
    return run.status if run.stopped_round is None else f"{run.status} (early stop at round {run.stopped_round})"


def _share(k: int, n: int) -> str:
    return f"{k} of {n} ({100 * k / n:.0f}%)" if n else "none"


def convergence_blocks(conv: StudyConvergence) -> tuple[list[str], list[tuple[str, list[str], list[list[str]]]]]:
    """The study's convergence section as statements (Markdown with **bold**) and tables (title, head, rows), for
    the scorecard to render as Markdown and HTML."""
    n_runs, n_cells = len(conv.runs), len(conv.cells)
    judged = {rule: sum(rule in (c.rule for c in r.checks) for r in conv.runs) for rule in _STATISTIC}
    statements = [
        f"Runs at their plateau, judged on the number their tables and figures report, within {PLATEAU_POINTS:g} "
        f"point: best-over-rounds cells, the best test accuracy over all evaluations against the best over the first "
        f"three quarters; last-k-max cells (a max over a window), the max over the last quarter of evaluations "
        f"against the max over the quarter before; other cells, the quarter-mean rule (the mean of the last "
        f"quarter against the quarter before); a run reported by several metrics meets each: "
        f"**{_share(conv.runs_at_plateau, n_runs)}** (target: at least {PLATEAU_TARGET:.0%})."
        + ("" if not n_runs else " Runs judged by " + ", ".join(f"{rule}: {k}" for rule, k in judged.items() if k)
           + "."),
        f"Table accuracy cells whose seeds agree (sd at most {SEED_SD_POINTS:g} points): "
        f"**{_share(conv.cells_agreeing, n_cells)}** (target: at least {SEED_SD_TARGET:.0%}).",
    ]
    if conv.at_chance:
        names = "; ".join(f"{c.method} on {c.setting} ({c.final_acc:.1f}%, chance {c.chance:.1f}%)"
                          for c in conv.at_chance)
        statements.append(f"At chance (final accuracy within {CHANCE_POINTS:g} points of 100 / classes): {names}.")
    else:
        statements.append(f"No method sits at chance (final accuracy within {CHANCE_POINTS:g} points of "
                          "100 / classes).")
    if conv.unjudged:
        drawn = Counter((setting, method) for setting, method, _ in conv.unjudged)
        names = ", ".join(f"{m} on {s} ({n} seed{'s' * (n > 1)})" for (s, m), n in drawn.items())
        statements.append(f"Not judged, as no table or figure reports a number of theirs (drawn only as per-round "
                          f"curves or probes): {len(conv.unjudged)} runs, {names}.")
    early = [r for r in conv.runs if r.stopped_round is not None]
    if early:
        statements.append(f"Ended by early stopping: {len(early)} runs, {sum(r.at_plateau for r in early)} of them "
                          "counted at their plateau; early stopping ends a run a patience after its best, so for "
                          "these the rule says the best stopped rising for that long, not that the curve settled.")
    if conv.too_short:
        statements.append(f"Too few evaluations to judge (fewer than 4): {len(conv.too_short)} runs.")
    diverged = [r for r in conv.runs if r.diverged]
    if diverged:  # with the plateau count they are part of, apart from the runs still moving
        statements[0] += (f" Diverged: **{_share(len(diverged), n_runs)}**, counted among the runs not at their "
                          "plateau (a diverged run has none) and listed apart below, with why.")
    tables = []
    missed = [r for r in conv.runs if not r.at_plateau and not r.diverged]
    if missed:
        tables.append(("Runs that miss the plateau rule",
                       ["setting", "method", "seed", "evaluations", "plateau check (last vs before)", "status"],
                       [[r.setting, r.method, str(r.seed), str(r.evaluations), _missed(r), _status(r)]
                        for r in missed]))
    if diverged:
        tables.append(("Runs that diverged",
                       ["setting", "method", "seed", "round", "why (the round's training loss, the first quantity "
                        "that went non-finite)"],
                       [[r.setting, r.method, str(r.seed), "" if r.diverged_round is None else str(r.diverged_round),
                         r.diverged_because or "not recorded (a run written before diagnoses were kept)"]
                        for r in diverged]))
    spread = [c for c in conv.cells if c.sd > SEED_SD_POINTS]
    if spread:
        tables.append((f"Cells whose seed sd exceeds {SEED_SD_POINTS:g} points",
                       ["table", "row", "column", "sd", "seeds"],
                       [[c.table, c.row, c.column, f"{c.sd:.2f}", str(c.seeds)] for c in spread]))
    return statements, tables
