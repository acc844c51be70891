"""Download one pretrained weights file (sha256 prefix verified)."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402
from fedrepro.data.weights import download_step  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(sm, download_step, name=sm.wildcards.weights, out=sm.output[0], mirror=sm.params.mirror)
