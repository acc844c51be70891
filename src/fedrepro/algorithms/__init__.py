"""Federated methods, one file each, registered by being here (fedrepro.plugins): adding a method is
adding a file."""

from __future__ import annotations

from fedrepro import plugins
from fedrepro.algorithms.base import Algorithm

ALGORITHMS: dict[str, type[Algorithm]] = plugins.discover(__name__, __path__, Algorithm,
                                                           skip=("base", "weighting", "disco", "jacobian"))


def hyperparameters(name: str) -> dict[str, object]:
    """The hyper-parameters a method accepts, with their defaults."""
    return plugins.hyperparameters(ALGORITHMS[name])


def build_algorithm(name: str, **hparams: object) -> Algorithm:
    """Instantiate method ``name``; unknown names and hyper-parameters are errors that say what exists."""
    return plugins.build(ALGORITHMS, "algorithm", name, hparams)
