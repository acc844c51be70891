"""The study schema's defaults, for the engines' config classes and the key lists: one place for every default.

workflow/schemas/study.schema.yaml declares each training, asynchronous and fine-tuning key with its default (a
study's `defaults`, `async` and `finetune` blocks), and, for the optional training keys a run spec carries only
where a study sets them (so the other runs' specs and checkpoint digests stay as they were), the value their
absence means (`absent:`). The engines' dataclasses (sim.sync.TrainingConfig, hetero.engine.HeteroConfig,
asyncfl.engine.AsyncConfig, finetune.FinetuneConfig) take their defaults from here, never their own.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "study.schema.yaml"


@cache
def _schema() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(SCHEMA.read_text(), Loader=loader)  # noqa: S506 (a SafeLoader)


def _block_defaults(block: str) -> dict[str, Any]:
    """The defaults a study's top-level ``block`` (defaults, async, finetune) fills in."""
    props = _schema()["properties"][block]["properties"]
    return {key: spec["default"] for key, spec in props.items() if "default" in spec}


@cache
def training() -> dict[str, Any]:
    """Every training key's default: the study's `defaults` block's, and the optional keys' absent values."""
    optional = _schema()["definitions"]["training"]["properties"]
    return {**{k: spec["absent"] for k, spec in optional.items() if "absent" in spec}, **_block_defaults("defaults")}


@cache
def asynchrony() -> dict[str, Any]:
    """Every asynchronous key's default (a study's `async` block)."""
    return _block_defaults("async")


@cache
def finetune() -> dict[str, Any]:
    """Every fine-tuning key's default (a study's `finetune` block)."""
    return _block_defaults("finetune")


def training_keys() -> tuple[str, ...]:
    """The training keys every run spec carries (those the study's `defaults` block fills in)."""
    return tuple(_block_defaults("defaults"))


def optional_training_keys() -> tuple[str, ...]:
    """The training keys a run spec carries only where a study sets them (the schema says what absence means)."""
    optional = _schema()["definitions"]["training"]["properties"]
    return tuple(k for k, spec in optional.items() if "absent" in spec)


def finetune_keys() -> tuple[str, ...]:
    """The fine-tuning keys of a fine-tuning spec."""
    return tuple(_schema()["definitions"]["finetune"]["properties"])
