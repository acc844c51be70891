# Aggregation: every run of a study into one tidy table (one row per run and evaluation round), and one row per
# run; each with its sha256 beside it, which tables, figures and the scorecard check (fedrepro.report.integrity).


localrules:
    aggregate,


rule aggregate:
    input:
        lambda w: [
            f"{RES}/{w.study}/runs/{s}/{m}/seeds.json" for s, m in grid_runs(study_of(w))
        ],
    output:
        runs=f"{RES}/{{study}}/runs.csv",
        summary=f"{RES}/{{study}}/summary.csv",
        runs_sha256=f"{RES}/{{study}}/runs.csv.sha256",
        summary_sha256=f"{RES}/{{study}}/summary.csv.sha256",
    log:
        f"{RES}/{{study}}/logs/aggregate.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"
