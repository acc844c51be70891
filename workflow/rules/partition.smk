# Client partitions: one file per setting and seed, deterministic from the seed.


rule partition:
    input:
        lambda w: f"{DATA}/{setting_of(w)['dataset']}.npz",
        checksum=lambda w: f"{DATA}/{setting_of(w)['dataset']}.npz.sha256",
    output:
        npz=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.npz",
        stats=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.json",
        # declared, so a partition written before checksums existed is rebuilt, not refused (its content is the
        # same: finished seeds still match their markers and are skipped)
        npz_checksum=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.npz.sha256",
        stats_checksum=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.json.sha256",
    params:
        spec=lambda w: setting_of(w)["partition"],
    log:
        f"{RES}/{{study}}/logs/partition/{{setting}}/seed{{seed}}.log",
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/partition.py"
