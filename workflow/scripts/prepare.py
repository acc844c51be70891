"""Prepare one data set into the common .npz format."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.prepare, dataset=sm.wildcards.dataset, out=sm.output[0], raw_dir=sm.params.raw_dir
)
