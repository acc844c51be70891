# Tables and figures of each study, with the published numbers beside ours; the scorecard over all of
# them; the README's showcase. `snakemake --report results/report.html` collects every report() output.


localrules:
    table,
    figure,
    scorecard,
    showcase,


rule table:
    input:
        summary=table_summary,
        runs=table_runs,
        published=published_numbers,
    output:
        md=f"{RES}/{{study}}/tables/{{table}}.md",
        html=report(
            f"{RES}/{{study}}/tables/{{table}}.html",
            category="{study}",
            subcategory="tables",
            caption="../report/table.rst",
            labels=lambda w: {"table": f"{w.table}: {table_title(w.study, w.table)}"},
        ),
        tex=f"{RES}/{{study}}/tables/{{table}}.tex",
        csv=f"{RES}/{{study}}/tables/{{table}}.csv",
    params:
        spec=lambda w: table_spec(w.study, w.table),
        scale=CFG["scale"],
        caption=lambda w: table_caption(table_spec(w.study, w.table), CFG["scale"], RES),
    log:
        f"{RES}/{{study}}/logs/tables/{{table}}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/table.py"


rule figure:
    input:
        figure_inputs,
    output:
        png=report(
            f"{RES}/{{study}}/figures/{{figure}}.png",
            category="{study}",
            subcategory="figures",
            caption="../report/figure.rst",
            labels=lambda w: {"figure": f"{w.figure}: {figure_title(w.study, w.figure)}"},
        ),
        pdf=f"{RES}/{{study}}/figures/{{figure}}.pdf",
    params:
        spec=lambda w: figure_spec(w.study, w.figure),
        caption=lambda w: figure_caption(figure_spec(w.study, w.figure), CFG["scale"], RES),
    log:
        f"{RES}/{{study}}/logs/figures/{{figure}}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule scorecard:
    input:
        cells=scorecard_cells(),
        published=published_files(),
        **{f"runs_{s}": f"{RES}/{s}/runs.csv" for s in STUDIES},
        **{f"summary_{s}": f"{RES}/{s}/summary.csv" for s in STUDIES},
    output:
        md=f"{RES}/scorecard.md",
        html=report(
            f"{RES}/scorecard.html",
            category="scorecard",
            caption="../report/scorecard.rst",
            labels={"scorecard": "every study: cells regenerated, distance to the paper, ranking claims"},
        ),
    params:
        tables=scorecard_tables(),
        scale=CFG["scale"],
        coverage=scorecard_coverage(),
        studies=list(STUDIES),
        papers={s: spec["paper"] for s, spec in STUDIES.items()},
        figures=scorecard_figures(),
    log:
        f"{RES}/logs/scorecard.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/scorecard.py"


# Outputs in docs/ (tracked), plus the README block between its showcase markers (not an output: Snakemake
# would delete the README before the job). Only part of `all` when the config sets `showcase`.
rule showcase:
    input:
        figure=showcase_figure,
        scorecard=f"{RES}/scorecard.md",
    output:
        figure="docs/showcase/figure.png",
        excerpt="docs/showcase/scorecard.md",
    params:
        readme=lambda w: CFG["showcase"]["readme"],
        study=lambda w: CFG["showcase"]["study"],
        caption=lambda w: showcase_caption(),
    log:
        f"{RES}/logs/showcase.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/showcase.py"
