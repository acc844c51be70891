# Fine-tuning on the target domain (FedGTST): one job per transferred method x setting, every seed inside,
# starting from the final pre-trained parameters the train job keeps in its checkpoint directory,
# seed{N}.model.pt (read, not declared: they are the train job's working files; its seeds.json is written
# after the last one). Each seed writes finetune/{setting}/{method}/seed{N}.json (target accuracy per
# fine-tuning epoch and final); seeds.json lists them and is written last.


localrules:
    aggregate_finetune,


rule finetune:
    input:
        runs=f"{RES}/{{study}}/runs/{{setting}}/{{method}}/seeds.json",
        source=lambda w: f"{DATA}/{setting_of(w)['dataset']}.npz",
        target=lambda w: f"{DATA}/{setting_of(w)['target']['dataset']}.npz",
        checksums=lambda w: [f"{DATA}/{setting_of(w)['dataset']}.npz.sha256",
                             f"{DATA}/{setting_of(w)['target']['dataset']}.npz.sha256"],
        # the choices its pre-training trained with: they name the folder of the models it kept
        tuned=lambda w: list(tuned_choices(w).values()),
    output:
        f"{RES}/{{study}}/finetune/{{setting}}/{{method}}/seeds.json",
    params:
        spec=lambda w: finetune_spec(*run_of(w)),
        train_spec=lambda w: run_spec(*run_of(w)),
        tuned=tuned_choices,
        checkpoint_dir=checkpoint_dir,
        device=CFG["device"],
    threads: CFG["train_resources"]["threads"]
    resources:
        gpu=CFG["train_resources"]["gpu"],
        mem_mb=resource_of("mem_mb"),
        runtime=resource_of("runtime"),
    log:
        f"{RES}/{{study}}/logs/finetune/{{setting}}/{{method}}.log",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/finetune.py"


# Every fine-tuned run of a study: finetune.csv (one row per run; tables with `source: finetune`) and
# finetune_curves.csv (one row per run and epoch; figures of kind finetune_curve), each with its sha256 beside it.
rule aggregate_finetune:
    input:
        finetune_indexes,
    output:
        summary=f"{RES}/{{study}}/finetune.csv",
        curves=f"{RES}/{{study}}/finetune_curves.csv",
        summary_sha256=f"{RES}/{{study}}/finetune.csv.sha256",
        curves_sha256=f"{RES}/{{study}}/finetune_curves.csv.sha256",
    log:
        f"{RES}/{{study}}/logs/aggregate_finetune.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate_finetune.py"
