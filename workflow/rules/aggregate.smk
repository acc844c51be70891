# Aggregation: every run of a study into one tidy table (one row per run and evaluation round).


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
    log:
        f"{RES}/{{study}}/logs/aggregate.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"
