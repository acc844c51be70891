"""The paper-scale FedDisco study file (config/studies/feddisco.yaml) pairs each published cell with the run
the paper describes (issue #16)."""

from __future__ import annotations

import pytest
import yaml
from support.common import REPO

from fedrepro.config import resolve_config
from fedrepro.study import ConfigError, grid_runs, table_cell_method


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load((REPO / "config" / "studies" / "feddisco.yaml").read_text())


def resolve(study: dict) -> dict:
    return resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddisco": study}})[
        "studies"]["feddisco"]


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


def test_a_cells_method_the_grid_does_not_run_is_refused(raw):
    import copy

    bad = copy.deepcopy(raw)
    bad["tables"]["table1"]["rows"][-1]["cells"] = [{"columns": ["fmnist-niid1"], "method": "feddc-disco-nope"}]
    with pytest.raises(ConfigError, match="feddc-disco-nope"):
        resolve(bad)


def test_every_table_cell_names_a_grid_run(study):
    runs = set(grid_runs(study))
    for name, spec in study["tables"].items():
        if spec["source"] == "simulation":
            continue  # Table 6: computed, no runs
        for r in spec["rows"]:
            for c in spec["columns"]:
                assert (c["setting"], table_cell_method(r, c)) in runs, name


def test_table12_applies_disco_to_fedavg(study):
    got = cells(study, "table12")
    assert {m for (row, _), m in got.items()} == {"fedavg", "fedavg-disco"}
    assert study["tables"]["table12"]["claims"][0]["better"] == "fedavg-disco"


def test_stragglers_run_on_cifar10_niid2_and_show_the_two_published_numbers(study, tmp_path):
    import pandas as pd

    from fedrepro.report.published import load_published
    from fedrepro.report.tables import render_table

    setting = study["settings"]["c10-stragglers"]
    assert setting["dataset"] == "cifar10" and setting["partition"]["kind"] == "niid2"
    assert setting["partition"] == study["settings"]["c10-niid2"]["partition"]
    assert setting["training"]["straggler_steps"] == [50, 500]
    spec = dict(study["tables"]["stragglers"], name="stragglers")
    spec["rows"] = [{"label": r["method"], "paper": None, **r} for r in spec["rows"]]
    spec["columns"] = [{"paper": None, **c} for c in spec["columns"]]
    summary = pd.DataFrame([dict(setting="c10-stragglers", method=m, seed=0, status="complete",
                                 diverged_round=None, best_acc=50.0) for m in
                            ("fedavg", "fedavg-disco", "fednova", "fednova-disco")])
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    tidy = render_table(spec, summary, published, tmp_path / "s", "paper").set_index(["method"])
    assert tidy.loc["fedavg", "paper_mean"] == pytest.approx(60.21)
    assert tidy.loc["fedavg-disco", "paper_mean"] == pytest.approx(63.20)
    assert tidy.loc[["fednova", "fednova-disco"], "paper_mean"].isna().all()


def test_fig5a_has_fedavg_and_feddyn_series_over_every_rho(study):
    fig = study["figures"]["fig5a"]
    runs = set(grid_runs(study))
    assert [(s["baseline"], s["method"]) for s in fig["series"]] == [("fedavg", "fedavg-disco"),
                                                                     ("feddyn", "feddyn-disco")]
    for p in fig["points"]:
        for s in fig["series"]:
            assert {(p["setting"], s["baseline"]), (p["setting"], s["method"])} <= runs


def test_femnist_in_text_result_is_a_table_over_leaf_writers(study, tmp_path):
    import pandas as pd

    from fedrepro.data.registry import DATASETS
    from fedrepro.report.published import load_published
    from fedrepro.report.tables import render_table

    setting = study["settings"]["femnist-writers"]
    assert setting["dataset"] == "femnist" and "femnist" in DATASETS and setting["partition"]["kind"] == "writer"
    spec = dict(study["tables"]["femnist"], name="femnist")
    spec["rows"] = [{"paper": None, **r} for r in spec["rows"]]
    spec["columns"] = [{"paper": None, **c} for c in spec["columns"]]
    summary = pd.DataFrame([dict(setting="femnist-writers", method=m, seed=0, status="complete",
                                 diverged_round=None, best_acc=70.0) for m in ("fedavg", "fedavg-disco")])
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    tidy = render_table(spec, summary, published, tmp_path / "f", "paper").set_index("method")
    assert tidy.loc["fedavg", "paper_mean"] == pytest.approx(76.40)
    assert tidy.loc["fedavg-disco", "paper_mean"] == pytest.approx(78.36)


def test_table6_simulation_lowers_both_forms_of_the_bound_and_renders_beside_the_paper(study, tmp_path):
    import numpy as np

    from fedrepro.report.bound_simulation import CONSTANTS, bound_terms, clients_of, project_to_simplex, simulate
    from fedrepro.report.published import load_published
    from fedrepro.report.tables import render_table

    p = project_to_simplex(np.array([0.7, 0.6, -0.2]))
    assert p.sum() == pytest.approx(1.0) and (p >= 0).all() and p[2] == 0
    sim = simulate()
    forms = sim.pivot(index="method", columns="setting", values="bound")[[f"step{k}" for k in range(0, 401, 100)]]
    for form in ("reformulated", "original"):
        assert (np.diff(forms.loc[form].to_numpy()) < 0).all(), form  # both fall step after step
    n, d = clients_of(CONSTANTS)
    assert forms.loc["original", "step0"] == pytest.approx(bound_terms(n, n, d, CONSTANTS)[1])  # from p = n
    spec = dict(study["tables"]["table6"], name="table6")
    spec["rows"] = [{"paper": None, **r} for r in spec["rows"]]
    spec["columns"] = [{"paper": None, **c} for c in spec["columns"]]
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    tidy = render_table(spec, sim, published, tmp_path / "t6", "paper").set_index(["method", "setting"])
    assert len(tidy) == 10 and tidy["ours_mean"].notna().all()
    assert tidy.loc[("reformulated", "step0"), "paper_mean"] == pytest.approx(0.0684)
    assert tidy.loc[("original", "step400"), "paper_mean"] == pytest.approx(0.0502)
    assert "(%)" not in (tmp_path / "t6.md").read_text()


def test_description_states_the_true_train_job_count(study):
    assert f"{len(grid_runs(study))} train jobs" in study["description"]
