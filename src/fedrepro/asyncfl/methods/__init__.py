"""Asynchronous federated methods (Feddle and its baselines), one file each, registered by being here
(fedrepro.plugins); ``fedavg`` is the base class itself (asyncfl/base.py)."""

from __future__ import annotations

from fedrepro import plugins
from fedrepro.asyncfl.base import AsyncMethod

METHODS: dict[str, type[AsyncMethod]] = {AsyncMethod.name: AsyncMethod,
                                         **plugins.discover(__name__, __path__, AsyncMethod)}


def hyperparameters(name: str) -> dict[str, object]:
    """The hyper-parameters a method accepts, with their defaults."""
    return plugins.hyperparameters(METHODS[name])


def build_method(name: str, **hparams: object) -> AsyncMethod:
    """Instantiate method ``name``; unknown names and hyper-parameters are errors that say what exists."""
    return plugins.build(METHODS, "asynchronous method", name, hparams)
