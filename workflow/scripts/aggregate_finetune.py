"""Collect every fine-tuned run of a study into finetune.csv and finetune_curves.csv."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.aggregate_finetune, indexes=list(sm.input), summary_csv=sm.output.summary,
    curves_csv=sm.output.curves,
)
