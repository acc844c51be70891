"""Render one table (Markdown, LaTeX, CSV) with the published numbers beside ours."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821


def first(files):
    # an input function's path arrives as a str, a list of paths as a Namedlist (empty: none, e.g. Table 6)
    return (files if isinstance(files, str) else files[0]) if files else None


pipeline.main_from_snakemake(
    sm, pipeline.table, spec=sm.params.spec, summary_csv=first(sm.input.summary), runs_csv=first(sm.input.runs),
    published_csv=first(sm.input.published),
    out_stem=sm.output.md[: -len(".md")], scale=sm.params.scale,
)
