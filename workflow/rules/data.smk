# Data sets: download (network, so a localrule) and prepare to one common .npz per data set.


localrules:
    download_dataset,
    download_weights,


rule download_dataset:
    output:
        f"{DATA}/{{dataset}}/raw/MANIFEST.json",
    params:
        mirror=lambda w: CFG["mirrors"].get(w.dataset),
        # directories searched for the raw files before the network (e.g. a Debian dataset package's)
        local_dirs=lambda w: CFG["local_data_dirs"].get(w.dataset, []),
        # file name -> md5 or sha256 replacing the pinned one (config key checksums)
        checksums=lambda w: CFG["checksums"].get(w.dataset, {}),
        raw_dir=lambda w, output: str(Path(output[0]).parent),
    log:
        f"{DATA}/logs/download/{{dataset}}.log",
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/download.py"


rule prepare_dataset:
    input:
        manifest=lambda w: (
            [f"{DATA}/{w.dataset}/raw/MANIFEST.json"] if get_spec(w.dataset).needs_download else []
        ),
        parts=lambda w: [f"{DATA}/{name}.npz" for name in get_spec(w.dataset).built_from],
        parts_checksums=lambda w: [f"{DATA}/{name}.npz.sha256" for name in get_spec(w.dataset).built_from],
    output:
        f"{DATA}/{{dataset}}.npz",
        # declared, so a prepared file written before checksums existed is rebuilt, not refused
        checksum=f"{DATA}/{{dataset}}.npz.sha256",
    params:
        raw_dir=lambda w: f"{DATA}/{w.dataset}/raw" if get_spec(w.dataset).needs_download else None,
    log:
        f"{DATA}/logs/prepare/{{dataset}}.log",
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/prepare.py"


# Pretrained weights (Feddle's ImageNet ResNet18 and ViT-B/16): torchvision's files, named as torchvision names
# them (the name carries the sha256 prefix the download is checked against); only train jobs of such models ask.
rule download_weights:
    output:
        f"{WEIGHTS}/{{weights}}.pth",
    params:
        mirror=lambda w: CFG["mirrors"].get(w.weights),
    log:
        f"{WEIGHTS}/logs/{{weights}}.log",
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/download_weights.py"
