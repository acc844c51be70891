"""Collect the training engine's run folders into tidy data frames."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from fedrepro.io import atomic_write_text

KEYS = ["study", "setting", "method", "seed"]
METRIC_COLUMNS = ["round", "test_acc", "test_loss", "train_loss", "bytes_up", "bytes_down", "seconds"]
SUMMARY_COLUMNS = [
    *KEYS,
    "status",
    "diverged_round",
    "final_acc",
    "best_acc",
    "last_k_acc",
    "last_k",
    "seconds",
]
STATUSES = {"complete", "diverged"}
# Optional per-run list (test accuracy per class, percent), carried as a JSON string; "" when absent.
PER_CLASS = "per_class_acc"
# Optional per-run keys of summary.json's "machine" block (fedrepro.train.machine): which CPU, and which of
# torch's CPU kernels, produced the run; "" for the runs recorded without one.
MACHINE = ["cpu", "cpu_capability"]


class RunDataError(ValueError):
    """A run folder's file exists but cannot be used; the message names the file."""


def _is_number_or_null(v: object) -> bool:
    # null: a class the test set lacks has no accuracy.
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _read_summary(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"missing run summary: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDataError(f"unreadable run summary {path}: {err}") from err
    if not isinstance(data, dict):
        raise RunDataError(f"run summary {path} is not a JSON object")
    missing = [k for k in SUMMARY_COLUMNS if k not in data]
    if missing:
        raise RunDataError(f"run summary {path} lacks keys {missing}")
    if data["status"] not in STATUSES:
        raise RunDataError(f"run summary {path}: status {data['status']!r} not in {sorted(STATUSES)}")
    row = {k: data[k] for k in SUMMARY_COLUMNS}
    per_class = data.get(PER_CLASS)
    if per_class is not None:
        if not isinstance(per_class, list) or not all(_is_number_or_null(v) for v in per_class):
            raise RunDataError(f"run summary {path}: {PER_CLASS} is not a list of numbers")
        row[PER_CLASS] = json.dumps(per_class)
    machine = data.get("machine")
    if machine is not None:
        if not isinstance(machine, dict):
            raise RunDataError(f"run summary {path}: machine is not a JSON object")
        row |= {k: str(machine.get(k) or "") for k in MACHINE}
    return row


def _read_metrics(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"missing run metrics: {path}")
    try:
        df = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise RunDataError(f"unreadable run metrics {path}: {err}") from err
    missing = [c for c in METRIC_COLUMNS if c not in df.columns]
    if missing:
        raise RunDataError(f"run metrics {path} lacks columns {missing}")
    clash = [c for c in KEYS if c in df.columns]
    if clash:
        raise RunDataError(f"run metrics {path} has columns {clash} that collide with the run keys")
    return df


def _check_path_matches(run_dir: Path, summary: dict) -> None:
    # A folder copied or renamed by hand would otherwise be counted under the wrong key silently.
    m = re.fullmatch(r"seed(\d+)", run_dir.name)
    if not m or run_dir.parent.parent.parent.name != "runs":
        return
    from_path = (run_dir.parent.parent.name, run_dir.parent.name, int(m.group(1)))
    from_json = (str(summary["setting"]), str(summary["method"]), int(summary["seed"]))
    if from_path != from_json:
        raise RunDataError(
            f"{run_dir / 'summary.json'} says setting/method/seed {from_json} but its folder says {from_path}"
        )


def collect_runs(run_dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read run folders into (runs, summary).

    runs: one row per run and evaluation round (run keys + every metrics.csv column);
    summary: one row per run (``SUMMARY_COLUMNS``, plus ``per_class_acc`` as a JSON list string when
    any run's summary.json has one, and the ``MACHINE`` columns when any has a machine block; "" for the
    runs without). Raises FileNotFoundError / RunDataError naming the offending file.
    """
    frames: list[pd.DataFrame] = []
    rows: list[dict] = []
    seen: dict[tuple, Path] = {}
    for run_dir in map(Path, run_dirs):
        summary = _read_summary(run_dir / "summary.json")
        metrics = _read_metrics(run_dir / "metrics.csv")
        _check_path_matches(run_dir, summary)
        key = tuple(summary[k] for k in KEYS)
        if key in seen:
            raise RunDataError(f"run {key} appears twice: {seen[key]} and {run_dir}")
        seen[key] = run_dir
        rows.append(summary)
        frames.append(metrics.assign(**{k: summary[k] for k in KEYS}))

    has_per_class = any(PER_CLASS in row for row in rows)
    has_machine = any(MACHINE[0] in row for row in rows)
    optional = [PER_CLASS] * has_per_class + MACHINE * has_machine
    summary_df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS + optional)
    summary_df[optional] = summary_df[optional].fillna("").astype(str)
    summary_df = summary_df.astype({"seed": "int64", "diverged_round": "Int64", "last_k": "Int64"})
    for col in ("final_acc", "best_acc", "last_k_acc", "seconds"):
        summary_df[col] = pd.to_numeric(summary_df[col], errors="coerce").astype("float64")
    summary_df = summary_df.sort_values(KEYS, kind="stable").reset_index(drop=True)

    if frames:
        runs = pd.concat(frames, ignore_index=True)
        extra = [c for c in runs.columns if c not in KEYS and c not in METRIC_COLUMNS]
        runs = runs[KEYS + METRIC_COLUMNS + extra].astype({"seed": "int64", "round": "int64"})
        runs = runs.sort_values([*KEYS, "round"], kind="stable").reset_index(drop=True)
    else:
        runs = pd.DataFrame(columns=KEYS + METRIC_COLUMNS)
    return runs, summary_df


def write_text_atomic(text: str, path: Path) -> None:
    """Write text so readers (and Snakemake) never see a half-written file."""
    atomic_write_text(path, text)


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` as CSV (no index) via a temp file in the same folder and os.replace."""
    write_text_atomic(df.to_csv(index=False, lineterminator="\n"), path)


FINETUNE_COLUMNS = [*KEYS, "status", "diverged_round", "target_acc", "best_target_acc"]
CURVE_COLUMNS = [*KEYS, "epoch", "train_acc", "train_loss", "test_acc", "test_loss"]


def collect_finetune(files: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read fine-tuning records (finetune/{setting}/{method}/seed{N}.json) into (summary, curves):
    one row per run (``FINETUNE_COLUMNS``) and one per run and fine-tuning epoch (``CURVE_COLUMNS``)."""
    rows, curves, seen = [], [], {}
    for path in map(Path, files):
        data = _read_json(path)
        missing = [k for k in [*FINETUNE_COLUMNS, "curve"] if k not in data]
        if missing:
            raise RunDataError(f"fine-tuning record {path} lacks keys {missing}")
        if data["status"] not in STATUSES:
            raise RunDataError(f"fine-tuning record {path}: status {data['status']!r} not in {sorted(STATUSES)}")
        key = tuple(data[k] for k in KEYS)
        if key in seen:
            raise RunDataError(f"fine-tuned run {key} appears twice: {seen[key]} and {path}")
        seen[key] = path
        rows.append({k: data[k] for k in FINETUNE_COLUMNS})
        curves += [{**{k: data[k] for k in KEYS}, **{c: r.get(c) for c in CURVE_COLUMNS[len(KEYS):]}}
                   for r in data["curve"]]
    summary = pd.DataFrame(rows, columns=FINETUNE_COLUMNS).astype({"seed": "int64", "diverged_round": "Int64"})
    for col in ("target_acc", "best_target_acc"):
        summary[col] = pd.to_numeric(summary[col], errors="coerce").astype("float64")
    curve_df = pd.DataFrame(curves, columns=CURVE_COLUMNS).astype({"seed": "int64", "epoch": "int64"})
    return (summary.sort_values(KEYS, kind="stable").reset_index(drop=True),
            curve_df.sort_values([*KEYS, "epoch"], kind="stable").reset_index(drop=True))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"missing fine-tuning record: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDataError(f"unreadable fine-tuning record {path}: {err}") from err
    if not isinstance(data, dict):
        raise RunDataError(f"fine-tuning record {path} is not a JSON object")
    return data
