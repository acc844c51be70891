"""Config and study validation: every bad input is a clear error naming the key, value and choices."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from support.common import REPO, laptop_full_config

from fedrepro.config import resolve_config
from fedrepro.study import ConfigError, grid_runs, job_resources, run_spec


@pytest.fixture
def config():
    # laptop-full: every method of FedDisco and FedL2G (the embedded default keeps four FedDisco methods)
    return laptop_full_config()


def study(cfg):
    return cfg["studies"]["feddisco"]


def test_embedded_config_resolves_with_defaults(config):
    resolved = resolve_config(config)
    s = resolved["studies"]["feddisco"]
    runs = grid_runs(s)
    assert ("niid1", "fedavg") in runs and ("niid1", "feddyn-disco") in runs and len(runs) == len(set(runs))
    spec = run_spec(s, "niid1", "fedprox")
    assert spec["hparams"] == {"mu": 0.01}
    assert spec["weighting"] == {"kind": "size"}  # a schema default
    assert spec["training"]["join_ratio"] == 1.0  # a schema default
    assert spec["training"]["batch_size"] == 64  # the study's value
    assert spec["training"]["rounds"] == 120  # the study's value (the schema default is 20)
    assert spec["training"]["drop_last"] is True  # FedDisco's code drops the short last batch
    assert run_spec(resolved["studies"]["fedl2g"], "pat", "fml")["training"]["drop_last"] is True  # HtFLlib's
    fedgtst = resolve_config(laptop_full_config())["studies"]["fedgtst"]
    setting, method = grid_runs(fedgtst)[0]
    assert run_spec(fedgtst, setting, method)["training"]["drop_last"] is False  # the schema default
    assert resolved["device"] == "auto" and resolved["train_resources"]["gpu"] == 0


def test_setting_and_method_overrides_win_over_defaults(config):
    study(config)["settings"]["niid2"] = copy.deepcopy(study(config)["settings"]["niid1"])  # no override
    study(config)["settings"]["niid1"]["training"] = {"rounds": 7}
    study(config)["methods"]["fedprox"]["training"] = {"lr": 0.5}
    s = resolve_config(config)["studies"]["feddisco"]
    assert run_spec(s, "niid1", "fedprox")["training"]["rounds"] == 7
    assert run_spec(s, "niid1", "fedprox")["training"]["lr"] == 0.5
    assert run_spec(s, "niid2", "fedavg")["training"]["rounds"] == study(config)["defaults"]["rounds"] != 7
    assert run_spec(s, "niid1", "fedavg")["training"]["lr"] == 0.01


def test_a_jobs_resources_are_train_resources_overridden_by_its_setting_then_its_method(config):
    study(config)["settings"]["niid1"]["resources"] = {"mem_mb": 9000, "runtime": 90}
    study(config)["methods"]["scaffold"]["resources"] = {"mem_mb": 12000}
    resolved = resolve_config(config)
    s, base = resolved["studies"]["feddisco"], resolved["train_resources"]
    assert job_resources(base, s, "niid1", "fedavg") == {**base, "mem_mb": 9000, "runtime": 90}
    assert job_resources(base, s, "niid1", "scaffold") == {**base, "mem_mb": 12000, "runtime": 90}
    bad = copy.deepcopy(config)
    study(bad)["settings"]["niid1"]["resources"] = {"mem_gb": 9}
    with pytest.raises(ConfigError, match=r"settings.niid1.resources: unknown key 'mem_gb'"):
        resolve_config(bad)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: study(c)["defaults"].update(rouns=3), r"defaults: unknown key 'rouns' \(did you mean 'rounds'\?\)"),
        (lambda c: study(c)["defaults"].update(rounds="ten"), r"defaults.rounds: 'ten' is not of type 'integer'"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(beta=0),
         r"settings.niid1.partition.beta: 0 is less than or equal to the minimum of 0"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(beta=-1), r"partition.beta: -1"),
        (lambda c: study(c)["defaults"].update(join_ratio=1.5), r"defaults.join_ratio: 1.5 is greater than"),
        (lambda c: study(c)["defaults"].update(join_ratio=0), r"defaults.join_ratio: 0 is less than or equal"),
        (lambda c: study(c)["methods"]["fedavg"].update(algorithm="fedavgg"),
         r"methods.fedavg.algorithm: unknown algorithm 'fedavgg' \(did you mean 'fedavg'\?\)"),
        (lambda c: study(c)["settings"]["niid1"].update(dataset="cifar11"),
         r"settings.niid1.dataset: unknown data set 'cifar11' \(did you mean 'cifar10'\?\)"),
        (lambda c: study(c)["settings"]["niid1"].update(model="lenet"), r"unknown model 'lenet'"),
        (lambda c: study(c)["methods"]["fedprox"]["hparams"].update(nu=1),
         r"methods.fedprox.hparams: fedprox has no hyper-parameter 'nu' \(did you mean 'mu'\?\)"),
        (lambda c: study(c)["methods"]["feddyn"]["hparams"].update(evaluate="average"),
         r"methods.feddyn.hparams.evaluate: 'average' is not one of \['server', 'client_mean'\]"),
        (lambda c: study(c)["methods"]["fedavg-disco"]["weighting"].update(target="global"),
         r"methods.fedavg-disco.weighting.target: 'global' was renamed 'test': T is the test set's class "
         r"distribution, as in the official FedDisco code"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(kind="dirichlett"),
         r"partition.kind: 'dirichlett' is not one of .* \(did you mean 'dirichlet'\?\)"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].pop("beta"), r"kind 'dirichlet' needs key 'beta'"),
        (lambda c: study(c)["grid"].__setitem__(0, {"settings": ["niid1"], "methods": ["fedavg"]}),
         r"tables.table1: cell \(\S+, \S+\) names a run the grid does not produce"),
        (lambda c: study(c)["grid"][0]["methods"].append("scafold"), r"grid.0.methods: unknown method .scafold."),
        (lambda c: c["studies"]["fedl2g"]["settings"]["pat"].update(model="tiny5"),
         r"studies.fedl2g.settings.pat.model: unknown model group 'tiny5' \(did you mean 'tiny4'\?\)"),
        (lambda c: c["studies"]["fedl2g"]["methods"]["fml"].update(algorithm="fedavg"),
         r"studies.fedl2g.methods.fml.algorithm: unknown algorithm 'fedavg'.*known: \['fed_distill'"),
        (lambda c: c["studies"]["fedl2g"]["methods"]["fedproto"].update(training={"momentum": 0.9}),
         r"fedl2g.*settings.(pat|dir) / methods.fedproto: training.momentum: must be 0.0 in a `federation: hetero` "
         r"study \(clients train with plain SGD"),
        (lambda c: c["studies"]["fedl2g"]["defaults"].update(optimizer="adam"),
         r"fedl2g.*training.optimizer: must be 'sgd' in a `federation: hetero` study"),
        (lambda c: c["studies"]["fedl2g"]["defaults"].update(keep_best=True),
         r"fedl2g.*training.keep_best: must be False in a `federation: hetero` study \(no single model is handed on"),
        (lambda c: c["studies"]["feddle-fmnist"]["defaults"].update(keep_best=True),
         r"feddle.*training.keep_best: must be False in a `federation: async` study \(nothing follows an asynchronous"),
        (lambda c: study(c)["defaults"].update(optimizer="adam"),
         r"settings.niid1 / methods.\S+: training.momentum: must be 0 with optimizer: adam .*got 0.9"),
        (lambda c: study(c)["defaults"].update(optimizer="adagrad"), r"defaults.optimizer: 'adagrad' is not one of"),
        (lambda c: c["studies"]["fedl2g"].update(federation="hetro"), r"federation: 'hetro' is not one of"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(pool_test=True),
         r"settings.niid1.partition.pool_test: only a `federation: hetero` study"),
        (lambda c: c.update(device="gpu"),
         r"device: 'gpu' is not one of \['auto', 'cpu', 'cuda'\] \(did you mean 'cuda'\?\)"),
        # hyper-parameters by the type and range their method's __init__ declares, in every kind of federation
        (lambda c: study(c)["methods"]["fedprox"]["hparams"].update(mu="lots"),
         r"studies.feddisco.methods.fedprox.hparams.mu: 'lots' is not a number"),
        (lambda c: study(c)["methods"]["fedprox"]["hparams"].update(mu=-5.0),
         r"studies.feddisco.methods.fedprox.hparams.mu: must be >= 0, got -5.0"),
        (lambda c: study(c)["methods"]["fedprox"]["hparams"].update(mu=True), r"hparams.mu: True is not a number"),
        (lambda c: c["studies"]["fedl2g"]["methods"]["fedl2g_f"].setdefault("hparams", {}).update(warmup_rounds=2.5),
         r"studies.fedl2g.methods.fedl2g_f.hparams.warmup_rounds: 2.5 is not an integer"),
        (lambda c: c["studies"]["fedl2g"]["methods"]["fedproto"].setdefault("hparams", {}).update(inference="protoype"),
         r"methods.fedproto.hparams.inference: 'protoype' is not one of \['prototype', 'head'\] "
         r"\(did you mean 'prototype'\?\)"),
        (lambda c: c["studies"]["feddle-fmnist"]["methods"]["fedbuff"]["hparams"].update(buffer_size=0),
         r"studies.feddle-fmnist.methods.fedbuff.hparams.buffer_size: must be >= 1, got 0"),
        (lambda c: c["studies"]["feddle-fmnist"]["methods"]["feddle"]["hparams"].update(grad_cosine="yes"),
         r"methods.feddle.hparams.grad_cosine: 'yes' is not true or false"),
        # training and partitions that cannot run, from the data set's known size
        (lambda c: study(c)["defaults"].update(straggler_steps=[5, 2]),
         r"studies.feddisco.defaults.straggler_steps: \[5, 2\]: \[lo, hi\] needs lo <= hi"),
        (lambda c: study(c)["methods"]["fedprox"].update(training={"straggler_steps": [5, 2]}),
         r"methods.fedprox.training.straggler_steps: \[5, 2\]"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(clients=100000),
         r"settings.niid1.partition.clients: 100000 clients share the 6000 samples it partitions \(`samples`\): "
         r"some would hold none"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(samples=None, clients=100000),
         r"settings.niid1.partition.clients: 100000 clients share the 60000 training samples of fashion_mnist"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(samples=70000),
         r"settings.niid1.partition.samples: 70000 is more than the 60000 training samples of fashion_mnist"),
        (lambda c: study(c)["settings"]["niid1"]["partition"].update(min_size=5000),
         r"settings.niid1.partition.min_size: 10 clients x min_size 5000 = 50000 samples, more than the 6000"),
        (lambda c: c["studies"]["fedl2g"]["settings"]["pat"]["partition"].update(classes_per_client=20),
         r"studies.fedl2g.settings.pat.partition.classes_per_client: 20 is more than the 10 classes of fashion_mnist"),
        # names that become folders and files
        (lambda c: study(c)["methods"].update({"fed/prox": study(c)["methods"].pop("fedprox")}),
         r"studies.feddisco.methods: 'fed/prox' is no usable name: .* must match \[A-Za-z0-9_.\\-\]\+"),
        (lambda c: study(c)["settings"].update({"niid 1": study(c)["settings"].pop("niid1")}),
         r"studies.feddisco.settings: 'niid 1' is no usable name"),
        (lambda c: study(c)["tables"].update({"table.1": study(c)["tables"].pop("table1")}),
         r"studies.feddisco.tables: 'table.1' is no usable name: .* must match \[A-Za-z0-9_\\-\]\+"),
        (lambda c: c["studies"].update({"fed/disco": c["studies"].pop("feddisco")}),
         r"studies: 'fed/disco' is no usable name"),
        # a results root of its own, inside the working directory unless allowed outside
        (lambda c: c.update(results_dir="/"), r"results_dir: '/' is the file system's root"),
        (lambda c: c.update(results_dir="/", allow_results_outside=True),
         r"results_dir: '/' is the file system's root"),
        (lambda c: c.update(results_dir=""), r"results_dir: '' is the working directory itself"),
        (lambda c: c.update(results_dir="results/.."), r"results_dir: 'results/..' is the working directory itself"),
        (lambda c: c.update(results_dir="../elsewhere"),
         r"results_dir: '../elsewhere' lies outside the working directory .*; set allow_results_outside: true"),
        (lambda c: c.update(results_dir="/tmp/fedrepro-results"), r"results_dir: '/tmp/fedrepro-results' lies outside"),
        (lambda c: study(c)["tables"]["table1"].update(compare_levels="yes"),
         r"tables.table1.compare_levels: 'yes' is not of type 'boolean', 'null'"),
        (lambda c: c.update(studys={}), r"unknown key 'studys' \(did you mean 'studies'\?\)"),
    ],
)
def test_bad_input_names_the_key(config, mutate, expected):
    bad = copy.deepcopy(config)
    mutate(bad)
    with pytest.raises(ConfigError, match=expected):
        resolve_config(bad)


def test_results_outside_the_working_directory_need_the_opt_in(config, tmp_path):
    resolved = resolve_config({**config, "results_dir": str(tmp_path / "results"), "allow_results_outside": True})
    assert resolved["results_dir"] == str(tmp_path / "results")
    assert resolve_config({**config, "results_dir": "./results/laptop-full/"})["allow_results_outside"] is False


def test_compare_levels_is_the_tables_own_or_else_the_scales(config):
    study(config)["tables"]["table1"]["compare_levels"] = True
    study(config)["tables"]["table2"].pop("compare_levels", None)  # unset: the scale's default decides
    embedded = resolve_config(config)["studies"]["feddisco"]["tables"]
    assert embedded["table1"]["compare_levels"] is True and embedded["table2"]["compare_levels"] is False
    study(config)["tables"]["table1"]["compare_levels"] = False
    paper = resolve_config({**config, "scale": "paper", "results_dir": "results/paper"})["studies"]["feddisco"]
    assert paper["tables"]["table1"]["compare_levels"] is False and paper["tables"]["table2"]["compare_levels"] is True


def test_more_clients_than_samples_is_a_clear_error(digits_prepared):
    from fedrepro.partition import make_partition

    with pytest.raises(ValueError, match="min_size"):
        make_partition(digits_prepared.y_train, {"kind": "dirichlet", "clients": 5000, "beta": 0.5,
                                                 "min_size": 1}, seed=0)


def test_study_file_errors_name_the_file(tmp_path, config):
    path = tmp_path / "mystudy.yaml"
    s = study(config)
    s["seeds"] = "zero"
    path.write_text(yaml.safe_dump(s))
    config["studies"] = {"mine": str(path)}
    with pytest.raises(ConfigError, match=r"mystudy.yaml: seeds: 'zero' is not of type 'array'"):
        resolve_config(config)
    config["studies"] = {"mine": str(tmp_path / "missing.yaml")}
    with pytest.raises(ConfigError, match="missing.yaml: file not found"):
        resolve_config(config)


def test_sweeps_expand_to_named_variants_and_the_grid_names_the_base(config):
    s = study(config)
    s["methods"]["disco-grid"] = {"algorithm": "fedavg", "weighting": {"kind": "disco"},
                                  "sweep": {"weighting.a": [0.2, 0.7], "weighting.b": [0.05, 0.4]}}
    s["grid"].append({"settings": ["niid1"], "methods": ["disco-grid"]})
    s["figures"]["grid"] = {"kind": "gain_grid", "setting": "niid1", "baseline": "fedavg", "sweep": "disco-grid"}
    resolved = resolve_config(config)["studies"]["feddisco"]
    names = [v["method"] for v in resolved["sweeps"]["disco-grid"]]
    assert names == ["disco-grid-a0.2-b0.05", "disco-grid-a0.2-b0.4", "disco-grid-a0.7-b0.05", "disco-grid-a0.7-b0.4"]
    assert set(names) <= {m for _, m in grid_runs(resolved)}
    spec = run_spec(resolved, "niid1", "disco-grid-a0.7-b0.05")
    assert spec["weighting"] == {"kind": "disco", "a": 0.7, "b": 0.05}


def test_a_tied_key_follows_its_axis_in_every_variant_and_an_unknown_one_is_refused_by_name(config):
    """FedDisco's FedAvgM: its dampening is its beta at every point (same_as), not an axis of its own."""
    s = study(config)
    s["methods"]["avgm"] = {"algorithm": "fedavgm", "sweep": {"hparams.beta": [0.3, 0.9],
                                                              "hparams.dampening": {"same_as": "hparams.beta"}}}
    s["grid"].append({"settings": ["niid1"], "methods": ["avgm"]})
    resolved = resolve_config(copy.deepcopy(config))["studies"]["feddisco"]
    assert resolved["sweeps"]["avgm"] == [
        {"method": "avgm-beta0.3", "values": {"hparams.beta": 0.3, "hparams.dampening": 0.3}},
        {"method": "avgm-beta0.9", "values": {"hparams.beta": 0.9, "hparams.dampening": 0.9}}]
    assert run_spec(resolved, "niid1", "avgm-beta0.9")["hparams"] == {"beta": 0.9, "dampening": 0.9}
    s["methods"]["avgm"]["sweep"]["hparams.dampening"] = {"same_as": "hparams.momentum"}
    with pytest.raises(ConfigError, match=r"methods.avgm.sweep.hparams.dampening: same_as 'hparams.momentum' is "
                                          r"no key of the same sweep with values of its own \(those: \['hparams.b"):
        resolve_config(config)


