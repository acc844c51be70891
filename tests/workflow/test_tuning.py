"""The tuning stage (fedrepro.tuning, workflow/rules/tune.smk): a study's tuning stages become studies of their own,
every grid point is scored by the study's metric over the tuning settings and seeds, each method's best point is
chosen by a stated rule, and the choice reaches the later stages and the study's own runs, again when it changes.
A study run in parts keeps its finished seeds in an archive (fedrepro.report.archive) that a new machine restores
without training any of them again."""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.common import REPO

from fedrepro.config import resolve_config
from fedrepro.report.archive import INDEX, archive_problems, finished_seeds, restore, save
from fedrepro.study import ConfigError, grid_runs, run_spec
from fedrepro.tuning import TuningError, apply_choices, choose, grid_edges, point_scores, tuned_digest, write_choice

STUDY = REPO / "tests" / "data" / "tuning_study.yaml"


def resolved(study: dict | None = None) -> dict:
    return resolve_config({"studies": {"tiny": study or yaml.safe_load(STUDY.read_text())}})


# ---------------------------------------------------------------- the stages as studies of their own


def test_each_stage_is_a_study_of_its_grid_on_the_tuning_seeds_with_the_earlier_choices():
    config = resolved()
    stages = config["tuning_studies"]
    assert list(stages) == ["tiny--tune-clients", "tiny--tune-prox"]
    clients, prox = stages.values()
    assert clients["seeds"] == prox["seeds"] == [10] and list(clients["settings"]) == ["iid"]
    assert sorted(clients["methods"]) == ["fedavg-lr0.001", "fedavg-lr0.1"] and not clients["tables"]
    assert run_spec(clients, "iid", "fedavg-lr0.1")["training"]["lr"] == 0.1
    assert "tuned" not in run_spec(clients, "iid", "fedavg-lr0.1")  # the first stage trains with nothing tuned
    # the second stage's points train with the first stage's choice of the clients' lr
    assert run_spec(prox, "iid", "fedprox-mu1.0")["tuned"] == [{"study": "tiny", "stage": "clients", "method": "*"}]
    assert run_spec(prox, "iid", "fedprox-mu1.0")["hparams"]["mu"] == 1.0
    # and the study's own runs with every stage that applies to their method
    own = config["studies"]["tiny"]
    assert run_spec(own, "iid", "fedavg")["tuned"] == [{"study": "tiny", "stage": "clients", "method": "*"}]
    assert run_spec(own, "iid", "fedprox")["tuned"] == [{"study": "tiny", "stage": "clients", "method": "*"},
                                                          {"study": "tiny", "stage": "prox", "method": "fedprox"}]
    assert config["studies"]["tiny"]["seeds"] == [0, 1]


def test_a_method_tuned_as_another_trains_with_that_methods_choices():
    """Feddle's Table 3 rows take Feddle's tuned server values: a `tuned_as` method reads the stage's choice for the
    method it names, and the clients' choice as every method does."""
    study = yaml.safe_load(STUDY.read_text())
    study["methods"]["fedprox-ablated"] = {"algorithm": "fedprox", "label": "FedProx, ablated", "tuned_as": "fedprox"}
    # a swept method taking another's values: each of its variants does (FedDisco's MOON + Disco (a, b) grid)
    study["methods"]["fedprox-swept"] = {"algorithm": "fedprox", "label": "FedProx, swept", "tuned_as": "fedprox",
                                         "sweep": {"training.batch_size": [16, 32]}}
    study["grid"].append({"settings": ["iid"], "methods": ["fedprox-swept"]})
    own = resolved(study)["studies"]["tiny"]
    for method in ("fedprox-ablated", "fedprox-swept-batch_size16", "fedprox-swept-batch_size32"):
        assert run_spec(own, "iid", method)["tuned"] == [
            {"study": "tiny", "stage": "clients", "method": "*"},
            {"study": "tiny", "stage": "prox", "method": "fedprox"}], method


def _with_ablated(**entry):
    def edit(study):
        study["methods"]["ablated"] = {"algorithm": "fedprox", **entry}
    return edit


def _without_tuning(study):
    del study["tuning"]
    study["methods"]["ablated"] = {"algorithm": "fedprox", "tuned_as": "fedprox"}


def _ablated_in_a_grid(study):
    _with_ablated(tuned_as="fedprox")(study)
    study["tuning"]["stages"][1]["grids"]["ablated"] = {"hparams.mu": [0.5]}


