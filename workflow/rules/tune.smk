# Tuning: each stage of a study's `tuning` runs its grid as a study of its own, <study>--tune-<stage> (partitions,
# train jobs and aggregation as any study's, on the tuning settings and seeds; fine-tuning too where the metric is a
# target_* one); choose_tuning scores every grid point by the study's metric over those runs and writes the choice
# that later stages and the study's own train jobs read (fedrepro.tuning), with every point's score as a table.


localrules:
    choose_tuning,


rule choose_tuning:
    input:
        runs=f"{RES}/{{study}}{TUNING_SEPARATOR}{{stage}}/runs.csv",
        # the scored runs: the training's summary.csv, or for a target_* metric the fine-tuning's finetune.csv
        summary=lambda w: f"{RES}/{w.study}{TUNING_SEPARATOR}{w.stage}/{tuning_scored(w)}",
        runs_sha256=f"{RES}/{{study}}{TUNING_SEPARATOR}{{stage}}/runs.csv.sha256",
        summary_sha256=lambda w: f"{RES}/{w.study}{TUNING_SEPARATOR}{w.stage}/{tuning_scored(w)}.sha256",
    output:
        json=f"{RES}/{{study}}/tuning/{{stage}}.json",
        csv=f"{RES}/{{study}}/tuning/{{stage}}.csv",
        md=report(
            f"{RES}/{{study}}/tuning/{{stage}}.md",
            category="{study}",
            subcategory="tuning",
            caption="../report/tuning.rst",
        ),
    params:
        stage=tuning_stage,
    log:
        f"{RES}/{{study}}/logs/tuning/{{stage}}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/choose_tuning.py"
