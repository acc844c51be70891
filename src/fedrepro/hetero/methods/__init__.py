"""Heterogeneous-model methods, one file each, registered by being here (fedrepro.plugins); ``local`` (no
communication) is the base class itself."""

from __future__ import annotations

from fedrepro import plugins
from fedrepro.hetero.base import HeteroMethod

METHODS: dict[str, type[HeteroMethod]] = {HeteroMethod.name: HeteroMethod,
                                          **plugins.discover(__name__, __path__, HeteroMethod)}


def hyperparameters(name: str) -> dict[str, object]:
    """The hyper-parameters a method accepts, with their defaults."""
    return plugins.hyperparameters(METHODS[name])


def build_method(name: str, **hparams: object) -> HeteroMethod:
    """Instantiate method ``name``; unknown names and hyper-parameters are errors that say what exists."""
    return plugins.build(METHODS, "heterogeneous-model method", name, hparams)
