"""The papers' published numbers (config/paper/<paper>.csv)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

COLUMNS = ["paper", "table", "row", "column", "mean", "std", "unit"]
_KEY = ["paper", "table", "row", "column"]
# How many trials each paper's printed mean ± sd is over, as its text says: FedDisco "mean ± std on 5 trials"
# (Table 1), FedGTST "averaged over three runs", FedL2G "three trials", Feddle "repeated three times with
# different random seeds". The standard error of a published difference needs it.
TRIALS = {"feddisco": 5, "fedgtst": 3, "fedl2g": 3, "feddle": 3}
# published tables whose ± is no spread over trials: FedDisco Table 10's is the sd over a run's last 10 rounds
SD_NOT_OVER_TRIALS = {("feddisco", "Table 10")}


def load_published(path: Path) -> pd.DataFrame:
    """Load one paper's published cells; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"missing published-numbers file: {path}")
    try:
        df = pd.read_csv(
            path,
            dtype={c: str for c in _KEY + ["unit"]},
            keep_default_na=False,
            na_values={"mean": [""], "std": [""]},
        )
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"unreadable published-numbers file {path}: {err}") from err
    if list(df.columns) != COLUMNS:
        raise ValueError(f"{path}: header {list(df.columns)} != {COLUMNS}")
    for col in ("mean", "std"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    if df["mean"].isna().any():
        raise ValueError(f"{path}: rows {list(df.index[df['mean'].isna()] + 2)} have no numeric mean")
    dup = df.duplicated(_KEY, keep=False)
    if dup.any():
        raise ValueError(f"{path}: duplicated cells on lines {list(df.index[dup] + 2)}")
    return df


def lookup(
    published: pd.DataFrame, table: str, row: str, column: str, *, percent: bool = True
) -> tuple[float, float | None] | None:
    """Return (mean, std or None) of one published cell, or None when the paper has no such cell.

    With ``percent`` (the default), cells printed as fractions (FedGTST Tables 4-5) are scaled to
    percent so they compare with the engine's test_acc.
    """
    hit = published[
        (published["table"] == table) & (published["row"] == row) & (published["column"] == column)
    ]
    if hit.empty:
        return None
    if len(hit) > 1:
        raise ValueError(f"published cell ({table!r}, {row!r}, {column!r}) is ambiguous: {len(hit)} papers")
    rec = hit.iloc[0]
    scale = 100.0 if percent and rec["unit"] == "fraction" else 1.0
    std = float(rec["std"])
    return float(rec["mean"]) * scale, (None if math.isnan(std) else std * scale)


def trials_behind_sd(paper: str | None, table: str | None) -> int | None:
    """The number of trials a published table's sds are over; None where the paper's is unknown or the table's
    ± is a spread over something else (then its sds say nothing of the noise between trials)."""
    if paper is None or (paper, table) in SD_NOT_OVER_TRIALS:
        return None
    return TRIALS.get(paper)