@pytest.mark.parametrize("edit, message", [
    (_with_ablated(tuned_as="fedprx"), "methods.ablated.tuned_as: unknown method 'fedprx' (did you mean 'fedprox'?)"),
    (_with_ablated(tuned_as="fedavg"), "tuning.stages: methods.ablated.tuned_as: 'fedavg' is tuned by no stage's grid"),
    (_with_ablated(tuned_as="fedprox", hparams={"mu": 0.5}),
     "tuning.stages: methods.ablated: ['hparams.mu'] are set by the method and chosen by a tuning stage"),
    (_ablated_in_a_grid, "tuning.stages: methods.ablated.tuned_as: the method is in a stage's grid itself"),
    (_without_tuning, "methods.ablated.tuned_as: the study has no `tuning` block"),
    (lambda s: s["tuning"].update(seeds=[1, 10]), "tuning.seeds: [1] are reported seeds of the study"),
    (lambda s: s["tuning"].update(settings=["iidd"]), "tuning.settings: unknown setting 'iidd' (did you mean 'iid'?)"),
    (lambda s: s["tuning"]["stages"][1]["grids"].update(fedprx={"hparams.mu": [1.0]}),
     "tuning.stages.1.grids.fedprx: unknown method 'fedprx'"),
    (lambda s: s["tuning"]["stages"][0]["grids"]["fedavg"].update({"hparams.x": [1]}),
     "a stage that applies to all methods tunes one method's training keys"),
    (lambda s: s["tuning"]["stages"][1]["grids"]["fedprox"].update({"training.lr": [0.5]}),
     "tuning.stages.1.grids.fedprox: ['training.lr'] were chosen by an earlier stage for this method"),
    (lambda s: s["methods"]["fedprox"].update(training={"lr": 0.2}),
     "tuning.stages: methods.fedprox: ['training.lr'] are set by the method and chosen by a tuning stage"),
])
def test_a_tuning_that_cannot_say_what_its_runs_train_with_is_refused_naming_the_key(edit, message):
    study = yaml.safe_load(STUDY.read_text())
    edit(study)
    with pytest.raises(ConfigError, match=_escaped(message)):
        resolved(study)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


# ---------------------------------------------------------------- scoring and choosing

STAGE = {"study": "s", "stage": "server", "applies_to": "own", "metric": "best_acc", "settings": ["a", "b"],
         "seeds": [7, 8],
         "variants": {"m-x1": {"method": "m", "values": {"hparams.x": 1}},
                      "m-x2": {"method": "m", "values": {"hparams.x": 2}},
                      "m-x3": {"method": "m", "values": {"hparams.x": 3}},
                      "n-y1": {"method": "n", "values": {"hparams.y": 1}}}}


def frames(best: dict[str, list[float]], diverged: set[tuple[str, str, int]] = frozenset()):
    """(runs, summary) of the stage's runs: best accuracy per variant over (a, 7), (a, 8), (b, 7), (b, 8)."""
    rows = []
    for variant, values in best.items():
        for (setting, seed), value in zip([("a", 7), ("a", 8), ("b", 7), ("b", 8)], values, strict=True):
            status = "diverged" if (variant, setting, seed) in diverged else "complete"
            rows.append({"study": "s", "setting": setting, "method": variant, "seed": seed, "status": status,
                         "best_acc": value, "last_k": 2})
    summary = pd.DataFrame(rows)
    runs = summary.assign(round=1, test_acc=summary["best_acc"])[["study", "setting", "method", "seed", "round",
                                                                  "test_acc"]]
    return runs, summary


def test_a_point_scores_its_metric_averaged_over_every_setting_and_seed_and_the_best_is_chosen():
    runs, summary = frames({"m-x1": [60, 62, 70, 72], "m-x2": [61, 63, 71, 77], "m-x3": [90, 90, 10, 10],
                            "n-y1": [50, 50, 50, 50]})
    scores = point_scores(STAGE, runs, summary)
    assert scores.set_index("variant")["score"].to_dict() == {"m-x1": 66.0, "m-x2": 68.0, "m-x3": 50.0,
                                                               "n-y1": 50.0}
    assert scores.set_index("variant").loc["m-x3", "score[a]"] == 90.0  # a column alone would have picked it
    chosen = choose(STAGE, scores)
    assert chosen == {"m": {"variant": "m-x2", "values": {"hparams.x": 2}, "score": 68.0},
                      "n": {"variant": "n-y1", "values": {"hparams.y": 1}, "score": 50.0}}


def test_equal_scores_choose_the_first_point_and_a_diverged_run_is_never_chosen():
    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [60] * 4, "m-x3": [99] * 4, "n-y1": [50] * 4},
                           diverged={("m-x3", "b", 8)})
    scores = point_scores(STAGE, runs, summary)
    assert math.isnan(scores.set_index("variant").loc["m-x3", "score"])
    assert choose(STAGE, scores)["m"]["variant"] == "m-x1"
    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [60] * 4, "m-x3": [99] * 4, "n-y1": [50] * 4},
                           diverged={(v, "a", 7) for v in ("m-x1", "m-x2", "m-x3")})
    with pytest.raises(TuningError, match="every grid point of m has a diverged run"):
        choose(STAGE, point_scores(STAGE, runs, summary))


def test_a_point_missing_a_run_is_refused_by_name():
    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [60] * 4, "m-x3": [99] * 4, "n-y1": [50] * 4})
    keep = ~((summary["method"] == "m-x2") & (summary["setting"] == "b") & (summary["seed"] == 8))
    with pytest.raises(TuningError, match="grid point m-x2 has no run of b seed 8"):
        point_scores(STAGE, runs[keep.to_numpy()], summary[keep])