def test_swept_values_are_validated_too(config):
    s = study(config)
    s["methods"]["bad"] = {"algorithm": "fedavg", "sweep": {"training.lr": [0.1, -1.0]}}
    s["grid"].append({"settings": ["niid1"], "methods": ["bad"]})
    with pytest.raises(ConfigError, match=r"methods.bad-lrm1.0.training.lr: -1.0 is less than or equal"):
        resolve_config(config)


def test_a_hetero_study_runs_per_client_model_groups_with_its_own_methods(config):
    s = resolve_config(config)["studies"]
    assert s["feddisco"]["federation"] == "sync"  # the schema default
    spec = run_spec(s["fedl2g"], "pat", "fedl2g_f")
    assert spec["federation"] == "hetero" and spec["model"] == "tiny4" and spec["algorithm"] == "fedl2g_f"
    assert spec["hparams"]["server_lr"] == 100.0 and spec["training"]["momentum"] == 0.0


def test_each_scale_has_its_own_results_root():
    embedded = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert resolve_config(embedded)["results_dir"] == "results"
    assert resolve_config(laptop_full_config())["results_dir"] == "results/laptop-full"
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    assert paper["scale"] == "paper" and paper["results_dir"] == "results/paper"


@pytest.mark.parametrize("scale, root, study, expected", [
    ("paper", "results", "feddisco", "results_dir: 'results' is the embedded default's results root"),
    ("paper", "./results/", "feddisco", "is the embedded default's results root"),
    ("paper", None, "feddisco", "results_dir: 'results' is the embedded default's results root"),
    ("embedded", "results/paper", "feddisco", "results_dir: 'results/paper' is the paper scale's results root"),
    ("embedded", None, "paper", "studies.paper: this study's results folder results/paper is the paper scale's"),
])
def test_a_config_sharing_the_other_scales_results_root_is_refused(config, scale, root, study, expected):
    bad = {**copy.deepcopy(config), "scale": scale, "studies": {study: config["studies"]["feddisco"]}}
    bad.pop("results_dir", None)
    if root:
        bad["results_dir"] = root
    with pytest.raises(ConfigError, match=re.escape(expected)):
        resolve_config(bad)


