"""The engine tests' small training configuration and run."""

from __future__ import annotations

from functools import partial

from fedrepro.sim.sync import TrainingConfig
from support.common import sync_run

CFG = TrainingConfig(rounds=3, local_epochs=2, batch_size=16, lr=0.05, momentum=0.5, weight_decay=1e-4,
                     eval_every=1, checkpoint_every=1)


make_run = partial(sync_run, cfg=CFG, model="cnn4")
