# Client partitions: one file per setting and seed, deterministic from the seed.


rule partition:
    input:
        lambda w: f"{DATA}/{setting_of(w)['dataset']}.npz",
    output:
        npz=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.npz",
        stats=f"{RES}/{{study}}/partitions/{{setting}}/seed{{seed}}.json",
    params:
        spec=lambda w: setting_of(w)["partition"],
    log:
        f"{RES}/{{study}}/logs/partition/{{setting}}/seed{{seed}}.log",
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/partition.py"