def test_a_key_given_twice_in_a_study_file_is_refused_naming_it(tmp_path) -> None:
    from fedrepro.config import load_yaml
    from fedrepro.study import ConfigError

    path = tmp_path / "study.yaml"
    path.write_text("base: &b {rounds: 2, lr: 0.1}\ndefaults: {<<: *b, lr: 0.2}\n"  # an override of a merge is fine
                    "tables:\n  t1:\n    deviations: [D-a]\n    deviations: [D-b]\n")
    with pytest.raises(ConfigError, match=r"not valid YAML: key 'deviations' given twice \(first at line 5\)"):
        load_yaml(path)
    path.write_text("base: &b {rounds: 2, lr: 0.1}\ndefaults: {<<: *b, lr: 0.2}\n")
    assert load_yaml(path)["defaults"] == {"rounds": 2, "lr": 0.2}


def test_laptop_full_runs_feddisco_and_feddle_on_fashion_mnist_as_the_papers() -> None:
    from fedrepro.config import resolve_config
    from fedrepro.study import run_training

    # what Snakemake does with --configfile: a study given as a file replaces the default's inline one
    cfg = resolve_config(laptop_full_config(inline=False), root=REPO)
    assert cfg["results_dir"] == "results/laptop-full"
    assert sorted(cfg["studies"]) == ["feddisco", "feddle-fmnist", "fedgtst", "fedl2g"]
    disco = cfg["studies"]["feddisco"]
    for name, clients in (("niid1", 10), ("niid2", 6)):
        setting = disco["settings"][name]
        assert setting["dataset"] == "fashion_mnist" and setting["model"] == "simple_cnn"
        assert "image_size" not in setting and setting["partition"]["clients"] == clients
        training = run_training(disco, name, "fedavg")
        assert (training["lr"], training["momentum"], training["weight_decay"], training["batch_size"]) == (
            0.01, 0.9, 1.0e-5, 64)
    rows = {r["method"]: r for r in disco["tables"]["table1"]["rows"]}
    assert "scaffold-disco" in rows  # the paper's FedDisco row on Fashion-MNIST
    # Table 5 on Fashion-MNIST: the paper's 500 clients, 10 a round, N(20) as 10% of the rounds
    fm = cfg["studies"]["feddle-fmnist"]
    (name, setting), = fm["settings"].items()
    assert setting["dataset"] == "fashion_mnist" and setting["partition"]["clients"] == 500
    training = run_training(fm, name, "fedavg")
    assert training["join_ratio"] * 500 == 10 and setting["async"]["delay_sigma"] == 0.10 * training["rounds"]


