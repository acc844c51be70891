"""Where the time of a pipeline run went: process start-up and data loading vs training, per study.

    python benchmarks/pipeline_split.py [results]

Reads what a run leaves behind: each train job's wall seconds (``job_seconds`` in its seeds.json) and the
seconds its seeds spent in the round loop (summary.json: training and per-round evaluation). The rest of
a job is start-up (Python, torch import, the Snakemake script preamble) and loading data and partitions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    print(f"{'study':12s} {'train jobs':>10s} {'job wall s':>11s} {'training s':>11s} {'start-up+data s':>16s}")
    for study in sorted(p for p in results.iterdir() if (p / "runs").is_dir()):
        wall = train = 0.0
        jobs = 0
        for index in sorted((study / "runs").glob("*/*/seeds.json")):
            job = json.loads(index.read_text())
            if "job_seconds" not in job:  # written by a job run outside Snakemake
                continue
            wall += job["job_seconds"]
            jobs += 1
            for run in job["runs"]:
                train += json.loads((index.parent / run["dir"] / "summary.json").read_text())["seconds"] or 0.0
        print(f"{study.name:12s} {jobs:10d} {wall:11.1f} {train:11.1f} {wall - train:16.1f}")


if __name__ == "__main__":
    main()
