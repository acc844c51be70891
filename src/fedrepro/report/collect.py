"""Collect the training engine's run folders into tidy data frames."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from pathlib import Path

import pandas as pd

from fedrepro.io import atomic_write_text, rerun_command

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
# Optional per-run round at which early stopping ended the run (TrainingConfig.early_stop): the column is there when
# any run of the table stopped early, empty for the others
STOPPED = "stopped_round"
# Optional per-run text of why a run diverged (summary.json's divergence.why: its round's loss and first non-finite
# quantity, fedrepro.sim.runs.Divergence): the column is there when any run recorded one, "" for the others
DIVERGED_BECAUSE = "diverged_because"
# summary.json's sha256 of its metrics.csv (train.write_run); runs recorded before it have none
METRICS_SHA256 = "metrics_sha256"
# how close a summary.json number must be to the one recomputed from metrics.csv: the file prints every float
# with repr, so the two agree to the last bits, up to the mean's summation order
AGREE_TOLERANCE = 1e-9


class RunDataError(ValueError):
    """A run folder's file exists but cannot be used; the message names the file."""


def _is_number_or_null(v: object) -> bool:
    # null: a class the test set lacks has no accuracy.
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _read_summary(path: Path, data: dict) -> dict:
    """summary.json's row of the summary table (``data``: the file's object, from ``_read_json``)."""
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
    stopped = data.get(STOPPED)
    if stopped is not None:
        if not isinstance(stopped, int) or isinstance(stopped, bool) or stopped < 1:
            raise RunDataError(f"run summary {path}: {STOPPED} {stopped!r} is not a round")
        row[STOPPED] = stopped
    divergence = data.get("divergence")
    if divergence is not None:
        if not isinstance(divergence, dict) or not isinstance(divergence.get("why"), str):
            raise RunDataError(f"run summary {path}: divergence is not an object with its text ('why')")
        row[DIVERGED_BECAUSE] = divergence["why"]
    machine = data.get("machine")
    if machine is not None:
        if not isinstance(machine, dict):
            raise RunDataError(f"run summary {path}: machine is not a JSON object")
        row |= {k: str(machine.get(k) or "") for k in MACHINE}
        if isa := machine.get("onednn_max_cpu_isa"):  # a capped kernel set (docs/measurements/kernel-sets.md)
            row["cpu_capability"] += f", oneDNN max ISA {isa}"
    return row


def _retrain(path: Path) -> str:
    # the train job's index: forcing it reruns the job, which trains again every seed whose run folder no longer
    # matches its finished marker (and only those), then everything after it
    return f"rerun its train job: {rerun_command(path.parent.parent / 'seeds.json')}"


def _read_metrics(path: Path, summary: dict) -> pd.DataFrame:
    """The run's metrics.csv, refused unless it is whole: the sha256 its summary.json recorded, a final newline
    (a cut mid-line still parses: bytes_down 2132 for 2132448), every line as wide as the header and every value
    a number (empty: none)."""
    if not path.is_file():
        raise FileNotFoundError(f"missing run metrics: {path}")
    try:
        data = path.read_bytes()
        text = data.decode()
    except (OSError, UnicodeDecodeError) as err:
        raise RunDataError(f"unreadable run metrics {path}: {err}") from err
    recorded = summary.get(METRICS_SHA256)
    if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
        raise RunDataError(f"run metrics {path} do not match the sha256 its summary.json recorded: cut or edited "
                           f"after the run; {_retrain(path)}")
    if not text.endswith("\n"):
        raise RunDataError(f"run metrics {path} end mid-line (no final newline): the file was cut; {_retrain(path)}")
    lines = list(csv.reader(io.StringIO(text)))
    for number, line in enumerate(lines[1:], start=2):
        if len(line) != len(lines[0]):
            raise RunDataError(f"run metrics {path}: line {number} has {len(line)} fields, the header "
                               f"{len(lines[0])}: the file was cut or damaged; {_retrain(path)}")
    try:
        df = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise RunDataError(f"unreadable run metrics {path}: {err}") from err
    missing = [c for c in METRIC_COLUMNS if c not in df.columns]
    if missing:
        raise RunDataError(f"run metrics {path} lacks columns {missing}")
    clash = [c for c in KEYS if c in df.columns]
    if clash:
        raise RunDataError(f"run metrics {path} has columns {clash} that collide with the run keys")
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]):  # every metric is a number, or empty
            word = df[col][pd.to_numeric(df[col], errors="coerce").isna() & df[col].notna()].iloc[0]
            raise RunDataError(f"run metrics {path}: column {col!r} holds {word!r}, not a number: the file was "
                               f"damaged; {_retrain(path)}")
    return df


