"""Download one data set's raw files (checksums verified)."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.download, dataset=sm.wildcards.dataset, raw_dir=sm.params.raw_dir, mirror=sm.params.mirror,
    local_dirs=list(sm.params.local_dirs), checksums=dict(sm.params.checksums),
)
