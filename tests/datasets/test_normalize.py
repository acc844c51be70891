"""Input normalisation: the training split's per-channel statistics by default, a setting's fixed `normalize`
constants (the papers' code's) when given; the constants reach the job only through the run spec."""

from __future__ import annotations

import copy

import pytest
import torch
from support.images import CPU, image_set

from fedrepro.config import load_yaml, resolve_config
from fedrepro.sim.tensors import to_device_data
from fedrepro.study import ConfigError, run_spec, spec_digest


def test_default_standardises_each_channel_with_the_training_split() -> None:
    data = to_device_data(image_set(200, 50, 8, 3), CPU)
    assert torch.allclose(data.x_train.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(data.x_train.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4)


@pytest.mark.parametrize("mean,std", [([0.5], [0.5]), ([0.1, 0.2, 0.3], [0.4, 0.5, 0.6])])
def test_fixed_constants_give_x_minus_mean_over_std(mean: list[float], std: list[float]) -> None:
    prepared = image_set(40, 10, 8, 3)
    data = to_device_data(prepared, CPU, normalize={"mean": mean, "std": std})
    for raw, got in ((prepared.x_train, data.x_train), (prepared.x_test, data.x_test)):
        unit = torch.as_tensor(raw, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
        m, s = (torch.tensor(v).expand(3).reshape(1, 3, 1, 1) for v in (mean, std))
        assert torch.allclose(got.contiguous(), (unit - m) / s, atol=1e-5)


def test_constants_of_the_wrong_length_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"normalize\.mean has 2 values for images of 3 channel"):
        to_device_data(image_set(10, 5, 8, 3), CPU, normalize={"mean": [0.5, 0.5], "std": [0.5]})


HALF = {"mean": [0.5], "std": [0.5]}


def test_the_setting_wins_over_the_study_entry_of_its_data_set_and_only_they_change_the_spec() -> None:
    config = resolve_config(load_yaml("config/config.yaml"))
    study = config["studies"]["feddisco"]
    setting, method = next(iter(study["settings"])), next(iter(study["methods"]))
    dataset = study["settings"][setting]["dataset"]
    plain = copy.deepcopy(study)
    plain["normalize"] = {}
    plain["settings"][setting].pop("normalize", None)
    by_study = copy.deepcopy(plain)
    by_study["normalize"] = {dataset: HALF}
    by_setting = copy.deepcopy(by_study)
    by_setting["settings"][setting]["normalize"] = {"mean": [0.1], "std": [0.2]}
    assert "normalize" not in run_spec(plain, setting, method)
    assert run_spec(by_study, setting, method)["normalize"] == HALF
    assert run_spec(by_setting, setting, method)["normalize"] == {"mean": [0.1], "std": [0.2]}
    digests = {spec_digest(run_spec(s, setting, method)) for s in (plain, by_study, by_setting)}
    assert len(digests) == 3


def test_a_study_entry_for_an_unknown_data_set_is_refused_naming_it() -> None:
    config = load_yaml("config/config.yaml")
    config["studies"]["feddisco"]["normalize"] = {"fashion_mnistt": HALF}
    with pytest.raises(ConfigError, match=r"normalize\.fashion_mnistt: unknown data set 'fashion_mnistt'"):
        resolve_config(config)


def test_a_zero_std_is_refused_by_the_schema_naming_the_key() -> None:
    config = load_yaml("config/config.yaml")
    setting = next(iter(config["studies"]["feddisco"]["settings"].values()))
    setting["normalize"] = {"mean": [0.5], "std": [0.0]}
    with pytest.raises(ConfigError, match=r"settings\.\w+\.normalize\.std\.0: 0\.0 is less than or equal"):
        resolve_config(config)
