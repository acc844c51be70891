# fedrepro: regenerate four federated-learning papers' tables and figures end to end.
# Thin on purpose: the stages live in workflow/rules, the logic in src/fedrepro.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# names in paths are plain identifiers (method and setting names may hold the "." of a swept value),
# so no wildcard can swallow a "/"; the config check refuses any other name (fedrepro.config.NAME_PATTERNS)
wildcard_constraints:
    study=NAME_PATTERNS["studies"],
    setting=NAME_PATTERNS["settings"],
    method=NAME_PATTERNS["methods"],
    dataset=r"[A-Za-z0-9_\-]+",
    table=NAME_PATTERNS["tables"],
    figure=NAME_PATTERNS["figures"],
    stage=r"[A-Za-z0-9_]+",
    seed=r"\d+",


include: "workflow/rules/data.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        artifacts(),
    default_target: True
