"""Build the client partition of one setting and seed."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.partition, data=sm.input[0], spec=sm.params.spec, seeds=[int(sm.wildcards.seed)],
    outs=[sm.output.npz],
)