def test_config_files_merge_as_snakemake_merges_them(tmp_path):
    """--configfile a b: mappings merge key by key, anything else (a study's file path) replaces."""
    from fedrepro.config import merge_configfiles

    (tmp_path / "a.yaml").write_text("train_resources: {gpu: 0, threads: 1}\nstudies: {s: {seeds: [0]}, t: {}}\n")
    (tmp_path / "b.yaml").write_text("train_resources: {gpu: 1}\nstudies: {s: config/s.yaml}\n")
    merged = merge_configfiles(tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert merged == {"train_resources": {"gpu": 1, "threads": 1}, "studies": {"s": "config/s.yaml", "t": {}}}


def test_a_study_file_extends_another_as_a_merge_patch(tmp_path):
    """`extends:` (fedrepro.config.load_study_file): mappings merge key by key, null removes a key, any other value
    (lists included) replaces; a chain resolves in order, a loop is refused naming it."""
    from fedrepro.config import load_study_file

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "paper.yaml").write_text(yaml.safe_dump({
        "seeds": [0, 1, 2], "defaults": {"rounds": 100, "lr": 0.01},
        "methods": {"a": {"algorithm": "fedavg", "hparams": {"x": 1}}, "b": {"algorithm": "fedprox"}},
        "grid": [{"settings": ["s"], "methods": ["a", "b"]}]}))
    (tmp_path / "laptop.yaml").write_text(yaml.safe_dump({
        "extends": "base/paper.yaml", "defaults": {"rounds": 20}, "methods": {"b": None, "a": {"hparams": {"y": 2}}},
        "grid": [{"settings": ["s"], "methods": ["a"]}]}))
    study = load_study_file(tmp_path / "laptop.yaml")
    assert study == {"seeds": [0, 1, 2], "defaults": {"rounds": 20, "lr": 0.01},
                     "methods": {"a": {"algorithm": "fedavg", "hparams": {"x": 1, "y": 2}}},
                     "grid": [{"settings": ["s"], "methods": ["a"]}]}
    (tmp_path / "smaller.yaml").write_text(yaml.safe_dump({"extends": "laptop.yaml", "seeds": [0]}))
    assert load_study_file(tmp_path / "smaller.yaml")["seeds"] == [0]
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump({"extends": "loop.yaml"}))
    with pytest.raises(ConfigError, match="loop.yaml: extends itself through"):
        load_study_file(tmp_path / "loop.yaml")


