"""Training defaults live in the study schema; TrainingConfig (what engines and tests build directly) must say
the same, so the two cannot drift apart."""

from __future__ import annotations

import dataclasses

import yaml
from support.common import REPO

from fedrepro.sim.sync import TrainingConfig
from fedrepro.study import OPTIONAL_TRAINING_KEYS, TRAINING_KEYS

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "study.schema.yaml").read_text())
# optional keys have no schema default: their descriptions say what absence means, which TrainingConfig encodes
ABSENT = {"optimizer": "sgd", "lr_decay": 1.0, "lr_decay_every": 0, "early_stop": 0, "keep_best": False}


def test_training_config_has_exactly_the_schemas_training_keys() -> None:
    fields = {f.name for f in dataclasses.fields(TrainingConfig)}
    assert fields == set(SCHEMA["definitions"]["training"]["properties"])
    assert set(TRAINING_KEYS) | set(OPTIONAL_TRAINING_KEYS) == fields


def test_training_config_defaults_are_the_schemas() -> None:
    defaults = {k: v["default"] for k, v in SCHEMA["properties"]["defaults"]["properties"].items()}
    fields = {f.name: f.default for f in dataclasses.fields(TrainingConfig)}
    for key, value in defaults.items():
        if key == "rounds":  # TrainingConfig requires it: a run never trains for a default number of rounds
            assert fields[key] is dataclasses.MISSING
            continue
        assert fields[key] == value, key
    assert set(ABSENT) == set(fields) - set(defaults)
    for key, value in ABSENT.items():
        assert fields[key] == value, key