def test_a_choice_on_its_grids_edge_is_said_so_in_the_table_and_one_inside_it_is_not(tmp_path):
    two_keys = {"study": "s", "stage": "clients", "applies_to": "all", "metric": "best_acc", "settings": ["a", "b"],
                "seeds": [7, 8],
                "variants": {f"m-lr{lr}-e{e}": {"method": "m", "values": {"training.lr": lr, "training.epochs": e}}
                             for lr in (0.1, 0.3, 1.0) for e in (1, 2, 5)}}
    assert grid_edges(two_keys, "m", {"training.lr": 1.0, "training.epochs": 2}) == {"training.lr": "largest"}
    assert grid_edges(two_keys, "m", {"training.lr": 0.3, "training.epochs": 1}) == {"training.epochs": "smallest"}
    assert grid_edges(two_keys, "m", {"training.lr": 0.3, "training.epochs": 2}) == {}
    # one value, or words, have no edge to widen
    assert grid_edges(STAGE, "n", {"hparams.y": 1}) == {}
    words = {**STAGE, "variants": {"m-a": {"method": "m", "values": {"hparams.form": "mix"}},
                                   "m-b": {"method": "m", "values": {"hparams.form": "update"}}}}
    assert grid_edges(words, "m", {"hparams.form": "mix"}) == {}

    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [70] * 4, "m-x3": [75] * 4, "n-y1": [50] * 4})
    write_choice(STAGE, runs, summary, tmp_path / "c.json", tmp_path / "c.csv", tmp_path / "edge.md")
    assert "grid's edge (hparams.x: the largest tried)" in (tmp_path / "edge.md").read_text()
    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [70] * 4, "m-x3": [65] * 4, "n-y1": [50] * 4})
    write_choice(STAGE, runs, summary, tmp_path / "c.json", tmp_path / "c.csv", tmp_path / "inside.md")
    assert "edge" not in (tmp_path / "inside.md").read_text()


def test_the_choice_reaches_a_run_spec_and_its_fingerprint(tmp_path):
    runs, summary = frames({"m-x1": [60] * 4, "m-x2": [70] * 4, "m-x3": [65] * 4, "n-y1": [50] * 4})
    out = tmp_path / "server.json"
    write_choice(STAGE, runs, summary, out, tmp_path / "server.csv", tmp_path / "server.md")
    assert "| **2** | **70.00** |" in (tmp_path / "server.md").read_text()
    assert len(pd.read_csv(tmp_path / "server.csv")) == 4  # every grid point's score is kept
    spec = {"study": "s", "setting": "a", "method": "m", "hparams": {"x": 0}, "training": {"lr": 0.1},
            "tuned": [{"study": "s", "stage": "server", "method": "m"}]}
    tuned = apply_choices(spec, {("s", "server"): out})
    assert tuned["hparams"] == {"x": 2} and spec["hparams"] == {"x": 0}  # the spec handed in is left as it was
    assert tuned["tuned"] == [{"study": "s", "stage": "server", "method": "m", "values": {"hparams.x": 2}}]
    again = json.loads(out.read_text())
    again["chosen"]["m"]["values"] = {"hparams.x": 3}
    out.write_text(json.dumps(again))
    retuned = apply_choices(spec, {("s", "server"): out})
    assert retuned["hparams"] == {"x": 3} and tuned_digest(retuned) != tuned_digest(tuned)
    assert apply_choices({"hparams": {}}, {}) == {"hparams": {}}  # nothing tuned: as it is
    with pytest.raises(TuningError, match="no choice for method 'q'"):
        apply_choices({**spec, "tuned": [{"study": "s", "stage": "server", "method": "q"}]}, {("s", "server"): out})


def test_a_tuning_per_model_chooses_for_each_model_from_its_own_settings_and_a_run_takes_its_models(tmp_path):
    """Feddle's App. D tunes on CIFAR-10 for each architecture and applies the choice to every data set with that
    architecture: a stage chosen `per: model` scores each point over the tuning settings of one model only, and a
    run takes the choice of its own setting's model."""
    stage = {**STAGE, "per": "model", "groups": {"cnn": ["a"], "mlp": ["b"]}}
    runs, summary = frames({"m-x1": [60, 62, 70, 72], "m-x2": [61, 63, 71, 77], "m-x3": [90, 90, 10, 10],
                            "n-y1": [50, 50, 50, 50]})
    scores = point_scores(stage, runs, summary)
    assert scores.set_index(["group", "variant"])["score"].to_dict() == {
        ("cnn", "m-x1"): 61.0, ("cnn", "m-x2"): 62.0, ("cnn", "m-x3"): 90.0, ("cnn", "n-y1"): 50.0,
        ("mlp", "m-x1"): 71.0, ("mlp", "m-x2"): 74.0, ("mlp", "m-x3"): 10.0, ("mlp", "n-y1"): 50.0}
    # over both settings together m-x2 would win (68 against 50): each model has its own winner
    assert {g: picks["m"]["variant"] for g, picks in choose(stage, scores).items()} == {"cnn": "m-x3", "mlp": "m-x2"}

    out = tmp_path / "server.json"
    write_choice(stage, runs, summary, out, tmp_path / "server.csv", tmp_path / "server.md")
    choice = json.loads(out.read_text())
    assert choice["per"] == "model" and choice["groups"] == {"cnn": ["a"], "mlp": ["b"]}
    table = (tmp_path / "server.md").read_text()
    assert "## m, model cnn" in table and "| **3** | **90.00** | **90.00** | **0 of 2** |" in table
    assert "## m, model mlp" in table and "| **2** | **74.00** | **74.00** | **0 of 2** |" in table
    spec = {"study": "s", "setting": "b", "method": "m", "hparams": {"x": 0},
            "tuned": [{"study": "s", "stage": "server", "method": "m", "group": "mlp"}]}
    on_mlp = apply_choices(spec, {("s", "server"): out})
    assert on_mlp["hparams"] == {"x": 2} and on_mlp["tuned"][0]["group"] == "mlp"
    on_cnn = apply_choices({**spec, "tuned": [{**spec["tuned"][0], "group": "cnn"}]}, {("s", "server"): out})
    assert on_cnn["hparams"] == {"x": 3} and tuned_digest(on_cnn) != tuned_digest(on_mlp)
    with pytest.raises(TuningError, match="no choice for model 'vit' .*needs a tuning setting of its model"):
        apply_choices({**spec, "tuned": [{**spec["tuned"][0], "group": "vit"}]}, {("s", "server"): out})


