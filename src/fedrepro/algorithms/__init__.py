"""Federated methods, one file each. Every module here that defines an ``Algorithm`` subclass with a
``name`` is registered automatically: adding a method is adding a file."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from fedrepro.algorithms.base import Algorithm


def _discover() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in ("base", "weighting"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, Algorithm) and obj.__module__ == module.__name__:
                if obj.name in found:
                    raise RuntimeError(f"two algorithms are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return found


ALGORITHMS: dict[str, type[Algorithm]] = _discover()


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
