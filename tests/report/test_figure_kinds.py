"""The registries of figure kinds and table sources (fedrepro.report.figure_kinds, table_sources): they hold every
kind and source the schema allows and no other, every kind renders from a small input through the path the
workflow takes (figure_spec, figure_inputs, pipeline.figure), every source reads a value for each cell of its
table, and each registered check reaches the config error under its figure's or table's key."""

from __future__ import annotations

import copy
import re
from functools import cache

import pytest
import yaml
from support.common import REPO
from support.synthetic_results import table_extras, write_inputs

from fedrepro import pipeline
from fedrepro.config import load_yaml, resolve_config
from fedrepro.report.captions import figure_caption
from fedrepro.report.figure_kinds import FIGURE_KINDS, figure_inputs, figure_kind, figure_runs, figure_spec
from fedrepro.report.table_sources import TABLE_SOURCES, table_source
from fedrepro.study import ConfigError, table_runs

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "study.schema.yaml").read_text())
FIGURE_SCHEMA = SCHEMA["properties"]["figures"]["additionalProperties"]
TABLE_SCHEMA = SCHEMA["properties"]["tables"]["additionalProperties"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_the_registries_hold_exactly_the_kinds_and_sources_the_schema_allows() -> None:
    assert sorted(FIGURE_KINDS) == sorted(FIGURE_SCHEMA["properties"]["kind"]["enum"])
    assert sorted(TABLE_SOURCES) == sorted(TABLE_SCHEMA["properties"]["source"]["enum"])
    # each kind's required keys (the schema's if/then clauses) name registered kinds only
    for clause in FIGURE_SCHEMA["allOf"]:
        named = clause["if"]["properties"]["kind"]
        assert set(named.get("enum", [named.get("const")])) <= set(FIGURE_KINDS), clause
    with pytest.raises(ValueError, match=r"unknown figure kind 'curves'; known: \['class_histogram'"):
        figure_kind("curves")
    with pytest.raises(ValueError, match=r"unknown table source 'sim'; known: \['finetune', 'simulation', 'train'\]"):
        table_source("sim")


@cache
def _studies() -> dict[str, dict]:
    """Every study the project ships at paper scale (all twelve kinds, all three sources) and the tests' tiny
    ones, resolved."""
    studies = dict(resolve_config(load_yaml(REPO / "config" / "paper.yaml"))["studies"])
    for path in sorted((REPO / "tests" / "data").glob("tiny_*.yaml")):
        studies[path.stem] = resolve_config({"studies": {path.stem: str(path)}})["studies"][path.stem]
    return studies


def _smallest(kind: str) -> tuple[dict, str]:
    """The (study, figure name) of ``kind`` that draws the fewest runs."""
    found = [(len(figure_runs(study, fig)), i, study, name) for i, study in enumerate(_studies().values())
             for name, fig in study["figures"].items() if fig["kind"] == kind]
    assert found, f"no study in config/paper.yaml or tests/data draws a {kind!r} figure: add one to tests/data"
    _, _, study, name = min(found, key=lambda f: f[:2])
    return study, name


@pytest.mark.parametrize("kind", sorted(FIGURE_KINDS))
def test_every_kind_renders_from_a_small_input_as_the_workflow_calls_it(kind, tmp_path) -> None:
    from matplotlib.image import imread

    study, name = _smallest(kind)
    spec = figure_spec(study, name)
    inputs = figure_inputs(study, study["figures"][name], str(tmp_path / study["name"]))
    write_inputs(study, inputs, [tuple(r) for r in spec["drawn_runs"]])
    pipeline.figure(spec, inputs, tmp_path / name, log=lambda _: None)
    png, pdf = (tmp_path / f"{name}.png").read_bytes(), (tmp_path / f"{name}.pdf").read_bytes()
    assert png.startswith(PNG) and pdf.startswith(b"%PDF-")
    assert imread(tmp_path / f"{name}.png").std() > 0.01  # something drawn, not a blank canvas
    shows = figure_caption(spec, "paper")["shows"]
    assert shows and "{" not in shows  # its caption words, every field filled in


@pytest.mark.parametrize("source", sorted(TABLE_SOURCES))
def test_every_source_reads_a_value_for_each_cell(source, tmp_path) -> None:
    from fedrepro.report.derived import metric_key

    study, name = next((s, t) for s in _studies().values() for t, table in s["tables"].items()
                       if table["source"] == source)
    spec = {**study["tables"][name], "name": name, "seeds": list(study["seeds"])}
    entry = table_source(source)
    files = [tmp_path / entry.cells_from, tmp_path / "runs.csv"] if entry.has_runs else [None, None]
    if entry.has_runs:
        write_inputs(study, files, table_runs(spec), table_extras(spec))
    frame = entry.read(spec, *files)
    for column in spec["columns"]:
        assert frame[metric_key(spec, column)].notna().any(), column
    if entry.has_runs:  # every seed of every run behind the cells
        held = set(zip(frame["setting"], frame["method"], frame["seed"], strict=True))
        assert {(s, m, k) for s, m in table_runs(spec) for k in study["seeds"]} <= held


def _bad(study: str, edit) -> dict:
    raw = load_yaml(REPO / "config" / "studies" / f"{study}.yaml")
    edit(raw)
    return {"scale": "paper", "results_dir": "results/paper", "studies": {study: raw}}


def _tiny_fedgtst_without_target_or_tables() -> dict:
    raw = load_yaml(REPO / "tests" / "data" / "tiny_fedgtst.yaml")
    raw["tables"] = {}
    raw["settings"]["k4"].pop("target")
    raw["settings"]["k4"].pop("finetune", None)
    return {"studies": {"fedgtst": raw}}


@pytest.mark.parametrize(("config", "message"), [
    (lambda: _bad("feddisco", lambda s: s["figures"]["fig4a"].update(sweep="fedavg-single")),
     "studies.feddisco.figures.fig4a.sweep: a gain_grid needs a sweep over exactly two keys"),
    (lambda: _bad("feddisco", lambda s: s["figures"]["fig4a"].update(sweep="fedavg-nope")),
     "studies.feddisco.figures.fig4a.sweep: unknown swept method 'fedavg-nope'"),
    (lambda: _bad("feddisco", lambda s: s["figures"]["fig2"].update(setting="c10-niid9")),
     "studies.feddisco.figures.fig2.setting: unknown setting 'c10-niid9' (did you mean"),
    (lambda: _bad("fedl2g", lambda s: s["figures"]["fig4"].update(seed=99)),
     "studies.fedl2g.figures.fig4.seed: seed 99 is not one of the study's seeds"),
    (lambda: _bad("feddle", lambda s: s["figures"]["fig8"]["lines"][0].update(setting="nope")),
     "studies.feddle.figures.fig8.lines.0.setting: unknown setting 'nope'"),
    (_tiny_fedgtst_without_target_or_tables, "studies.fedgtst.figures.fig1: setting 'k4' has no `target` to fine-tune"),
    (lambda: _bad("feddisco", lambda s: s["tables"]["table6"].update(metric="best_acc")),
     "studies.feddisco.tables.table6.metric: a `source: simulation` table shows the metric 'bound'"),
    (lambda: _bad("feddisco", lambda s: s["tables"]["table1"].update(metric="bound")),
     "studies.feddisco.tables.table1.metric: the metric 'bound' exists only in a `source: simulation` table"),
])
def test_each_registered_check_names_its_figure_or_table_key(config, message) -> None:
    with pytest.raises(ConfigError, match="^config: " + re.escape(message)):  # the file, then the key
        resolve_config(copy.deepcopy(config()))