def _two_models(tuned_on: list[str]):
    def edit(study):
        study["settings"]["iid-lenet"] = {**study["settings"]["iid"], "label": "digits IID, LeNet", "model": "lenet5"}
        study["grid"] = [{"settings": ["iid", "iid-lenet"], "methods": ["fedavg", "fedprox"]}]
        study["tuning"].update(settings=tuned_on, per="model")
    return edit


def test_a_run_of_a_tuning_per_model_names_its_settings_model_and_a_model_without_tuning_setting_is_refused():
    study = yaml.safe_load(STUDY.read_text())
    _two_models(["iid", "iid-lenet"])(study)
    config = resolved(study)
    own, clients = config["studies"]["tiny"], config["tuning_studies"]["tiny--tune-clients"]
    assert run_spec(own, "iid-lenet", "fedprox")["tuned"] == [
        {"study": "tiny", "stage": "clients", "method": "*", "group": "lenet5"},
        {"study": "tiny", "stage": "prox", "method": "fedprox", "group": "lenet5"}]
    assert run_spec(own, "iid", "fedavg")["tuned"] == [{"study": "tiny", "stage": "clients", "method": "*",
                                                         "group": "simple_cnn"}]
    assert "tuned" not in run_spec(clients, "iid-lenet", "fedavg-lr0.1")
    prox = config["tuning_studies"]["tiny--tune-prox"]
    assert run_spec(prox, "iid", "fedprox-mu1.0")["tuned"][0]["group"] == "simple_cnn"

    study = yaml.safe_load(STUDY.read_text())
    _two_models(["iid"])(study)
    with pytest.raises(ConfigError, match=_escaped("tuning.per: grid.0: setting iid-lenet's model 'lenet5' has no "
                                                   "tuning setting, so its tuned runs (fedavg, fedprox) would have no "
                                                   "choice; tuning settings' models: ['simple_cnn']")):
        resolved(study)


# ---------------------------------------------------------------- through Snakemake


def snakemake(root: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
                           "--directory", str(root), "--configfile", str(root / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def final_runs(res: Path) -> dict[str, dict]:
    return {f"{m}/{s}": json.loads((res / f"runs/iid/{m}/seed{s}/summary.json").read_text())
            for m in ("fedavg", "fedprox") for s in (0, 1)}


def configured(root: Path, study: Path = STUDY) -> Path:
    """``root`` (made if missing) holding ``study`` as study.yaml and a config.yaml that names it, for snakemake."""
    root.mkdir(parents=True, exist_ok=True)
    if study != root / "study.yaml":
        shutil.copy(study, root / "study.yaml")
    (root / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(root / "study.yaml")}}))
    return root


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory) -> Path:
    """tests/data/tuning_study.yaml run through Snakemake: its two stages (4 grid points of 1 seed) and the study's own
    2 jobs of 2 seeds. Read only: a test that changes it works on a copy."""
    root = configured(tmp_path_factory.mktemp("tuned") / "tune")
    snakemake(root)
    return root


