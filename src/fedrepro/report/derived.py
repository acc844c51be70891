"""Per-run numbers a table needs beyond summary.json, derived from the evaluation rows in runs.csv:
rounds to reach a target accuracy (FedDisco Tables 3/10), a metric at a given round (Table 12), a per-round
cost averaged over the run, optionally rescaled (FedL2G Table 3: MB up/down, client/server seconds per round),
the maximum over the last k evaluations (Feddle's reported number) and the sd over the last k evaluations
(FedDisco Table 10's ±, a spread over rounds within one run, not over seeds). A per-round cost may be averaged
over one phase of the run only (FedL2G Table 3: seconds per round of the warm-up rounds, in the paper's
brackets, and of the rounds after it, the reference code's per-round time)."""

from __future__ import annotations

import math

import pandas as pd

from fedrepro.report.collect import KEYS
from fedrepro.study import average_sources

# per-run columns of summary.csv, and of finetune.csv for the fine-tuning tables (source: finetune)
SUMMARY_METRICS = ("final_acc", "best_acc", "last_k_acc", "target_acc", "best_target_acc")
LOWER_IS_BETTER = ("rounds_to_", "client_acc_var", "last_k_sd_acc", "bound", "round_bytes_", "client_seconds",
                   "server_seconds", "server_gflops", "cache_mb")
LAST_K_MAX = "last_k_max_acc"
LAST_K_SD = "last_k_sd_acc"
BOUND = "bound"  # FedDisco Table 6's simulated bound, a column of the simulation's own frame
# A method with a warm-up period logs this per evaluation row (FedL2G: 1 while the clients only send feedback,
# 0 once they train); a run without it has no warm-up, so all its rows are "regular".
WARMUP = "warmup"
PHASES = ("warmup", "regular")


def metric_key(spec: dict, column: dict) -> str:
    """The summary column a table cell reads: e.g. best_acc, rounds_to_55 or client_acc_var@10; an averaging
    column's is that of the columns it averages (one kind of number, checked with the study)."""
    if "average_of" in column:
        return metric_key(spec, spec["columns"][average_sources(spec, column)[0]])
    metric = column.get("metric") or spec["metric"]
    if metric == "rounds_to_acc":
        if spec.get("target_acc") is None:
            raise ValueError(f"table {spec['name']}: metric rounds_to_acc needs the table's target_acc")
        return f"rounds_to_{spec['target_acc']:g}"
    if metric in SUMMARY_METRICS or metric in (LAST_K_MAX, LAST_K_SD, BOUND):
        return metric
    if column.get("reduce") == "mean":
        scale, phase = column.get("scale", 1), column.get("phase")
        return (f"{metric}@mean" + ("" if phase is None else f"[{phase}]")
                + ("" if scale == 1 else f"*{scale:g}"))
    if column.get("round") is None:
        raise ValueError(f"table {spec['name']}: metric {metric} of column {column.get('label')!r} needs a round")
    return f"{metric}@{column['round']}"


def lower_is_better(key: str) -> bool:
    return key.startswith(LOWER_IS_BETTER)


def rounds_to(curve: pd.DataFrame, target: float) -> float:
    """First evaluated round whose test accuracy reaches ``target`` (NaN if it never does)."""
    hit = curve.loc[curve["test_acc"] >= target, "round"]
    return float(hit.min()) if len(hit) else math.nan


def at_round(curve: pd.DataFrame, column: str, rnd: int) -> float:
    """``column`` at the last evaluation at or before round ``rnd`` (NaN if none)."""
    rows = curve[curve["round"] <= rnd]
    return float(rows.sort_values("round")[column].iloc[-1]) if len(rows) else math.nan


def last_k_max(curve: pd.DataFrame, k: int) -> float:
    """The maximum test accuracy over the last ``k`` evaluations of a run."""
    return float(curve.sort_values("round")["test_acc"].iloc[-int(k):].max())


def last_k_sd(curve: pd.DataFrame, k: int) -> float:
    """The sample sd (n-1) of test accuracy over the last ``k`` evaluations of a run: how much it still moves
    between rounds (FedDisco Table 10). NaN with fewer than two evaluations."""
    last = curve.sort_values("round")["test_acc"].iloc[-int(k):]
    return float(last.std(ddof=1)) if len(last) > 1 else math.nan


def phase_rows(curve: pd.DataFrame, phase: str | None) -> pd.DataFrame:
    """The evaluation rows of one phase of a run: ``warmup`` (rows its method flags as warm-up; none for a
    method without one, so the mean is NaN and the cell shows no number), ``regular`` (every other row) or
    None (all rows). A row's costs average the rounds since the previous evaluation, so the split is exact
    when every round is evaluated (eval_every 1, the paper scale)."""
    if phase is None:
        return curve
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES}")
    warm = curve[WARMUP].fillna(0).astype(float) > 0 if WARMUP in curve.columns else pd.Series(False, curve.index)
    return curve[warm] if phase == "warmup" else curve[~warm]


def add_derived(spec: dict, summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with one more column for every derived metric the table's columns name."""
    # an averaging column reads no runs: the cells it averages have theirs
    keys = {metric_key(spec, c): c for c in spec["columns"] if "average_of" not in c}
    derived = {k: c for k, c in keys.items() if k not in SUMMARY_METRICS}
    if not derived:
        return summary
    out = summary.copy()
    curves = {key: group for key, group in runs.groupby(KEYS)}
    for key, column in derived.items():
        values = []
        for run, last_k in zip(out[KEYS].itertuples(index=False), out["last_k"], strict=True):
            curve = curves.get(tuple(run))
            if curve is None:
                values.append(math.nan)
            elif key == LAST_K_MAX:
                values.append(last_k_max(curve, last_k))
            elif key == LAST_K_SD:
                values.append(last_k_sd(curve, last_k))
            elif key.startswith("rounds_to_"):
                values.append(rounds_to(curve, spec["target_acc"]))
            else:
                metric = column.get("metric") or spec["metric"]
                if metric not in curve.columns:
                    raise ValueError(f"table {spec['name']}: runs.csv has no column {metric!r}")
                if column.get("reduce") == "mean":
                    # each evaluation row holds the mean over the rounds since the previous one
                    rows = phase_rows(curve, column.get("phase"))
                    values.append(float(rows[metric].mean()) * column.get("scale", 1) if len(rows) else math.nan)
                else:
                    values.append(at_round(curve, metric, column["round"]))
        out[key] = values
    return out
