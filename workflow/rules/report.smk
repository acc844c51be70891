# Tables and figures of each study, with the published numbers beside ours.


localrules:
    table,
    figure,


rule table:
    input:
        summary=table_summary,
        runs=f"{RES}/{{study}}/runs.csv",
        published=published_numbers,
    output:
        md=report(
            f"{RES}/{{study}}/tables/{{table}}.md",
            category="{study}",
            subcategory="tables",
            caption="../report/table.rst",
        ),
        tex=f"{RES}/{{study}}/tables/{{table}}.tex",
        csv=f"{RES}/{{study}}/tables/{{table}}.csv",
    params:
        spec=lambda w: table_spec(w.study, w.table),
        scale=CFG["scale"],
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
        ),
        pdf=f"{RES}/{{study}}/figures/{{figure}}.pdf",
    params:
        spec=lambda w: figure_spec(w.study, w.figure),
    log:
        f"{RES}/{{study}}/logs/figures/{{figure}}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure.py"
