"""Run folders laid out like the training engine's, written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

STUDY = "feddisco"


def make_run(
    root: Path,
    setting: str,
    method: str,
    seed: int,
    accs: list[float],
    status: str = "complete",
    diverged_round: int | None = None,
    study: str = STUDY,
) -> Path:
    """Write a fake run folder laid out like the training engine's."""
    run_dir = root / study / "runs" / setting / method / f"seed{seed}"
    run_dir.mkdir(parents=True)
    n = len(accs)
    metrics = pd.DataFrame(
        {
            "round": range(1, n + 1),
            "test_acc": accs,
            "test_loss": [2.0 - a / 100 for a in accs],
            "train_loss": [1.5 - a / 100 for a in accs],
            "bytes_up": [1000 * r for r in range(1, n + 1)],
            "bytes_down": [2000 * r for r in range(1, n + 1)],
            "seconds": [0.5 * r for r in range(1, n + 1)],
            "lr": [0.01] * n,  # an extra column the collector must keep
        }
    )
    metrics.to_csv(run_dir / "metrics.csv", index=False)
    summary = {
        "study": study,
        "setting": setting,
        "method": method,
        "seed": seed,
        "status": status,
        "diverged_round": diverged_round,
        "rounds": n,
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "last_k_acc": sum(accs[-2:]) / 2,
        "last_k": 2,
        "seconds": 0.5 * n,
        "config": {"lr": 0.01},
        "versions": {"torch": "x"},
        "device": "cpu",
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir
