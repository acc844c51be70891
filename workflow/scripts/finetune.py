"""Fine-tune one method x setting on the setting's target data set, every seed."""

import sys

# rules may run in conda envs where fedrepro is not installed: use the checkout
sys.path.insert(0, f"{snakemake.scriptdir}/../../src")  # noqa: F821

from fedrepro import pipeline  # noqa: E402

sm = snakemake  # noqa: F821
pipeline.main_from_snakemake(
    sm, pipeline.finetune, spec=sm.params.spec, runs_index=sm.input.runs, source=sm.input.source,
    target=sm.input.target, checkpoint_dir=sm.params.checkpoint_dir, index=sm.output[0], device=sm.params.device,
    threads=sm.threads, train_spec=sm.params.train_spec,
    tuned={tuple(key.split("/", 1)): path for key, path in sm.params.tuned.items()},
)
