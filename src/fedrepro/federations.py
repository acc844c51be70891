"""The kinds of federation a study can run (its `federation` key), each with its method registry, the model
names its settings may use, the training keys it cannot honour (with why) and how the one train job
(fedrepro.train.train_job) builds a seed's run. All three run the same round loop (fedrepro.sim.loop): its early
stopping works in each; keep_best only where a model is handed on to what follows (sync: FedGTST's fine-tuning).

- ``sync``: one global model, synchronous rounds (fedrepro.sim.sync; FedDisco, FedGTST).
- ``hetero``: one model per client from a model group, nothing averaged unless a method says so
  (fedrepro.hetero; FedL2G). A setting's `model` names a group (fedrepro.models.groups.GROUPS).
- ``async``: clients report after a delay, the server merges when its method says (fedrepro.asyncfl; Feddle).

Registries are imported lazily: validating a config must not import torch-heavy modules it does not use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Federation:
    methods: str  # "module:attribute" of the name -> class registry
    hyperparameters: str  # "module:function" giving a method's hyper-parameters with defaults
    models: str  # "module:attribute" of the valid `model` names of a setting
    runs: str  # "module:function": (spec, data path, engine options) -> (build a seed's run, finish it)
    # training keys this federation cannot honour, with the only value it accepts and why
    fixed_training: tuple[tuple[str, Any, str], ...] = ()


FEDERATIONS: dict[str, Federation] = {
    "sync": Federation("fedrepro.algorithms:ALGORITHMS", "fedrepro.algorithms:hyperparameters",
                       "fedrepro.models:MODELS", "fedrepro.train:sync_runs"),
    "hetero": Federation(
        "fedrepro.hetero.methods:METHODS", "fedrepro.hetero.methods:hyperparameters",
        "fedrepro.models.groups:GROUPS", "fedrepro.hetero.job:hetero_runs",
        fixed_training=(("momentum", 0.0, "clients train with plain SGD, as HtFLlib's"),
                        ("weight_decay", 0.0, "clients train with plain SGD, as HtFLlib's"),
                        ("straggler_steps", None, "every client runs its local epochs"),
                        ("optimizer", "sgd", "clients train with plain SGD, as HtFLlib's"),
                        ("lr_decay_every", 0, "clients train at a constant learning rate, as HtFLlib's"),
                        ("keep_best", False, "no single model is handed on: every client keeps its own"))),
    "async": Federation("fedrepro.asyncfl.methods:METHODS", "fedrepro.asyncfl.methods:hyperparameters",
                        "fedrepro.models:MODELS", "fedrepro.asyncfl.job:async_runs",
                        fixed_training=(("keep_best", False, "nothing follows an asynchronous run: no fine-tuning "
                                                             "reads its model"),)),
}


def _resolve(ref: str) -> Any:
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def federation(name: str) -> Federation:
    if name not in FEDERATIONS:
        raise ValueError(f"unknown federation {name!r}; known: {sorted(FEDERATIONS)}")
    return FEDERATIONS[name]


def methods_of(name: str) -> dict[str, type]:
    """name -> class of every method the federation ``name`` can run."""
    return _resolve(federation(name).methods)


def hyperparameters_of(name: str, method: str) -> dict[str, object]:
    """The hyper-parameters (with defaults) of ``method`` under federation ``name``."""
    return _resolve(federation(name).hyperparameters)(method)


def models_of(name: str) -> dict[str, Any]:
    """The valid `model` names of a setting under federation ``name``."""
    return _resolve(federation(name).models)


def runs_of(name: str) -> Callable[..., tuple]:
    """How federation ``name``'s train job builds each seed's run (fedrepro.train.train_job)."""
    return _resolve(federation(name).runs)
