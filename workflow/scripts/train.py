"""Train one method x setting, every seed of the study."""

import sys
import time

STARTED = time.perf_counter()  # before torch's import: the job's wall seconds, recorded in its index

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.train, spec=sm.params.spec, data=sm.input.data, partitions=list(sm.input.partitions),
    seeds=list(sm.params.seeds), index=sm.output[0], checkpoint_dir=sm.params.checkpoint_dir,
    device=sm.params.device, engine=sm.params.engine, threads=sm.threads, started=STARTED,
    keep_checkpoints=sm.params.keep_checkpoints, keep_model=sm.params.keep_model,
    tuned={tuple(key.split("/", 1)): path for key, path in sm.params.tuned.items()},
)