def _check_rounds(path: Path, metrics: pd.DataFrame, summary: dict) -> None:
    """Every round the run evaluated has its row: each eval_every-th up to the round it ended at (its last,
    the round it diverged at, or the one early stopping ended it at: each is evaluated), and that one."""
    config = summary.get("config")
    training = config.get("training") if isinstance(config, dict) else None
    if not isinstance(training, dict) or not {"rounds", "eval_every"} <= training.keys():
        return  # a summary not written by train.write_run says nothing about its rounds
    end = summary["diverged_round"] or summary.get(STOPPED) or training["rounds"]
    every = training["eval_every"]
    expected = [*range(every, end + 1, every)] + ([end] if end % every else [])
    rounds = metrics["round"].tolist()
    if rounds != expected:
        lost = sorted(set(expected) - set(rounds))
        why = (f"rounds {lost[:5]}{' ...' if len(lost) > 5 else ''} are missing" if lost
               else f"its rounds are {rounds[:8]}{' ...' if len(rounds) > 8 else ''}")
        raise RunDataError(
            f"run metrics {path} have {len(rounds)} evaluation rows where its config (rounds {training['rounds']}, "
            f"eval_every {every}) and summary.json (status {summary['status']}, diverged_round "
            f"{summary['diverged_round']}, {STOPPED} {summary.get(STOPPED)}) call for {len(expected)}: "
            f"{why}; {_retrain(path)}")


def _agree(recorded: object, recomputed: float | None) -> bool:
    if recorded is None or recomputed is None:
        return recorded is None and recomputed is None
    if not _is_number_or_null(recorded):
        return False
    if math.isnan(recorded) or math.isnan(recomputed):
        return math.isnan(recorded) and math.isnan(recomputed)
    return math.isclose(recorded, recomputed, rel_tol=AGREE_TOLERANCE, abs_tol=AGREE_TOLERANCE)


