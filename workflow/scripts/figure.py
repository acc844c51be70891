"""Render one figure (PNG and PDF)."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.figure, spec=sm.params.spec, inputs=list(sm.input), out_stem=sm.output.png[: -len(".png")]
)
