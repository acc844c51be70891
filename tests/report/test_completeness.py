"""Issue #24: what flows on from a run is whole. The aggregation refuses a damaged or short metrics.csv and a
summary.json that disagrees with it; runs.csv and summary.csv carry their sha256, and tables, figures and the
scorecard refuse them cut, or without rows for a run or seed they show. Diverged and early-stopped runs pass."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedrepro import pipeline, train
from fedrepro.report.collect import RunDataError, collect_finetune, collect_runs
from fedrepro.report.integrity import AggregateError
from fedrepro.sim.runs import RunResult

SEEDS = [0, 1]
METHODS = ["fedavg", "fedprox"]


def write_run(root: Path, method: str, seed: int, rounds: int = 6, eval_every: int = 1,
              ended: dict | None = None) -> Path:
    """A run folder as a train job writes it (train.write_run); ``ended``: RunResult fields of a run that ended
    early (diverged_round, stopped_round), which evaluated up to that round."""
    ended = ended or {}
    last = ended.get("diverged_round") or ended.get("stopped_round") or rounds
    evaluated = sorted({*range(eval_every, last + 1, eval_every), last})
    history = [{"round": r, "test_acc": 40.0 + r + seed / 3, "test_loss": 1.0 / r, "train_loss": 2.0 / r,
                "bytes_up": 2132448 * r, "bytes_down": 2132448 * r, "seconds": 0.25 * r} for r in evaluated]
    spec = {"study": "s", "setting": "iid", "method": method,
            "training": {"rounds": rounds, "eval_every": eval_every, "last_k": 2}}
    out = root / "runs" / "iid" / method / f"seed{seed}"
    train.write_run(out, spec, seed, RunResult(history=history, **ended), torch.device("cpu"))
    return out


def aggregate(root: Path, methods: list[str] = METHODS, seeds: list[int] = SEEDS) -> tuple[Path, Path]:
    """Train-job indexes of every method (its seeds' run folders, written here) aggregated into runs.csv,
    summary.csv."""
    indexes = []
    for method in methods:
        runs = [{"seed": s, "dir": write_run(root, method, s).name, "status": "complete"} for s in seeds]
        index = root / "runs" / "iid" / method / "seeds.json"
        index.write_text(json.dumps({"runs": runs}))
        indexes.append(index)
    pipeline.aggregate(indexes, root / "runs.csv", root / "summary.csv", log=lambda _: None)
    return root / "runs.csv", root / "summary.csv"


def without_sha(run: Path) -> None:
    """The run's summary.json as runs recorded it before summaries held their metrics' sha256."""
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("metrics_sha256", None)
    (run / "summary.json").write_text(json.dumps(summary))


TABLE = {"name": "t", "caption": "T", "paper_table": None, "metric": "final_acc", "claims": [], "seeds": SEEDS,
         "rows": [{"method": m, "label": m} for m in METHODS], "columns": [{"setting": "iid", "label": "IID"}]}
CURVE = {"name": "curves", "kind": "curve", "caption": "C", "seeds": SEEDS,
         "drawn_runs": [["iid", m] for m in METHODS], "settings": [{"setting": "iid", "label": "IID"}],
         "methods": [{"method": m, "label": m} for m in METHODS]}


def consumers(root: Path, runs_csv: Path, summary_csv: Path) -> dict:
    """Each reader of the aggregated tables, as the workflow calls it."""
    log = lambda _: None  # noqa: E731
    return {
        "table": lambda: pipeline.table(TABLE, summary_csv, runs_csv, None, root / "tables" / "t", "embedded", log),
        "figure": lambda: pipeline.figure(CURVE, [runs_csv, summary_csv], root / "curves", log),
        "scorecard": lambda: pipeline.scorecard([{"study": "s", "spec": TABLE}], [root / "tables" / "t.csv"],
                                                "embedded", root / "sc.md", root / "sc.html", log,
                                                runs={"s": [runs_csv, summary_csv]}),
    }


# ---------------------------------------------------------------- metrics.csv into the aggregation


@pytest.mark.parametrize("sha", [True, False], ids=["summary-has-sha256", "older-summary"])
def test_a_metrics_file_cut_to_half_its_rows_is_refused(tmp_path: Path, sha: bool) -> None:
    run = write_run(tmp_path, "fedavg", 0)
    if not sha:
        without_sha(run)
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text("".join(lines[:4]))  # the header and 3 of the 6 rows
    why = "do not match the sha256" if sha else r"3 evaluation rows .* call for 6: rounds \[4, 5, 6\] are missing"
    with pytest.raises(RunDataError, match=rf"{re.escape(str(run / 'metrics.csv'))}.*{why}"):
        collect_runs([run])


@pytest.mark.parametrize(("damage", "why"), [
    (lambda text: text[: text.rindex("2132448") + 4], "end mid-line"),  # bytes_down 2132 for 2132448
    (lambda text: text.replace("\n", "\n2,40.5\n", 1), "line 2 has 2 fields, the header 9"),
    (lambda text: text.replace("2132448", "21x2448", 1), "column 'bytes_up' holds '21x2448', not a number"),
], ids=["cut-mid-line", "short-line", "not-a-number"])
def test_a_metrics_file_damaged_mid_line_is_refused(tmp_path: Path, damage, why: str) -> None:
    run = write_run(tmp_path, "fedavg", 0)
    without_sha(run)  # the checks that hold without the sha256 (that one refuses any change)
    (run / "metrics.csv").write_text(damage((run / "metrics.csv").read_text()))
    with pytest.raises(RunDataError, match=rf"{re.escape(str(run / 'metrics.csv'))}.*{why}"):
        collect_runs([run])


def test_a_summary_disagreeing_with_its_metrics_is_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path, "fedavg", 0)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "best_acc": summary["best_acc"] + 1.0}))
    with pytest.raises(RunDataError, match=rf"{re.escape(str(run / 'summary.json'))} says best_acc 47.0 but its "
                                           "metrics.csv"):
        collect_runs([run])


def test_diverged_early_stopped_and_sparsely_evaluated_runs_still_aggregate_with_a_checksum(tmp_path: Path) -> None:
    runs = [write_run(tmp_path, "fedavg", 0, ended={"status": "diverged", "diverged_round": 3}),
            write_run(tmp_path, "fedavg", 1, rounds=10, eval_every=4, ended={"stopped_round": 8}),
            write_run(tmp_path, "fedprox", 0, rounds=10, eval_every=4),  # rounds 4, 8 and the last, 10
            write_run(tmp_path, "fedprox", 1, rounds=10, eval_every=4, ended={"status": "diverged",
                                                                              "diverged_round": 5})]
    index = tmp_path / "seeds.json"
    index.write_text(json.dumps({"runs": [{"dir": str(r.relative_to(tmp_path))} for r in runs]}))
    pipeline.aggregate([index], tmp_path / "runs.csv", tmp_path / "summary.csv", log=lambda _: None)
    frame = pd.read_csv(tmp_path / "runs.csv")
    assert frame.groupby(["method", "seed"])["round"].apply(list).tolist() == [[1, 2, 3], [4, 8], [4, 8, 10], [4, 5]]
    assert (tmp_path / "runs.csv.sha256").read_text().endswith("  runs.csv\n")
    # the round early stopping ended a run at is carried, empty for the others (the scorecard names those runs)
    stops = pd.read_csv(tmp_path / "summary.csv").set_index(["method", "seed"])["stopped_round"]
    assert stops[("fedavg", 1)] == 8 and stops.drop(("fedavg", 1)).isna().all()
    assert "stopped_round" not in collect_runs([runs[0], runs[2]])[1].columns  # none stopped early: no column
    # the tables take them: a diverged seed has rows and a status
    pipeline.table(TABLE, tmp_path / "summary.csv", tmp_path / "runs.csv", None, tmp_path / "t", "embedded",
                   log=lambda _: None)
    assert pd.read_csv(tmp_path / "t.csv")["status"].tolist() == ["partial", "partial"]


def test_a_fine_tuning_record_short_of_epochs_is_refused(tmp_path: Path) -> None:
    curve = [{"epoch": e, "test_acc": 50.0 + e} for e in (1, 2)]
    record = {"study": "s", "setting": "iid", "method": "fedavg", "seed": 0, "status": "complete",
              "diverged_round": None, "target_acc": 52.0, "best_target_acc": 52.0, "config": {"epochs": 3},
              "curve": curve}
    (tmp_path / "seed0.json").write_text(json.dumps(record))
    with pytest.raises(RunDataError, match=r"seed0.json: its curve has epochs \[1, 2\], its config asks for 3"):
        collect_finetune([tmp_path / "seed0.json"])


# ---------------------------------------------------------------- runs.csv into tables, figures, scorecard


def test_a_truncated_runs_csv_is_refused_by_tables_figures_and_the_scorecard(tmp_path: Path) -> None:
    runs_csv, summary_csv = aggregate(tmp_path)
    readers = consumers(tmp_path, runs_csv, summary_csv)
    readers["table"]()  # whole: fine, and it writes the cells the scorecard reads
    lines = runs_csv.read_text().splitlines(keepends=True)
    runs_csv.write_text("".join(lines[: len(lines) // 2]))  # fedprox gone, as the tester found
    for read in readers.values():
        with pytest.raises(AggregateError, match=rf"{re.escape(str(runs_csv))} does not match the sha256 .* "
                                                 rf"`snakemake --forcerun {re.escape(str(runs_csv))}`"):
            read()


def test_a_grid_run_or_seed_without_rows_is_refused(tmp_path: Path) -> None:
    full = aggregate(tmp_path / "full")  # the cells the scorecard reads, from every run
    pipeline.table(TABLE, full[1], full[0], None, tmp_path / "tables" / "t", "embedded", log=lambda _: None)
    runs_csv, summary_csv = aggregate(tmp_path, methods=["fedavg"])  # checksums fine, fedprox never aggregated
    for read in consumers(tmp_path, runs_csv, summary_csv).values():
        with pytest.raises(AggregateError, match=r"has no rows for 2 run\(s\) .*: fedprox on iid seed 0, fedprox "
                                                 r"on iid seed 1"):
            read()
    runs_csv, summary_csv = aggregate(tmp_path / "one-seed", seeds=[0])  # a seed of the study missing
    with pytest.raises(AggregateError, match=rf"{re.escape(str(summary_csv))} has no rows .*: fedavg on iid seed 1"):
        consumers(tmp_path, runs_csv, summary_csv)["table"]()
