"""Score every table against the published numbers and the papers' ranking claims."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.scorecard, tables=sm.params.tables, cell_csvs=list(sm.input.cells), scale=sm.params.scale,
    md_out=sm.output.md, html_out=sm.output.html, coverage=sm.params.coverage,
    runs={s: [sm.input[f"runs_{s}"], sm.input[f"summary_{s}"]] for s in sm.params.studies},
    papers=sm.params.papers, figures=sm.params.figures,
)