def test_the_600_round_study_is_laptop_fulls_feddle_study_with_only_its_reductions():
    """config/laptop/feddle-fmnist-600.yaml extends feddle-fmnist.yaml: a change there reaches it."""
    six, full = (resolve_config(yaml.safe_load((REPO / "config" / f).read_text()), root=REPO)["studies"]
                 for f in ("laptop-feddle-600.yaml", "laptop-full.yaml"))
    six, base = six["feddle-fmnist-600"], full["feddle-fmnist"]
    spec = run_spec(six, "fm-d01-n20", "fedbuff")
    assert spec["training"] == {**run_spec(base, "fm-d01-n20", "fedbuff")["training"], "rounds": 600,
                                "lr_decay": 0.1, "lr_decay_every": 200}
    assert six["settings"] == base["settings"] and six["async"] == base["async"]
    assert sorted(six["methods"]) == ["ca2fl", "fedasync", "fedavg", "fedbuff"]


def test_the_widths_probe_is_table5s_tuned_fedbuff_with_only_the_models_widths_changed():
    """config/laptop/feddle-table5-widths.yaml (issue 49's probe) trains FedBuff with the values Table 5's tuning
    chose (the committed snapshot's choices) on Table 5's D(0.1) settings, at two widths of Feddle's CNN."""
    from fedrepro.tuning import apply_choices

    probe = resolve_config(yaml.safe_load((REPO / "config" / "laptop-feddle-table5-widths.yaml").read_text()),
                           root=REPO)["studies"]["feddle-table5-widths"]
    table5 = resolve_config(yaml.safe_load((REPO / "config" / "laptop-feddle-table5.yaml").read_text()),
                            root=REPO)["studies"]["feddle-table5"]
    assert probe["seeds"] == table5["seeds"] == [0, 1, 2]
    tuning = REPO / "docs" / "results" / "laptop-feddle-table5" / "feddle-table5" / "tuning"
    clients = json.loads((tuning / "clients.json").read_text())["chosen"]["fedavg"]["values"]
    fedbuff_tuned = (tuning / "server_fedbuff.json").exists()  # held once it has run with the clients' choice
    choices = {("feddle-table5", stage): tuning / f"{stage}.json" for stage in ("clients", "server_fedbuff")}
    for setting in ("fm-d01-n20", "fm-d01-n5"):
        untuned = run_spec(table5, setting, "fedbuff")
        tuned = apply_choices(untuned, choices) if fedbuff_tuned else None
        for width, model in (("", "cnn3_small"), ("-cnn3", "cnn3")):
            spec = run_spec(probe, setting + width, "fedbuff")
            assert spec["model"] == model
            assert {f"training.{k}": spec["training"][k] for k in ("lr", "local_epochs")} == clients, (setting, width)
            for key in ("partition", "async", "dataset", "test_samples", "weighting"):
                assert spec[key] == untuned[key], (setting, width, key)
            for key in ("training", "hparams"):
                assert tuned is None or spec[key] == tuned[key], (setting, width, key)
