"""Render one table (Markdown, LaTeX, CSV) with the published numbers beside ours."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.table, spec=sm.params.spec, summary_csv=sm.input.summary or None, runs_csv=sm.input.runs or None,
    published_csv=sm.input.published[0] if sm.input.published else None,
    out_stem=sm.output.md[: -len(".md")], scale=sm.params.scale,
)
