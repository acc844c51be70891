"""Method registries by file: every module of a package that defines a subclass of a base with a ``name``
of its own is registered, so adding a method is adding a file (algorithms/ and hetero/methods/)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable


def discover(package: str, paths: Iterable[str], base: type, skip: tuple[str, ...] = ()) -> dict[str, type]:
    """name -> class of every ``base`` subclass defined, with its own ``name``, in ``package``'s modules."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(list(paths)):
        if info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            # a class without a name of its own is a shared base (e.g. fml.AuxModelMethod), not a method
            if (inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                if obj.name in found:
                    raise RuntimeError(f"two methods are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return found


def hyperparameters(cls: type) -> dict[str, object]:
    """The keyword arguments of ``cls`` with their defaults: a method's hyper-parameters."""
    sig = inspect.signature(cls.__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self"}


def build(registry: dict[str, type], what: str, name: str, hparams: dict[str, object]) -> object:
    """Instantiate ``registry[name]``; unknown names and hyper-parameters are errors that say what exists."""
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(registry)}")
    allowed = hyperparameters(registry[name])
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"{what} {name!r} has no hyper-parameter {unknown}; it accepts {sorted(allowed)}")
    return registry[name](**hparams)