@pytest.mark.slow
def test_the_stages_choices_reach_the_final_runs_and_a_changed_choice_trains_them_again(tuned_run, tmp_path):
    root = tmp_path / "tune"
    shutil.copytree(tuned_run, root)  # mtimes and Snakemake's records too: nothing is out of date
    configured(root, root / "study.yaml")
    res = root / "results" / "tiny"
    clients = json.loads((res / "tuning/clients.json").read_text())
    prox = json.loads((res / "tuning/prox.json").read_text())
    assert clients["chosen"]["fedavg"]["values"] == {"training.lr": 0.1}  # 0.001 barely moves in 3 rounds
    mu = prox["chosen"]["fedprox"]["values"]["hparams.mu"]
    assert "| **0.1** |" in (res / "tuning/clients.md").read_text()
    # the second stage trained with the first stage's choice
    second = json.loads((root / "results/tiny--tune-prox/runs/iid/fedprox-mu1.0/seed10/summary.json").read_text())
    assert second["config"]["training"]["lr"] == 0.1 and second["config"]["hparams"]["mu"] == 1.0
    before = final_runs(res)
    for key, run in before.items():
        assert run["config"]["training"]["lr"] == 0.1, key
    assert before["fedprox/0"]["config"]["hparams"]["mu"] == mu

    # the first stage's grid changes: its choice does, and every run after it trains again with the new one
    study = yaml.safe_load((root / "study.yaml").read_text())
    study["tuning"]["stages"][0]["grids"]["fedavg"]["training.lr"] = [0.02]
    (root / "study.yaml").write_text(yaml.safe_dump(study))
    snakemake(root)
    assert json.loads((res / "tuning/clients.json").read_text())["chosen"]["fedavg"]["values"] == {"training.lr": 0.02}
    after = final_runs(res)
    for key, run in after.items():
        assert run["config"]["training"]["lr"] == 0.02, key
        assert run["best_acc"] != before[key]["best_acc"] or run["final_acc"] != before[key]["final_acc"], key
    second = json.loads((root / "results/tiny--tune-prox/runs/iid/fedprox-mu1.0/seed10/summary.json").read_text())
    assert second["config"]["training"]["lr"] == 0.02
    assert copy.deepcopy(after["fedprox/1"]["config"]["tuned"][0]["values"]) == {"training.lr": 0.02}


def test_feddles_table5_study_tunes_every_method_by_app_d_and_then_runs_all_four_columns():
    """config/laptop-feddle-table5.yaml: the clients' policy on FedAvg for every method, then each method's App. D
    grid, on a seed no table reports; no method keeps a value the tuning chooses; the table has all four columns."""
    config = resolve_config(yaml.safe_load((REPO / "config" / "laptop-feddle-table5.yaml").read_text()), root=REPO)
    study = config["studies"]["feddle-table5"]
    stages = {name.split("--tune-")[1]: s for name, s in config["tuning_studies"].items()
              if name.startswith("feddle-table5--tune-")}
    assert set(study["tuning"]["seeds"]).isdisjoint(study["seeds"])
    assert len(stages.pop("clients")["methods"]) == 16  # 4 lrs x 4 epochs
    # each method's App. D grid is a stage of its own, so its choice waits on no other method's grid (FedAsync's
    # other reading, the update applied, has the same grid)
    assert len(stages) == 10 and all(len(s["sweeps"]) == 1 and len(s["methods"]) == 9 for s in stages.values())
    for method in ("fedbuff", "ca2fl", "fedasync", "feddle", "center"):
        assert not run_spec(study, "fm-d03-n5", method)["hparams"].keys() & {"server_lr", "buffer_size", "a",
                                                                             "alpha", "lr", "epochs"}
    assert [c["setting"] for c in study["tables"]["table5"]["columns"]] == ["fm-d01-n20", "fm-d01-n5",
                                                                           "fm-d03-n20", "fm-d03-n5"]
    assert run_spec(study, "fm-d03-n5", "fedavg")["async"]["delay_sigma"] == 5.0
    # Table 3's rows vary one component of Feddle at the server values tuned for Feddle-ID or Feddle-OOD
    for row, tuned_like in (("feddle-base", "feddle"), ("feddle-reg", "feddle"), ("feddle-base-ood", "feddle-reg-ood"),
                            ("feddle-imp-ood", "feddle-reg-ood")):
        spec = run_spec(study, "fm-d01-n20", row)
        stage = "server_" + {"feddle": "feddle", "feddle-reg-ood": "feddle_ood"}[tuned_like]
        assert spec["tuned"] == [{"study": "feddle-table5", "stage": "clients", "method": "*"},
                                 {"study": "feddle-table5", "stage": stage, "method": tuned_like}], row
        assert not spec["hparams"].keys() & {"lr", "epochs"}, row
    assert {"table3", "table6"} <= set(study["tables"]) and {"fig2", "fig7"} <= set(study["figures"])


