"""Method registries by file: every module of a package that defines a subclass of a base with a ``name``
of its own is registered, so adding a method is adding a file (algorithms/, hetero/methods/, asyncfl/methods/).

A method's hyper-parameters are its ``__init__``'s keyword arguments, and their annotations are the one place
their values are declared: the type (float, int, bool, str, ``Literal[...]``, ``X | None``) and, where a value
has bounds, a ``Range`` in ``Annotated`` (the aliases below). The config check (before any job) and ``build``
(every job) test values against them alike.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import numbers
import operator
import pkgutil
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric hyper-parameter (``Annotated[float, Range(ge=0)]``); None: unbounded on that side."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def problem(self, value: float) -> str | None:
        """'must be >= 0, got -5' when ``value`` is out of bounds (or NaN), else None."""
        tests = ((">=", self.ge, operator.ge), (">", self.gt, operator.gt), ("<=", self.le, operator.le),
                 ("<", self.lt, operator.lt))
        given = [(sign, bound, test) for sign, bound, test in tests if bound is not None]
        if all(test(value, bound) for _, bound, test in given):
            return None
        return f"must be {' and '.join(f'{sign} {bound:g}' for sign, bound, _ in given)}, got {value!r}"


NonNegative = Annotated[float, Range(ge=0)]  # a penalty or coefficient that 0 turns off
Positive = Annotated[float, Range(gt=0)]  # learning rates, temperatures
Fraction = Annotated[float, Range(ge=0, le=1)]  # a share or mixing weight
PositiveInt = Annotated[int, Range(ge=1)]  # epochs, batch and buffer sizes, sample counts
NonNegativeInt = Annotated[int, Range(ge=0)]  # rounds or epochs that 0 skips


def did_you_mean(value: object, options) -> str:
    """' (did you mean 'x'?)' for the closest option, or '' (config errors and unknown hyper-parameters)."""
    close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


# each plain type a hyper-parameter may declare: (accepts a value, what a refused value is not). A bool is an int
# to Python but never a number here; numbers.* also takes numpy's scalars (tools and tests build methods too)
_TYPES = {float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "is not a number"),
          int: (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "is not an integer"),
          bool: (lambda v: isinstance(v, bool), "is not true or false"),
          str: (lambda v: isinstance(v, str), "is not a string")}


def _type_problem(hint: object, value: object) -> str | None:
    """What keeps ``value`` from having the declared type ``hint`` (an annotation), or None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        problem = _type_problem(args[0], value)
        ranges = [r for r in args[1:] if isinstance(r, Range)]
        return problem or next(filter(None, (r.problem(value) for r in ranges)), None)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(a, value) for a in args if a is not type(None)]
        return None if None in problems else problems[0]
    if origin is Literal:
        return None if value in args else f"{value!r} is not one of {list(args)}{did_you_mean(value, args)}"
    if hint in _TYPES and not _TYPES[hint][0](value):
        return f"{value!r} {_TYPES[hint][1]}"
    return None


def hyperparameter_problems(cls: type, hparams: dict[str, object]) -> dict[str, str]:
    """key -> what is wrong with its value, for each of ``hparams`` its annotation in ``cls.__init__`` refuses
    (type, then range); keys ``cls`` does not take are the caller's to report."""
    hints = typing.get_type_hints(cls.__init__, include_extras=True)
    problems = {key: _type_problem(hints[key], value) for key, value in hparams.items() if key in hints}
    return {key: problem for key, problem in problems.items() if problem}


def build(registry: dict[str, type], what: str, name: str, hparams: dict[str, object]) -> object:
    """Instantiate ``registry[name]``; unknown names and hyper-parameters are errors that say what exists."""
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(registry)}")
    allowed = hyperparameters(registry[name])
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"{what} {name!r} has no hyper-parameter {unknown}; it accepts {sorted(allowed)}")
    problems = hyperparameter_problems(registry[name], hparams)
    if problems:
        raise ValueError(f"{what} {name!r}: " + "; ".join(f"{key}: {problem}" for key, problem in problems.items()))
    return registry[name](**hparams)
