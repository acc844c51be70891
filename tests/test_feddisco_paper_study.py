"""The paper-scale FedDisco study file (config/studies/feddisco.yaml) pairs each published cell with the run
the paper describes (issue #16)."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from fedrepro.config import ConfigError, grid_runs, resolve_config, table_cell_method


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load((REPO / "config" / "studies" / "feddisco.yaml").read_text())


def resolve(study: dict) -> dict:
    return resolve_config({"scale": "paper", "studies": {"feddisco": study}})["studies"]["feddisco"]


@pytest.fixture(scope="module")
def study(raw):
    return resolve(raw)


def cells(study: dict, table: str) -> dict[tuple[str, str], str]:
    """(row method, column label or setting) -> the method whose runs fill the cell."""
    spec = study["tables"][table]
    return {(r["method"], c.get("label", c["setting"])): table_cell_method(r, c)
            for r in spec["rows"] for c in spec["columns"]}


def test_table1_fedDisco_is_scaffold_disco_on_fashion_mnist_and_feddyn_disco_elsewhere(study):
    got = cells(study, "table1")
    assert got[("feddyn-disco", "fmnist-niid1")] == got[("feddyn-disco", "fmnist-niid2")] == "scaffold-disco"
    assert got[("feddyn-disco", "c10-niid1")] == got[("feddyn-disco", "ham-niid1")] == "feddyn-disco"
    assert got[("fedavg", "fmnist-niid1")] == "fedavg"


def test_a_setting_method_the_grid_does_not_run_is_refused(raw):
    import copy

    bad = copy.deepcopy(raw)
    bad["tables"]["table1"]["rows"][-1]["setting_methods"] = {"fmnist-niid1": "feddc-disco-nope"}
    with pytest.raises(ConfigError, match="feddc-disco-nope"):
        resolve(bad)


def test_every_table_cell_names_a_grid_run(study):
    runs = set(grid_runs(study))
    for name, spec in study["tables"].items():
        for r in spec["rows"]:
            for c in spec["columns"]:
                assert (c["setting"], table_cell_method(r, c)) in runs, name