def test_the_papers_own_grids_run_at_paper_scale_and_every_variant_of_a_tuned_method_takes_its_choice():
    """config/paper-tuned.yaml: FedL2G's eta_s searched over the paper's nine values on Cifar100 Dirichlet HtFE8
    (Sec. 5), FedDisco's baselines over App. B.1.5's grids (FedAvgM's dampening tied to its beta) on CIFAR-10
    NIID-1 and NIID-2, FedGTST's xi over its three values by the target accuracy on Table 4's columns, on a seed no
    table reports, each method choosing its own; every run of a tuned method, its
    variants included (FedL2G's E variants, the + Disco rows, MOON + Disco's swept (a, b) grid), trains with that
    choice and sets no value of its own; the other runs are the paper-scale studies' as they are."""
    from fedrepro.config import command_config, run_studies
    from fedrepro.preflight import job_groups, shape_key

    config = command_config([str(REPO / "config" / "paper.yaml"), str(REPO / "config" / "paper-tuned.yaml")])
    plain = command_config([str(REPO / "config" / "paper.yaml")])["studies"]
    assert sorted(config["studies"]) == ["feddisco", "feddle", "fedgtst", "fedl2g"]
    assert config["results_dir"] == "results/paper-tuned"
    eta = [0.01, 0.05, 0.1, 0.5, 1.0, 10.0, 50.0, 100.0, 500.0]
    beta = [0.3, 0.5, 0.7, 0.9]  # FedAvgM's dampening tied to it (same_as), as FedDisco's code has it
    grids = {("fedl2g", "server_lr"): {"fedl2g_l": {"hparams.server_lr": eta}, "fedl2g_f": {"hparams.server_lr": eta}},
             ("feddisco", "fedavgm_beta"): {"fedavgm": {"hparams.beta": beta, "hparams.dampening": beta}},
             ("feddisco", "fedprox_mu"): {"fedprox": {"hparams.mu": [0.001, 0.01, 0.1, 1.0]}},
             ("feddisco", "feddyn_alpha"): {"feddyn": {"hparams.alpha": [0.001, 0.01, 0.1, 1.0]}},
             ("feddisco", "moon_mu"): {"moon": {"hparams.mu": [0.01, 0.1, 0.5, 1.0, 5.0]}},
             ("feddisco", "feddc_alpha"): {"feddc": {"hparams.alpha": [0.001, 0.01, 0.1, 1.0]}},
             ("fedgtst", "xi"): {"fedgtst": {"hparams.xi": [1.0e-4, 5.0e-4, 1.0e-3]}}}
    settings = {"fedl2g": ["c100-dir"], "feddisco": ["c10-niid1", "c10-niid2"],
                "fedgtst": ["cs-lenet-k100-p10", "cs-lenet-k100-p100"]}  # Table 4's columns, scored after fine-tuning
    assert config["studies"]["fedgtst"]["tuning"]["metric"] == "target_acc"
    tuned_by = {}  # a tuned study method -> (its stage, the keys the stage chooses)
    for (name, stage_name), stage_grids in grids.items():
        study, stage = config["studies"][name], config["tuning_studies"][f"{name}--tune-{stage_name}"]
        assert set(study["tuning"]["seeds"]).isdisjoint(study["seeds"]) and list(stage["settings"]) == settings[name]
        assert {m: {k: [p["values"][k] for p in points] for k in points[0]["values"]}
                for m, points in stage["sweeps"].items()} == stage_grids
        tuned_by |= {m: (stage_name, [key.split(".")[1] for key in grid]) for m, grid in stage_grids.items()}
    # FedGTST's xi comparison (Tables 4, 5, Figs. 1, 2) keeps its 5e-4 runs as a method of their own
    untuned_as = {("fedgtst", "fedgtst-xi5e-4"): "fedgtst"}
    for name in ("feddisco", "fedl2g", "fedgtst"):
        study = config["studies"][name]
        for setting, method in grid_runs(study):
            spec = run_spec(study, setting, method)
            if (name, method) in untuned_as:
                assert spec == {**run_spec(plain[name], setting, untuned_as[name, method]), "method": method}
                continue
            base = next((m for m in sorted(tuned_by, key=len, reverse=True)
                         if method == m or (method.startswith(f"{m}-") and name != "fedgtst")), None)
            if base is None:
                assert spec == run_spec(plain[name], setting, method), method
                continue
            stage_name, keys = tuned_by[base]
            assert spec["tuned"] == [{"study": name, "stage": stage_name, "method": base}], method
            assert not set(keys) & set(spec["hparams"]), method
    # no job of a new shape: the paper-scale preflight (config/paper.yaml's shapes) already ran every one of them
    paper_shapes = {group.key for group in job_groups(command_config([str(REPO / "config" / "paper.yaml")]))}
    assert {shape_key(run_spec(study, s, m)) for study in run_studies(config).values()
            for s, m in grid_runs(study)} <= paper_shapes


