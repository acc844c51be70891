"""A `federation: async` study from config to metrics: its `async` keys reach the run spec (and only async
specs carry them), bad server data sets are config errors, the train job runs with out-of-domain server data,
and tables can show the maximum of the last k evaluations (Feddle's reported number)."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from support.common import REPO

from fedrepro.config import resolve_config
from fedrepro.data.registry import prepare_dataset
from fedrepro.partition import make_partition, partition_stats, save_partition
from fedrepro.pipeline import train
from fedrepro.report.derived import add_derived
from fedrepro.study import ConfigError, run_spec

torch.set_num_threads(1)

STUDY = {
    "federation": "async",
    "seeds": [0],
    "defaults": {"rounds": 4, "batch_size": 16, "lr": 0.05, "join_ratio": 0.4, "eval_every": 2, "last_k": 2},
    "async": {"server_samples": 40, "ood_dataset": "photo_patches", "ood_samples": 60},
    "settings": {
        "n3": {"dataset": "digits", "image_size": 8, "model": "cnn3_small",
               "partition": {"kind": "dirichlet", "clients": 5, "beta": 0.5}, "async": {"delay_sigma": 3}},
    },
    "methods": {
        "feddle-ood": {"algorithm": "feddle", "hparams": {"server_data": "out_of_domain", "fallback_lambda": 0.01,
                                                          "batch_size": 30, "head_epochs": 2}},
        "fedbuff": {"algorithm": "fedbuff", "hparams": {"buffer_size": 2}},
    },
    "grid": [{"settings": ["n3"], "methods": ["feddle-ood", "fedbuff"]}],
}


def resolved(study=STUDY):
    return resolve_config({"studies": {"t": copy.deepcopy(study)}})["studies"]["t"]


def test_async_keys_reach_the_run_spec_with_defaults_and_setting_overrides():
    spec = run_spec(resolved(), "n3", "fedbuff")
    assert spec["async"] == {"delay_sigma": 3, "server_samples": 40, "ood_dataset": "photo_patches", "ood_samples": 60,
                             "measure_cost": False, "true_update": False}
    bare = {**STUDY, "async": {}}
    assert run_spec(resolved(bare), "n3", "fedbuff")["async"] == {
        "delay_sigma": 3, "server_samples": 1000, "ood_dataset": None, "ood_samples": None, "measure_cost": False,
        "true_update": False}
    sync = {**STUDY, "federation": "sync", "async": {},
            "methods": {"fedavg": {"algorithm": "fedavg"}}, "grid": [{"settings": ["n3"], "methods": ["fedavg"]}]}
    assert "async" not in run_spec(resolved(sync), "n3", "fedavg")  # sync digests stay as they were


def test_an_unknown_out_of_domain_data_set_is_a_config_error():
    bad = {**STUDY, "async": {"ood_dataset": "imagenet_subsett"}}
    with pytest.raises(ConfigError, match=r"settings\.n3\.async\.ood_dataset.*did you mean 'imagenet_subset'"):
        resolved(bad)
    with pytest.raises(ConfigError, match="delay_sigma"):
        resolved({**STUDY, "async": {"delay_sigma": -1}})


def test_last_k_max_is_the_maximum_of_the_last_k_evaluations():
    runs = pd.DataFrame({"study": "t", "setting": "n3", "method": "m", "seed": 0, "round": [2, 4, 6, 8],
                         "test_acc": [50.0, 70.0, 40.0, 45.0]})
    summary = pd.DataFrame({"study": ["t"], "setting": ["n3"], "method": ["m"], "seed": [0], "last_k": [2]})
    spec = {"name": "x", "metric": "last_k_max_acc", "columns": [{"setting": "n3"}]}
    assert add_derived(spec, summary, runs)["last_k_max_acc"].tolist() == [45.0]
    summary["last_k"] = 3
    assert add_derived(spec, summary, runs)["last_k_max_acc"].tolist() == [70.0]


def test_the_train_job_runs_with_out_of_domain_server_data(tmp_path):
    study = resolved()
    for name in ("digits", "photo_patches"):
        prepare_dataset(name, tmp_path / f"{name}.npz")
    labels = np.load(tmp_path / "digits.npz")["y_train"]
    setting = study["settings"]["n3"]["partition"]
    parts = make_partition(labels, setting, 0)
    save_partition(tmp_path / "seed0.npz", parts, partition_stats(parts, labels, 10), setting)
    for method in ("feddle-ood", "fedbuff"):
        index = tmp_path / "runs" / method / "seeds.json"
        train(run_spec(study, "n3", method), tmp_path / "digits.npz", [tmp_path / "seed0.npz"], [0], index,
              tmp_path / "ckpt" / method, "cpu", 1, log=lambda m: None)
        assert json.loads(index.read_text())["runs"] == [{"seed": 0, "dir": "seed0", "status": "complete"}]
    metrics = pd.read_csv(tmp_path / "runs" / "feddle-ood" / "seed0" / "metrics.csv")
    assert metrics["round"].tolist() == [2, 4]
    assert {"coef_mean", "coef_neg_frac", "in_flight", "arrived"} <= set(metrics.columns)
    summary = json.loads((tmp_path / "runs" / "feddle-ood" / "seed0" / "summary.json").read_text())
    assert summary["config"]["async"]["ood_dataset"] == "photo_patches"


def test_fig2_comes_from_true_update_runs_and_needs_them(tmp_path):
    """Fig. 2 end to end: two synchronous settings log the clients' cosine to the true update, one seed's
    cosine matrix lies beside its summary, and the figure renders from them; a setting without
    async.true_update is a config error naming the figure."""
    from fedrepro.asyncfl.job import TRUE_UPDATES
    from fedrepro.pipeline import aggregate, figure

    sync = {"delay_sigma": 0, "true_update": True}
    study = {**STUDY, "async": {"server_samples": 40},
             "settings": {"skewed": {**STUDY["settings"]["n3"], "async": sync},
                          "iid": {**STUDY["settings"]["n3"], "async": sync,
                                  "partition": {"kind": "iid", "clients": 5}}},
             "methods": {"fedavg": {"algorithm": "fedavg"}},
             "grid": [{"settings": ["skewed", "iid"], "methods": ["fedavg"]}],
             "figures": {"fig2": {"kind": "update_cosine", "settings": ["skewed", "iid"], "setting": "skewed",
                                  "method": "fedavg"}}}
    with pytest.raises(ConfigError, match=r"figures\.fig2.*'n3' logs no true update.*async\.true_update"):
        resolved({**study, "settings": {**study["settings"], "n3": STUDY["settings"]["n3"]},
                  "figures": {"fig2": {**study["figures"]["fig2"], "settings": ["skewed", "n3"]}}})
    study = resolved(study)
    prepare_dataset("digits", tmp_path / "digits.npz")
    labels = np.load(tmp_path / "digits.npz")["y_train"]
    indexes = []
    for setting in ("skewed", "iid"):
        part = study["settings"][setting]["partition"]
        parts = make_partition(labels, part, 0)
        save_partition(tmp_path / f"{setting}.npz", parts, partition_stats(parts, labels, 10), part)
        indexes.append(tmp_path / "runs" / setting / "fedavg" / "seeds.json")
        train(run_spec(study, setting, "fedavg"), tmp_path / "digits.npz", [tmp_path / f"{setting}.npz"], [0],
              indexes[-1], tmp_path / "ckpt" / setting, "cpu", 1, log=lambda m: None)
    with np.load(indexes[0].parent / "seed0" / TRUE_UPDATES) as f:
        assert f["rounds"].tolist() == [2, 4] and f["cosines"].shape == (2, 2)
    aggregate(indexes, tmp_path / "runs.csv", tmp_path / "summary.csv", log=lambda m: None)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs["true_cos_mean"].notna().all() and (runs["true_cos_min"] <= runs["true_cos_max"]).all()
    spec = {**study["figures"]["fig2"], "name": "fig2", "settings": [{"setting": s, "label": s} for s in
                                                                      ("skewed", "iid")]}
    figure(spec, [tmp_path / "runs.csv", indexes[0]], tmp_path / "fig2", log=lambda m: None)
    assert (tmp_path / "fig2.png").stat().st_size > 10_000 and (tmp_path / "fig2.pdf").exists()


def _paper_feddle():
    from fedrepro.config import load_yaml

    raw = load_yaml(REPO / "config" / "studies" / "feddle.yaml")
    return raw, resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddle": raw}})


def test_table5_center_runs_once_per_data_set_and_fills_its_columns_beside_the_published_value():
    from fedrepro.report.coverage import shown_keys
    from fedrepro.study import grid_runs, table_cell_setting

    _, config = _paper_feddle()
    study = config["studies"]["feddle"]
    table5 = study["tables"]["table5"]
    columns = {c["setting"] for c in table5["columns"]}
    # Center samples no client: a data set's partition and delay columns share one run (was: one per column)
    assert sorted(s for s, m in grid_runs(study) if m == "center" and s in columns) == [
        "c10-d01-n20", "c100-d01-n20", "fm-d01-n20"]
    center = next(r for r in table5["rows"] if r["method"] == "center")
    filled = {c["setting"]: table_cell_setting(center, c) for c in table5["columns"]}
    assert set(filled.values()) == {"c10-d01-n20", "fm-d01-n20", "c100-d01-n20"}
    assert filled["c100-d03-n5"] == "c100-d01-n20" and filled["fm-d03-n20"] == "fm-d01-n20"
    for data_set in ("CIFAR-10", "Fashion-MNIST", "CIFAR-100"):
        assert ("Table 5", "Center", f"{data_set} | CNN | all settings (single value)") in shown_keys(study)


def test_laptop_table5_center_is_one_run_for_all_four_columns():
    """Center samples no client: one run fills the four columns of Table 5 (its other settings' runs only draw
    the curves), so the -d01/-d03 parts, which run a table's runs, train it once."""
    from fedrepro.config import command_config
    from fedrepro.study import table_cell_setting, table_runs

    study = command_config([str(REPO / "config" / "laptop-feddle-table5.yaml")])["studies"]["feddle-table5"]
    table5 = study["tables"]["table5"]
    assert [s for s, m in table_runs(table5) if m == "center"] == ["fm-d01-n20"]
    center = next(r for r in table5["rows"] if r["method"] == "center")
    assert len(table5["columns"]) == 4 and {table_cell_setting(center, c) for c in table5["columns"]} == {"fm-d01-n20"}


