"""A study's aggregated tables (runs.csv, summary.csv, finetune.csv, finetune_curves.csv) as tables, figures and
the scorecard may trust them: the aggregation writes each with its sha256 in a file beside it (``<name>.sha256``,
in ``sha256sum`` format), and every reader checks that sum and that each run it shows has rows, so a cut or
edited table is refused by name instead of drawing fewer curves."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import pandas as pd

from fedrepro.io import atomic_write, checksum_path, recorded_checksums, rerun_command


class AggregateError(ValueError):
    """An aggregated table that cannot be used (cut, edited, or without rows for a run); the message names it."""


def _rebuild(path: Path) -> str:
    return f"aggregate the runs again: {rerun_command(path)}"


def write_checked_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Write ``df`` as CSV (no index) atomically with its sha256 beside it (fedrepro.io.atomic_write)."""
    data = df.to_csv(index=False, lineterminator="\n").encode()
    atomic_write(Path(path), lambda tmp: tmp.write_bytes(data), checksum=True)


def read_checked_csv(path: str | Path) -> pd.DataFrame:
    """The table ``path`` if its bytes match the sha256 written beside it; AggregateError naming it otherwise."""
    path = Path(path)
    data = path.read_bytes()
    sidecar = checksum_path(path)
    try:
        recorded = recorded_checksums(sidecar)
    except (OSError, UnicodeDecodeError):
        recorded = []
    if not recorded:
        raise AggregateError(f"{path}: its checksum file {sidecar} is missing or empty, so nothing says the table "
                             f"is whole; {_rebuild(path)}")
    if hashlib.sha256(data).hexdigest() not in recorded:
        raise AggregateError(f"{path} does not match the sha256 in {sidecar}: it was cut or edited after the "
                             f"aggregation wrote it; {_rebuild(path)}")
    return pd.read_csv(io.BytesIO(data))


def require_runs(df: pd.DataFrame, path: str | Path, runs: Iterable[Sequence] | None = None,
                 seeds: Iterable[int] | None = None, exempt: Collection[tuple[str, str, int]] = ()) -> None:
    """Refuse the table ``df`` (read from ``path``) unless every (setting, method) of ``runs`` (default: those
    it has) has rows for every seed of ``seeds`` or, without ``seeds``, for some seed; but for the (setting,
    method, seed) in ``exempt`` (a fine-tuning curve whose pre-training diverged has none). A diverged run has
    rows: it counts."""
    keys = df[["setting", "method", "seed"]].drop_duplicates()  # runs.csv: one row per run and round
    have = set(zip(keys["setting"].astype(str), keys["method"].astype(str), keys["seed"].astype(int), strict=True))
    pairs = {(s, m) for s, m, _ in have}
    runs = [(str(s), str(m)) for s, m in runs] if runs is not None else sorted(pairs)
    if seeds is None:
        excused = pairs | {(s, m) for s, m, _ in exempt}
        missing = [(s, m, None) for s, m in runs if (s, m) not in excused]
    else:
        missing = [(s, m, k) for s, m in runs for k in sorted({int(k) for k in seeds})
                   if (s, m, k) not in have and (s, m, k) not in exempt]
    if missing:
        named = ", ".join(f"{m} on {s}" + ("" if k is None else f" seed {k}") for s, m, k in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise AggregateError(f"{path} has no rows for {len(missing)} run(s) it should hold: {named}{more}; "
                             f"{_rebuild(path)}")


def read_aggregate(path: str | Path, runs: Iterable[Sequence] | None = None, seeds: Iterable[int] | None = None,
                   exempt: Collection[tuple[str, str, int]] = ()) -> pd.DataFrame:
    """``read_checked_csv`` and ``require_runs`` in one: the aggregated table ``path``, whole and holding every
    run of ``runs`` x ``seeds``."""
    df = read_checked_csv(path)
    require_runs(df, path, runs, seeds, exempt)
    return df