def test_feddles_app_d_protocol_runs_at_paper_scale_chosen_for_each_architecture_on_its_cifar10_columns():
    """config/paper-tuned.yaml's Feddle: the clients' Adam lr and epochs on FedAvg, then App. D's grid of each
    method, chosen `per: model` on CIFAR-10's D(0.1) columns of the CNN, ResNet18 and ViT; every run of the study
    takes its own model's choices, a Table 3 / Fig. 8-9 variant those of Feddle-ID or Feddle-OOD, and sets none of
    the chosen values itself."""
    from fedrepro.config import command_config

    config = command_config([str(REPO / "config" / "paper.yaml"), str(REPO / "config" / "paper-tuned.yaml")])
    study = config["studies"]["feddle"]
    assert study["tuning"]["per"] == "model" and set(study["tuning"]["seeds"]).isdisjoint(study["seeds"])
    tuning_settings = ["c10-d01-n5", "c10-d01-n20", "c10-r18-d01-n5", "c10-r18-d01-n20", "c10-vit-d01-n5",
                       "c10-vit-d01-n20"]
    assert {study["settings"][s]["dataset"] for s in tuning_settings} == {"cifar10"}
    server = {"hparams.lr": [1.0e-5, 1.0e-4, 1.0e-3], "hparams.epochs": [1, 10, 20]}
    buffered = {"hparams.server_lr": [0.01, 0.1, 1.0], "hparams.buffer_size": [10, 20, 50]}
    grids = {"clients": ("fedavg", {"training.lr": [1.0e-4, 3.0e-4, 1.0e-3, 3.0e-3],
                                    "training.local_epochs": [1, 2, 5, 10]}),
             "server_fedasync": ("fedasync", {"hparams.a": [0.1, 0.5, 0.9], "hparams.alpha": [0.2, 0.4, 0.8]}),
             "server_fedbuff": ("fedbuff", buffered), "server_ca2fl": ("ca2fl", buffered),
             "server_center": ("center", {"hparams.lr": [1.0e-5, 1.0e-4, 1.0e-3], "hparams.epochs": [10, 20, 50]}),
             "server_fedft": ("fedft", server), "server_feddle": ("feddle", server),
             "server_feddle_ood": ("feddle-reg-ood", server), "server_feddf_id": ("feddf-id", server),
             "server_feddf_ood": ("feddf-ood", server)}
    for name, (method, grid) in grids.items():
        stage = config["tuning_studies"][f"feddle--tune-{name}"]
        assert list(stage["settings"]) == tuning_settings, name
        points = stage["sweeps"][method]
        assert {k: list(dict.fromkeys(p["values"][k] for p in points)) for k in points[0]["values"]} == grid, name
        assert len(points) == math.prod(map(len, grid.values())), name  # every combination
    stage_of = {method: name for name, (method, _) in grids.items() if name != "clients"}
    tuned_as = {m: spec["tuned_as"] for m, spec in study["methods"].items() if spec.get("tuned_as")}
    assert {m for m, like in tuned_as.items() if like == "feddle-reg-ood"} == {
        m for m in study["methods"] if m.startswith("feddle") and m.endswith("-ood") and m != "feddle-reg-ood"}
    models = set()
    for setting, method in grid_runs(study):
        spec = run_spec(study, setting, method)
        group = spec["model"]
        models.add(group)
        like = tuned_as.get(method, method)
        expected = [{"study": "feddle", "stage": "clients", "method": "*", "group": group}]
        if like in stage_of:
            expected.append({"study": "feddle", "stage": stage_of[like], "method": like, "group": group})
            assert not {k.split(".")[1] for k in grids[stage_of[like]][1]} & set(spec["hparams"]), method
        assert spec["tuned"] == expected, (setting, method)
        assert spec["training"]["optimizer"] == "adam" and spec["training"]["momentum"] == 0.0, (setting, method)
    assert models == {study["settings"][s]["model"] for s in tuning_settings}  # every model has its choice


# ---------------------------------------------------------------- the runs' archive: a new machine resumes


def config_of(root: Path) -> dict:
    return resolve_config({"studies": {"tiny": yaml.safe_load((root / "study.yaml").read_text())}})


def train_logs(results: Path) -> dict[str, str]:
    return {p.relative_to(results).as_posix(): p.read_text() for p in sorted(results.glob("*/logs/train/*/*.log"))}


@pytest.mark.slow
def test_a_restored_archive_trains_nothing_again_and_rebuilds_the_same_choices_and_tables(tuned_run, tmp_path):
    config = config_of(tuned_run)
    results = tuned_run / "results"
    archive = tmp_path / "archive"
    outcome = save(config, results, archive)
    assert len(outcome.copied) == 8 and not outcome.refused  # 4 grid points x 1 seed, 2 jobs x 2 seeds
    assert json.loads((archive / INDEX).read_text())["count"] == 8
    assert archive_problems(config, archive) == []
    assert save(config, results, archive).unchanged == outcome.copied  # a second save changes nothing

    # a new machine: the checkout, no results root
    machine = configured(tmp_path / "machine")
    assert len(restore(config, archive, machine / "results").copied) == 8
    snakemake(machine)
    logs = train_logs(machine / "results")
    assert len(logs) == 6
    for name, log in logs.items():
        assert "not trained again" in log and "clients, model" not in log, name  # no seed trained
    for f in ("tiny/tuning/clients.json", "tiny/tuning/prox.json", "tiny/tuning/prox.csv", "tiny/tables/t1.md"):
        assert (machine / "results" / f).read_text() == (results / f).read_text(), f


@pytest.mark.slow
def test_a_damaged_seed_is_refused_by_name_and_a_finished_one_is_never_overwritten(tuned_run, tmp_path):
    config = config_of(tuned_run)
    archive = tmp_path / "archive"
    save(config, tuned_run / "results", archive)
    seeds = finished_seeds(config, archive)
    damaged = next(s for s in seeds if s.job == "tiny/iid/fedavg" and s.seed == 0)
    metrics = archive / damaged.run / "metrics.csv"
    metrics.write_text(metrics.read_text().replace("complete", "partial", 1) + "1,2\n")
    problems = archive_problems(config, archive)
    assert problems[0] == f"{metrics}: its sha256 is not the one {archive / damaged.marker} records"
    assert sorted(problems[1:]) == sorted(f"{f}: no finished seed of the config's current specs holds it" for f in (
        archive / damaged.marker, metrics, archive / damaged.run / "summary.json"))
    results = tmp_path / "results"
    outcome = restore(config, archive, results)
    assert outcome.refused == [f"{metrics}: its sha256 is not the one {archive / damaged.marker} records"]
    assert len(outcome.copied) == 7 and not (results / damaged.marker).exists()
    # a results root's own finished seed that differs is kept, not overwritten
    other = next(s for s in seeds if s.job == "tiny/iid/fedprox" and s.seed == 1)
    (results / other.run / "metrics.csv").write_text("its own run\n")
    again = restore(config, archive, results)
    assert again.differing == ["tiny/iid/fedprox seed 1"] and len(again.unchanged) == 6
    assert (results / other.run / "metrics.csv").read_text() == "its own run\n"


