"""Score a tuning stage's grid points and write the choice (fedrepro.tuning)."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(sm, pipeline.choose_tuning, stage=sm.params.stage, runs=sm.input.runs,
                             summary=sm.input.summary, out_json=sm.output.json, out_csv=sm.output.csv,
                             out_md=sm.output.md)
