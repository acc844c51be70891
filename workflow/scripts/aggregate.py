"""Collect every run of a study into runs.csv and summary.csv."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.aggregate, indexes=list(sm.input), runs_csv=sm.output.runs, summary_csv=sm.output.summary
)
