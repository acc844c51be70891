"""Where the time of a pipeline run went: process start-up and data loading vs training, per study.

    python benchmarks/pipeline_split.py [results]

Reads what a run leaves behind: each train job's wall seconds (Snakemake's `benchmark:` file) and the
seconds its seeds spent in the round loop (summary.json: training and per-round evaluation). The rest of
a job is start-up (Python, torch import, the Snakemake script preamble) and loading data and partitions.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    print(f"{'study':12s} {'train jobs':>10s} {'job wall s':>11s} {'training s':>11s} {'start-up+data s':>16s}")
    for study in sorted(p for p in results.iterdir() if (p / "benchmarks" / "train").is_dir()):
        wall = train = 0.0
        jobs = 0
        for tsv in (study / "benchmarks" / "train").glob("*/*.tsv"):
            with open(tsv) as fh:
                wall += float(next(csv.DictReader(fh, delimiter="\t"))["s"])
            jobs += 1
            setting, method = tsv.parent.name, tsv.stem
            for summary in (study / "runs" / setting / method).glob("seed*/summary.json"):
                train += json.loads(summary.read_text())["seconds"] or 0.0
        print(f"{study.name:12s} {jobs:10d} {wall:11.1f} {train:11.1f} {wall - train:16.1f}")


if __name__ == "__main__":
    main()