def _check_summary_agrees(path: Path, metrics: pd.DataFrame, summary: dict) -> None:
    """summary.json's final, best and last-k accuracies are those of its metrics.csv (train.summarize)."""
    accs = [float(a) for a in metrics["test_acc"]]
    recomputed = {"final_acc": accs[-1] if accs else None, "best_acc": max(accs) if accs else None}
    if isinstance(summary["last_k"], int):
        last = accs[-summary["last_k"]:]
        recomputed["last_k_acc"] = sum(last) / len(last) if last else None
    for key, value in recomputed.items():
        if not _agree(summary[key], value):
            raise RunDataError(f"{path.parent / 'summary.json'} says {key} {summary[key]!r} but its metrics.csv "
                               f"({len(accs)} evaluation rows) gives {value!r}: one of them is not the run's; "
                               f"{_retrain(path)}")


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
    any run's summary.json has one, and the ``MACHINE`` columns when any has a machine block, "" for the
    runs without; ``diverged_because`` when any run diverged with its reason recorded, "" for the others;
    ``stopped_round`` when any run ended by early stopping, empty for the others). Raises
    FileNotFoundError / RunDataError naming the offending file.
    """
    frames: list[pd.DataFrame] = []
    rows: list[dict] = []
    seen: dict[tuple, Path] = {}
    for run_dir in map(Path, run_dirs):
        data = _read_json(run_dir / "summary.json", "run summary")
        summary = _read_summary(run_dir / "summary.json", data)
        metrics = _read_metrics(run_dir / "metrics.csv", data)
        _check_rounds(run_dir / "metrics.csv", metrics, data)
        _check_summary_agrees(run_dir / "metrics.csv", metrics, data)
        _check_path_matches(run_dir, summary)
        key = tuple(summary[k] for k in KEYS)
        if key in seen:
            raise RunDataError(f"run {key} appears twice: {seen[key]} and {run_dir}")
        seen[key] = run_dir
        rows.append(summary)
        frames.append(metrics.assign(**{k: summary[k] for k in KEYS}))

    has_per_class = any(PER_CLASS in row for row in rows)
    has_machine = any(MACHINE[0] in row for row in rows)
    has_stopped = any(STOPPED in row for row in rows)
    has_because = any(DIVERGED_BECAUSE in row for row in rows)
    optional = [PER_CLASS] * has_per_class + MACHINE * has_machine + [DIVERGED_BECAUSE] * has_because
    summary_df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS + optional + [STOPPED] * has_stopped)
    summary_df[optional] = summary_df[optional].fillna("").astype(str)
    summary_df = summary_df.astype({"seed": "int64", "diverged_round": "Int64", "last_k": "Int64",
                                    **({STOPPED: "Int64"} if has_stopped else {})})
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
        data = _read_json(path, "fine-tuning record")
        missing = [k for k in [*FINETUNE_COLUMNS, "curve"] if k not in data]
        if missing:
            raise RunDataError(f"fine-tuning record {path} lacks keys {missing}")
        if data["status"] not in STATUSES:
            raise RunDataError(f"fine-tuning record {path}: status {data['status']!r} not in {sorted(STATUSES)}")
        _check_finetune_curve(path, data)
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


def _refinetune(path: Path) -> str:
    return f"fine-tune again: {rerun_command(path.parent / 'seeds.json')}"


def _check_finetune_curve(path: Path, data: dict) -> None:
    """A fine-tuned run's curve has every epoch its config asks for, and its target accuracies are the curve's
    (finetune.finetune_job); a diverged pre-training was not fine-tuned: no curve."""
    curve = data["curve"]
    if data["status"] == "diverged":
        if curve:
            raise RunDataError(f"fine-tuning record {path}: status diverged (not fine-tuned) but it has a curve; "
                               f"{_refinetune(path)}")
        return
    config = data.get("config")
    epochs = config.get("epochs") if isinstance(config, dict) else None
    got = [row.get("epoch") if isinstance(row, dict) else None for row in curve]
    if not curve or (epochs is not None and got != list(range(1, epochs + 1))):
        raise RunDataError(f"fine-tuning record {path}: its curve has epochs {got[:8]}{' ...' if len(got) > 8 else ''}"
                           f", its config asks for {epochs}; {_refinetune(path)}")
    accs = [row.get("test_acc") for row in curve]
    if not all(a is not None and _is_number_or_null(a) for a in accs):
        raise RunDataError(f"fine-tuning record {path}: a curve test_acc is not a number")
    for key, value in (("target_acc", accs[-1]), ("best_target_acc", max(accs))):
        if not _agree(data[key], value):
            raise RunDataError(f"fine-tuning record {path} says {key} {data[key]!r} but its curve gives {value!r}; "
                               f"{_refinetune(path)}")


def _read_json(path: Path, what: str) -> dict:
    """The JSON object in ``path``, ``what`` naming it in errors (a run summary, a fine-tuning record)."""
    if not path.is_file():
        raise FileNotFoundError(f"missing {what}: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDataError(f"unreadable {what} {path}: {err}") from err
    if not isinstance(data, dict):
        raise RunDataError(f"{what} {path} is not a JSON object")
    return data
