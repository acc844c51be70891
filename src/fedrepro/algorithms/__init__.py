"""Federated methods, one file each; ``build_algorithm`` turns a config entry into an instance."""

from __future__ import annotations

import inspect

from fedrepro.algorithms.base import Algorithm
from fedrepro.algorithms.fedavg import FedAvg
from fedrepro.algorithms.fedprox import FedProx

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedAvg, FedProx)}


def hyperparameters(name: str) -> dict[str, object]:
    """The hyper-parameters a method accepts, with their defaults."""
    sig = inspect.signature(ALGORITHMS[name].__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self"}


def build_algorithm(name: str, **hparams: object) -> Algorithm:
    """Instantiate method ``name``; unknown names and hyper-parameters are errors that say what exists."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    allowed = hyperparameters(name)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"algorithm {name!r} has no hyper-parameter {unknown}; it accepts {sorted(allowed)}")
    return ALGORITHMS[name](**hparams)