@pytest.mark.parametrize("shared, message", [
    ({"setting": "c10-d01-n20", "columns": ["c10-nope"]}, "c10-nope"),
    ({"setting": "c10-d01-n5"}, r"cell \(center, c10-d01-n5\) names a run the grid does not produce"),
    ({"setting": "c10-d01-n20", "not_applicable": True},
     r"table5\.rows\.center\.cells\.0: a `not_applicable` cell has no run: drop \['setting'\]"),
])
def test_a_bad_cells_entry_is_a_config_error(shared, message):
    raw, _ = _paper_feddle()
    bad = copy.deepcopy(raw)
    center = next(r for r in bad["tables"]["table5"]["rows"] if r["method"] == "center")
    center["cells"] = [shared]
    with pytest.raises(ConfigError, match=message):
        resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddle": bad}})


def test_a_column_in_two_cells_entries_is_a_config_error():
    raw, _ = _paper_feddle()
    bad = copy.deepcopy(raw)
    center = next(r for r in bad["tables"]["table5"]["rows"] if r["method"] == "center")
    center["cells"][1]["columns"].append("c10-d01-n5")
    message = "studies.feddle.tables.table5.rows.center.cells.1.columns: column setting 'c10-d01-n5' is already in"
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddle": bad}})


def test_figs_8_and_9_are_sweep_lines_over_grid_runs_at_paper_scale():
    from fedrepro.study import grid_runs

    _, config = _paper_feddle()
    study = config["studies"]["feddle"]
    assert "fig8" not in study["tables"] and "fig9" not in study["tables"]  # no published numbers to sit beside
    runs = set(grid_runs(study))
    for name, values in (("fig8", [0, 0.001, 0.01, 0.1]), ("fig9", [5, 10, 20, 40, 80])):
        fig = study["figures"][name]
        assert fig["kind"] == "sweep_line" and fig["x_values"] == values and fig["metric"] == "last_k_max_acc"
        assert [line["label"] for line in fig["lines"]] == ["In-Domain", "Out-of-Domain"]
        assert all((fig["setting"], m) in runs for line in fig["lines"] for m in line["methods"])


@pytest.mark.parametrize("edit, message", [
    (lambda fig: fig["lines"][0]["methods"].pop(), "3 methods for 4 x_values"),
    (lambda fig: fig.update(x_scale="log"), "a log axis needs positive x_values"),
    (lambda fig: fig["lines"][1]["methods"].__setitem__(0, "feddle-nope"), r"\(feddle-nope, c10-d01-n20\) is not"),
])
def test_a_bad_sweep_line_is_a_config_error(edit, message):
    raw, _ = _paper_feddle()
    bad = copy.deepcopy(raw)
    edit(bad["figures"]["fig8"])
    with pytest.raises(ConfigError, match=message):
        resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddle": bad}})
