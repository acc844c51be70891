"""Which of a table's cells pair by seed, and the per-seed numbers behind them, for the scorecard's claims.

In this project a seed fixes a run's partition, its initial weights, its client sampling, its batches and its
delays (fedrepro.seeding), all drawn per setting. So two runs of one study on the **same setting with the same
seed** differ only by their method: a claim between two such cells is judged on the per-seed differences (their
mean and sd_d / sqrt(n)), which leaves out the seed-to-seed spread both cells share. Cells on different settings
(another partition, or another data set), averaging columns and cells whose runs come from elsewhere (fine-tuning
records) do not pair; neither do two cells whose seeds are not the same set (a seed that diverged on one side):
those keep the unpaired rule. ``seed_values`` gives each cell of ours its (setting, {seed: value}), from the runs the
table read, by the table's own metric."""

from __future__ import annotations

import math

import pandas as pd

from fedrepro.report.derived import add_derived, metric_key
from fedrepro.report.table_sources import table_source

SeedValues = tuple[str, dict[int, float]] | None  # a cell's setting and each finished seed's number; None: no pairs


def seed_values(spec: dict, cells: pd.DataFrame, runs: pd.DataFrame, summary: pd.DataFrame) -> list[list[SeedValues]]:
    """Each cell of the table (rows x columns, as its cells CSV orders them): its setting and the number its table
    reports for each seed whose run finished (the table's seeds only), or None where the cell cannot pair (an
    averaging column, a table whose cells read no runs.csv, a cell without runs)."""
    n_rows, n_cols = len(spec["rows"]), len(spec["columns"])
    out: list[list[SeedValues]] = [[None] * n_cols for _ in range(n_rows)]
    if table_source(spec.get("source", "train")).cells_from != "summary.csv":  # fine-tuning records, computed tables
        return out
    values = add_derived(spec, summary, runs)
    seeds = set(spec["seeds"]) if spec.get("seeds") else None
    for index, cell in enumerate(cells.itertuples(index=False)):
        i, j = divmod(index, n_cols)
        column = spec["columns"][j]
        if "average_of" in column:
            continue
        key = metric_key(spec, column)
        if key not in values.columns:  # a summary without the metric (written before it existed): no pairs
            continue
        mine = values[(values["method"] == cell.method) & (values["setting"] == cell.setting)
                      & (values["status"] == "complete")]
        per_seed = {int(s): float(v) for s, v in zip(mine["seed"], mine[key], strict=True)
                    if not math.isnan(float(v)) and (seeds is None or int(s) in seeds)}
        if per_seed:
            out[i][j] = (str(cell.setting), per_seed)
    return out


def paired_differences(a: SeedValues, b: SeedValues) -> tuple[list[float] | None, str]:
    """a - b per seed where the two cells pair (same setting, the same seeds, at least two), else None; and the
    words saying which test the place takes and why."""
    if a is None or b is None:
        return None, "unpaired"
    (setting_a, va), (setting_b, vb) = a, b
    if setting_a != setting_b:
        return None, "unpaired, other settings"
    if set(va) != set(vb):
        return None, f"unpaired, seeds differ ({_seeds(va)} and {_seeds(vb)})"
    if len(va) < 2:
        return None, "unpaired"
    return [va[s] - vb[s] for s in sorted(va)], f"paired over {len(va)} seeds"


def _seeds(values: dict[int, float]) -> str:
    return ", ".join(map(str, sorted(values)))
