"""Copy the showcase figure to docs/ and rewrite the README's showcase block."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.showcase, readme=sm.params.readme, figure_png=sm.input.figure, scorecard_md=sm.input.scorecard,
    study=sm.params.study, caption=sm.params.caption, figure_out=sm.output.figure, excerpt_out=sm.output.excerpt,
)
