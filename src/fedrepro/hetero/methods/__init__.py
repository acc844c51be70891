"""Heterogeneous-model methods, one file each. Every module here that defines a ``HeteroMethod`` subclass
with its own ``name`` is registered automatically (adding a method is adding a file); ``local`` (no
communication) is the base class itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from fedrepro.hetero.base import HeteroMethod


def _discover() -> dict[str, type[HeteroMethod]]:
    found: dict[str, type[HeteroMethod]] = {HeteroMethod.name: HeteroMethod}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            # a class without a name of its own is a shared base (e.g. fml.AuxModelMethod), not a method
            if (inspect.isclass(obj) and issubclass(obj, HeteroMethod) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                if obj.name in found:
                    raise RuntimeError(f"two methods are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return found


METHODS: dict[str, type[HeteroMethod]] = _discover()


def hyperparameters(name: str) -> dict[str, object]:
    """The hyper-parameters a method accepts, with their defaults."""
    sig = inspect.signature(METHODS[name].__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self"}


def build_method(name: str, **hparams: object) -> HeteroMethod:
    """Instantiate method ``name``; unknown names and hyper-parameters are errors that say what exists."""
    if name not in METHODS:
        raise ValueError(f"unknown heterogeneous-model method {name!r}; known: {sorted(METHODS)}")
    allowed = hyperparameters(name)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"method {name!r} has no hyper-parameter {unknown}; it accepts {sorted(allowed)}")
    return METHODS[name](**hparams)
