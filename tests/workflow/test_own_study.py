"""A study of one's own runs alone (`studies_only`), the extending guide's example is the shipped file, and what a
method checks in its __init__ stops the run at config time, naming the method's key."""

from __future__ import annotations

import pytest
import yaml
from support.common import REPO
from support.workflow import job_counts, snakemake

from fedrepro.algorithms import ALGORITHMS
from fedrepro.algorithms.fedprox import FedProx
from fedrepro.config import load_yaml, merge_configfiles, resolve_config
from fedrepro.study import ConfigError

EXAMPLE = REPO / "config" / "examples" / "own-study.yaml"


def test_the_extending_guide_shows_the_shipped_example() -> None:
    section = (REPO / "docs" / "extending.md").read_text().split("## Running your own study")[1]
    shown = section.split("```yaml\n")[1].split("```")[0]
    assert yaml.safe_load(shown) == load_yaml(EXAMPLE)


def test_studies_only_keeps_the_named_study_its_results_root_and_turns_the_default_showcase_off() -> None:
    config = resolve_config(merge_configfiles(REPO / "config" / "config.yaml", EXAMPLE))
    assert list(config["studies"]) == ["own"]
    assert config["showcase"] is None and config["results_dir"] == "results/own"
    kept = load_yaml(REPO / "config" / "config.yaml")
    kept["studies_only"] = [kept["showcase"]["study"]]
    assert resolve_config(kept)["showcase"]["study"] == kept["showcase"]["study"]


def test_the_studies_left_out_are_not_even_validated() -> None:
    config = merge_configfiles(REPO / "config" / "config.yaml", EXAMPLE)
    other = next(name for name in config["studies"] if name != "own")
    config["studies"][other]["defaults"]["rouns"] = 3  # a typo in a study that does not run
    assert list(resolve_config(config)["studies"]) == ["own"]


def test_an_unknown_study_in_studies_only_is_named_with_a_suggestion() -> None:
    config = merge_configfiles(REPO / "config" / "config.yaml", EXAMPLE)
    config["studies_only"] = ["onw"]
    with pytest.raises(ConfigError, match=r"studies_only: unknown study 'onw' \(did you mean 'own'\?\)"):
        resolve_config(config)


def test_the_dry_run_of_the_example_has_only_its_jobs(tmp_path) -> None:
    proc = snakemake("-n", "--directory", str(tmp_path), "--configfile", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["train"] == 3 and counts["aggregate"] == 1 and counts["scorecard"] == 1
    assert "showcase" not in counts


class CheckedProx(FedProx):
    """FedProx with a check its annotations cannot express (as a method with two related values would have)."""

    name = "checkedprox"

    def __init__(self, mu: float = 0.01) -> None:
        if mu > 1.0:
            raise ValueError(f"mu above 1 makes the proximal term dominate, got {mu}")
        super().__init__(mu)


def test_a_value_the_method_refuses_in_its_init_stops_the_config(monkeypatch) -> None:
    monkeypatch.setitem(ALGORITHMS, "checkedprox", CheckedProx)
    config = merge_configfiles(REPO / "config" / "config.yaml", EXAMPLE)
    config["studies"]["own"]["methods"]["fedprox"] = {"algorithm": "checkedprox", "hparams": {"mu": 5.0}}
    with pytest.raises(ConfigError, match=r"studies\.own\.methods\.fedprox\.hparams: checkedprox refuses "
                                          r"\{'mu': 5\.0\}: mu above 1 makes the proximal term dominate"):
        resolve_config(config)
    config["studies"]["own"]["methods"]["fedprox"]["hparams"]["mu"] = 0.5
    assert resolve_config(config)["studies"]["own"]["methods"]["fedprox"]["hparams"] == {"mu": 0.5}