@pytest.mark.slow
def test_a_save_after_the_spec_changed_drops_the_older_specs_seeds(tuned_run, tmp_path):
    config = config_of(tuned_run)
    archive = tmp_path / "archive"
    save(config, tuned_run / "results", archive)
    config["studies"]["tiny"]["methods"]["fedprox"]["label"] = "FedProx"  # not in the run spec: the same jobs
    assert archive_problems(config, archive) == []
    config["studies"]["tiny"]["seeds"] = [0]  # seed 1 is no longer a run of the study
    problems = archive_problems(config, archive)
    assert any("tiny/runs/iid/fedavg/seed1/metrics.csv: no finished seed" in p for p in problems)
    assert f"{archive / INDEX}: lists tiny/iid/fedavg seed 1, which the archive does not hold" in problems
    save(config, tuned_run / "results", archive)
    assert archive_problems(config, archive) == []
    assert json.loads((archive / INDEX).read_text())["seeds"]["tiny/iid/fedavg"] == [0]
    assert not (archive / "tiny/runs/iid/fedavg/seed1").exists()


# ---------------------------------------------------------------- would fewer rounds choose the same?


def curves(points: dict[str, list[float]]):
    """(runs, summary) of STAGE's runs, one curve per variant (the same on every setting and seed), an evaluation
    every 10 rounds; the stage's metric, the max of the last 2 evaluations."""
    stage = {**STAGE, "metric": "last_k_max_acc"}
    rows, summary = [], []
    for variant, accs in points.items():
        for setting, seed in [("a", 7), ("a", 8), ("b", 7), ("b", 8)]:
            summary.append({"study": "s", "setting": setting, "method": variant, "seed": seed, "status": "complete",
                            "last_k": 2})
            rows += [{"study": "s", "setting": setting, "method": variant, "seed": seed, "round": 10 * (i + 1),
                      "test_acc": acc} for i, acc in enumerate(accs)]
    return stage, pd.DataFrame(rows), pd.DataFrame(summary)


def test_a_stage_cut_at_a_shorter_horizon_scores_each_point_on_its_curve_up_to_that_round():
    from fedrepro.tuning_horizon import horizon_table

    # m-x1 learns fast and stalls, m-x3 is slow and wins at 40 rounds: the cut at 20 ranks them in reverse
    stage, runs, summary = curves({"m-x1": [50, 60, 61, 61], "m-x2": [30, 40, 50, 65], "m-x3": [10, 20, 60, 70],
                                   "n-y1": [5, 6, 7, 8]})
    table = horizon_table(stage, runs, summary, [20]).set_index(["horizon", "method"])
    assert table.loc[(20, "m"), "chosen"] == "m-x1" and table.loc[(20, "m"), "score"] == 60
    assert table.loc[(40, "m"), "chosen"] == "m-x3" and table.loc[(40, "m"), "score"] == 70
    assert table.loc[(20, "m"), "full_choice_rank"] == 3 and table.loc[(40, "m"), "full_choice_rank"] == 1
    assert table.loc[(20, "m"), "spearman"] == pytest.approx(-1.0)
    assert table.loc[(40, "m"), "spearman"] == pytest.approx(1.0)
    with pytest.raises(TuningError, match=r"horizons \[40\] are not between 0 and the runs' 40 rounds"):
        horizon_table(stage, runs, summary, [40])
    with pytest.raises(TuningError, match="'best_acc' is not read off the curve"):
        horizon_table(STAGE, runs, summary, [20])


def test_a_stage_chosen_per_model_is_cut_for_each_model_on_its_own_settings():
    from fedrepro.tuning_horizon import horizon_table

    stage, runs, summary = curves({"m-x1": [50, 60, 61, 61], "m-x2": [30, 40, 50, 65], "m-x3": [10, 20, 60, 70],
                                   "n-y1": [5, 6, 7, 8]})
    on_b = (runs["setting"] == "b") & (runs["method"] == "m-x1")
    runs.loc[on_b, "test_acc"] += 20  # on model mlp's setting m-x1 leads at every round
    stage = {**stage, "per": "model", "groups": {"cnn": ["a"], "mlp": ["b"]}}
    table = horizon_table(stage, runs, summary, [20]).set_index(["horizon", "group", "method"])
    assert table.loc[(40, "cnn", "m"), "chosen"] == "m-x3" and table.loc[(20, "cnn", "m"), "full_choice_rank"] == 3
    assert table.loc[(40, "mlp", "m"), "chosen"] == table.loc[(20, "mlp", "m"), "chosen"] == "m-x1"
    assert table.loc[(20, "mlp", "m"), "full_choice_rank"] == 1
