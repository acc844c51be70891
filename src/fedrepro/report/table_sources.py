"""Where a table's cells come from (a table's `source` key): one ``TableSource`` entry per source in
``TABLE_SOURCES``, holding everything that differs between sources.

- ``cells_from``: the study's aggregated table whose runs fill the cells (beside it the job reads runs.csv, for
  the metrics derived from the curves); None for a table its job computes, which has no runs behind it: the
  config check then skips its rows' runs and claims, and the scorecard counts none of its runs;
- ``check``: what the config check refuses in the table's options beyond the schema (its metrics), as (key
  under the table, problem) pairs (``fedrepro.config.check_study`` raises the first);
- ``cell_problem``: what keeps a setting's runs, once the grid produces them, from filling a cell (finetune:
  a setting without a `target` to fine-tune on), or None;
- ``read``: the table job's frame of cells, from the files ``cells_from`` names (fedrepro.pipeline.table);
- ``spec_extra``: what the source adds to the table's job spec from the study (finetune: the runs whose
  fine-tuning starts from their best pre-trained model, ``keep_best``, which the scorecard's plateau check judges
  by their best accuracy over rounds).

Adding a source is one entry here plus its name in the `source` enum of workflow/schemas/study.schema.yaml
(tests/report/test_figure_kinds.py checks the two agree). Light on imports, as fedrepro.report.figure_kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

Problems = list[tuple[str, str]]  # (key under the table, "" for the table itself; what is wrong)


@dataclass(frozen=True)
class TableSource:
    """One source of a table's cells; see the module's docstring for what each part does."""

    cells_from: str | None
    check: Callable[[dict, dict], Problems]
    read: Callable[[dict, Path | None, Path | None], pd.DataFrame]  # (spec, cells' table, runs.csv) -> cells
    cell_problem: Callable[[dict, str], str | None] = lambda study, setting: None  # (study, setting)
    spec_extra: Callable[[dict, dict], dict] = lambda study, spec: {}  # (study, table spec) -> keys to add

    @property
    def has_runs(self) -> bool:
        """Whether training runs fill the cells (each of which the grid must produce)."""
        return self.cells_from is not None


def _read_runs(spec: dict, cells_csv: Path | None, runs_csv: Path | None) -> pd.DataFrame:
    """The aggregated tables, refused unless whole (their checksums) and holding every seed (the spec's
    ``seeds``, the study's; without them, some seed) of every run of its cells, with the derived metrics and
    each run's plateau changes (the pre-training curve's, for a fine-tuning cell)."""
    from fedrepro.report.convergence import add_plateau_changes
    from fedrepro.report.derived import add_derived
    from fedrepro.report.integrity import read_aggregate
    from fedrepro.study import table_runs

    cells, seeds = table_runs(spec), spec.get("seeds")
    summary = read_aggregate(cells_csv, cells, seeds)  # first: a missing seed is named in the cells' table
    runs = read_aggregate(runs_csv, cells, seeds)
    return add_plateau_changes(add_derived(spec, summary, runs), runs)


def table_metrics(table: dict) -> set[str]:
    """The metrics a table shows: its own and its columns' (the names a study file gives, before derivation)."""
    return {table["metric"], *(c["metric"] for c in table["columns"] if "metric" in c)}


# the numbers of a fine-tuning on the target (finetune.csv): after its last epoch, and its best epoch's
FINETUNE_METRICS = ("target_acc", "best_target_acc")


def _run_metric_problems(table: dict, from_finetune: bool) -> Problems:
    """A table of runs shows no simulated bound, and target metrics exactly when its runs are fine-tunings."""
    if table["metric"] == "bound":
        return [("metric", "the metric 'bound' exists only in a `source: simulation` table")]
    wrong = sorted(m for m in table_metrics(table) if (m in FINETUNE_METRICS) != from_finetune)
    if wrong:
        return [("", f"metric {wrong[0]!r} does not exist for `source: {table['source']}` (target_* metrics come "
                     "from fine-tuning, `source: finetune`; the others from pre-training)")]
    return []


def _no_target(study: dict, setting: str) -> str | None:
    if "target" in study["settings"][setting]:
        return None
    return f"setting {setting!r} has no `target` to fine-tune on"


def _kept_best(study: dict, spec: dict) -> dict:
    from fedrepro.study import run_training, table_runs

    return {"kept_best_runs": [[s, m] for s, m in table_runs(spec) if run_training(study, s, m).get("keep_best")]}


def _simulation_problems(study: dict, table: dict) -> Problems:
    if table["metric"] == "bound":
        return []
    return [("metric", "a `source: simulation` table shows the metric 'bound'")]


def _simulate(spec: dict, cells_csv: Path | None, runs_csv: Path | None) -> pd.DataFrame:
    from fedrepro.report.bound_simulation import simulate

    return simulate()


TABLE_SOURCES: dict[str, TableSource] = {
    # the pre-training runs
    "train": TableSource("summary.csv", lambda study, table: _run_metric_problems(table, from_finetune=False),
                         _read_runs),
    # their fine-tuning on each setting's target (FedGTST)
    "finetune": TableSource("finetune.csv", lambda study, table: _run_metric_problems(table, from_finetune=True),
                            _read_runs, cell_problem=_no_target, spec_extra=_kept_best),
    # FedDisco Table 6: computed by the table job itself (fedrepro.report.bound_simulation), no training runs
    "simulation": TableSource(None, _simulation_problems, _simulate),
}


def table_source(name: str) -> TableSource:
    if name not in TABLE_SOURCES:
        raise ValueError(f"unknown table source {name!r}; known: {sorted(TABLE_SOURCES)}")
    return TABLE_SOURCES[name]


def scored_source(metric: str) -> TableSource:
    """Where a tuning stage's runs are scored by ``metric`` (fedrepro.tuning): the fine-tuning on each setting's
    target for a target metric (FedGTST's number), the training runs otherwise, as a table's cells are."""
    return table_source("finetune" if metric in FINETUNE_METRICS else "train")


def table_spec(study: dict, name: str) -> dict:
    """What a table's job renders: the study file's table with row and column labels filled in (from the methods
    and settings; a computed table's rows and columns are no study methods or settings and carry their own) and
    the study's seeds (each cell's runs must have rows for every one)."""
    from fedrepro.study import label_of

    table = study["tables"][name]
    spec = {
        **table,
        "name": name,
        "seeds": list(study["seeds"]),
        "rows": [{"label": r["label"] if "label" in r else label_of(study, "methods", r["method"]), "paper": None,
                  **r} for r in table["rows"]],
        "columns": [{"label": c["label"] if "label" in c else label_of(study, "settings", c["setting"]),
                     "paper": None, **c} for c in table["columns"]],
    }
    return {**spec, **table_source(table["source"]).spec_extra(study, spec)}
