# Training: one job per method x setting (the GPU-resourced unit), every seed inside it.
# Each seed writes runs/{setting}/{method}/seed{N}/{metrics.csv,summary.json}; the job's declared output
# is the index of those folders, written last, so a failed job keeps its finished seeds and checkpoints.
# A finished seed leaves seed{N}.done.json in the checkpoint directory (its fingerprint, status and the
# sha256 of its run folder's files: a rerun of the job skips it while they match) and deletes its checkpoint
# unless `keep_checkpoints`; a seed that a fine-tuning job reads (a setting with a `target`) also keeps
# seed{N}.model.pt, its final parameters alone.
# A seed folder holding a finished run of another fingerprint (an edited config's earlier run) is moved
# aside to seed{N}.{fingerprint[:12]}/ with NOTE.json before the new run is written (train.set_aside).
# No `benchmark:` directive: its memory polling (psutil over /proc/<pid>/smaps twice a second in Snakemake's
# own process) took ~5% of a 2-core laptop; the index records the job's wall seconds instead.


rule train:
    input:
        data=lambda w: f"{DATA}/{setting_of(w)['dataset']}.npz",
        partitions=partition_files,
        # the checksums read back with them: a file written before checksums existed is rebuilt first
        checksums=lambda w: [
            f"{p}.sha256"
            for p in [f"{DATA}/{setting_of(w)['dataset']}.npz", *partition_files(w), *server_data_files(w)]
        ],
        server_data=server_data_files,
        weights=weights_files,
        # the choices of the tuning stages its runs train with: a changed choice trains them again
        tuned=lambda w: list(tuned_choices(w).values()),
    output:
        f"{RES}/{{study}}/runs/{{setting}}/{{method}}/seeds.json",
    params:
        spec=train_spec,
        seeds=seeds_of,
        checkpoint_dir=checkpoint_dir,
        device=CFG["device"],
        engine=CFG["engine"],
        keep_checkpoints=CFG["keep_checkpoints"],
        keep_model=lambda w: "target" in setting_of(w),
        tuned=tuned_choices,
    threads: CFG["train_resources"]["threads"]
    resources:
        gpu=CFG["train_resources"]["gpu"],
        mem_mb=resource_of("mem_mb"),
        runtime=resource_of("runtime"),
    log:
        f"{RES}/{{study}}/logs/train/{{setting}}/{{method}}.log",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/train.py"
