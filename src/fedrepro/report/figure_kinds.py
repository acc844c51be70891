"""The kinds of figure a study can draw (a figure's `kind` key): one ``FigureKind`` entry per kind in
``FIGURE_KINDS``, holding everything that differs between kinds.

- ``check``: what the config check refuses in the figure's options beyond the schema, as (key under the
  figure, problem) pairs (``fedrepro.config.check_study`` raises the first);
- ``runs``: the (setting, method) runs it draws, each of which the grid must produce;
- ``inputs``: the files its job reads (the Snakemake rule's input), in the order ``render`` takes them;
- ``spec``: what its job's spec holds beyond the figure's own options (labels, a sweep's cells);
- ``render``: reads the inputs and writes ``<out_stem>.png`` and ``.pdf``;
- ``shows``: what its report caption says it shows (``fedrepro.report.captions``);
- ``reports``: the per-run accuracy number it shows, as a table metric (best_acc, final_acc, ...), by which the
  scorecard judges its runs' plateau beside their tables' (``fedrepro.report.convergence``); None for a figure of
  per-round curves or one-off probes, which report no run's finished number.

Adding a kind is one entry here (its drawing code may live in any ``figures_*`` module) plus its name and options
in workflow/schemas/study.schema.yaml (the `kind` enum, the keys it requires in the `allOf` below it, and any
option of its own under the figure's `properties`): the schema stays the one place a study file's keys are
declared, and tests/report/test_figure_kinds.py checks the two agree.

One module of entries, not one module per kind discovered like methods: the kinds share parts (the aggregated
table they read, runs drawn as `settings` x `methods`, a renderer of one table), each part is a few lines, and
the drawing itself already lives in the ``figures_*`` modules; side by side, the kinds' differences read at a
glance, as the federations' do (fedrepro.federations). Light on imports: the config check and every Snakemake
start read this module, so each renderer imports pandas, matplotlib and its figure module when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fedrepro.study import label_of, run_async, unknown_name

Run = tuple[str, str]  # (setting, method)
Problems = list[tuple[str, str]]  # (key under the figure, "" for the figure itself; what is wrong)


@dataclass(frozen=True)
class FigureKind:
    """One kind of figure; see the module's docstring for what each part does."""

    shows: str  # caption words; {y}, {seed} and {metric} are filled in from the figure's options
    inputs: Callable[[dict, dict, str], list[str]]  # (study, figure, the study's results folder) -> files
    render: Callable[[dict, list[Path], Path], None]  # (spec, inputs, out_stem) -> writes out_stem.{png,pdf}
    runs: Callable[[dict, dict], set[Run]] = lambda study, fig: set()  # a plot of partitions draws no run
    check: Callable[[dict, dict], Problems] = lambda study, fig: []
    spec: Callable[[dict, dict], dict[str, Any]] = lambda study, fig: {}
    reports: Callable[[dict], str | None] = lambda spec: None  # (the figure's job spec) -> metric


# ------------------------------------------------------------------ shared parts

LOSSES = ("train_ce", "train_loss", "test_loss")  # per-round losses of runs.csv (a negative_effect's y)
# FedDisco Fig. 2 (weight_probe): the keys each of its two sweeps varies, and the weighting kind it sweeps
WEIGHT_PROBE_SWEEPS = {"sweep": ("weighting.pair", "weighting.r"), "single_sweep": ("weighting.client",)}
WEIGHT_PROBE_KINDS = {"sweep": "pair", "single_sweep": "single"}


def _reader(spec: dict) -> Callable[..., Any]:
    """read_aggregate refusing a table that is not whole or lacks a seed (the spec's ``seeds``, the study's;
    without them, some seed) of a run the figure draws (the spec's ``drawn_runs``; without them, those it holds)."""
    from fedrepro.report.integrity import read_aggregate

    return partial(read_aggregate, runs=spec.get("drawn_runs"), seeds=spec.get("seeds"))


def _summary(study: dict, fig: dict, folder: str) -> list[str]:
    return [f"{folder}/summary.csv"]


def _runs_and_summary(study: dict, fig: dict, folder: str) -> list[str]:
    return [f"{folder}/runs.csv", f"{folder}/summary.csv"]


def _its_metric(spec: dict) -> str:
    """The per-run accuracy a figure of numbers over seeds shows: its `metric` (the schema fills in the default)."""
    return spec["metric"]


def _settings_x_methods(study: dict, fig: dict) -> set[Run]:
    return {(s, m) for s in fig["settings"] for m in fig["methods"]}


def _methods_on_setting(study: dict, fig: dict) -> set[Run]:
    return {(fig["setting"], m) for m in fig["methods"]}


def _setting_label(study: dict, fig: dict) -> dict[str, Any]:
    return {"setting_label": label_of(study, "settings", fig["setting"])}


def _seed_problems(study: dict, fig: dict) -> Problems:
    """A figure of one seed's run files: the seed must be one the study runs."""
    if fig["seed"] in study["seeds"]:
        return []
    return [("seed", f"seed {fig['seed']} is not one of the study's seeds {study['seeds']}")]


def _render_table_with(module: str, function: str) -> Callable[[dict, list[Path], Path], None]:
    """A renderer of one aggregated table (summary.csv; negative_effect: runs.csv): ``module.function(spec,
    table, out_stem)``."""

    def render(spec: dict, inputs: list[Path], out_stem: Path) -> None:
        import importlib

        draw = getattr(importlib.import_module(module), function)
        draw(spec, _reader(spec)(inputs[0]), Path(out_stem))

    return render


def _partition_stats(study: dict, fig: dict, folder: str) -> list[str]:
    return [f"{folder}/partitions/{s}/seed{fig['seed']}.json" for s in fig["settings"]]


def _render_partition_stats_with(function: str) -> Callable[[dict, list[Path], Path], None]:
    """A renderer of one partition stats file per setting: figures_feddisco.``function``(spec, stats, out)."""

    def render(spec: dict, inputs: list[Path], out_stem: Path) -> None:
        from fedrepro.io import read_json
        from fedrepro.report import figures_feddisco

        stats = {s["setting"]: read_json(p, checksum=True) for s, p in zip(spec["settings"], inputs, strict=True)}
        getattr(figures_feddisco, function)(spec, stats, Path(out_stem))

    return render


def seed_file(spec: dict, index: Path, name: str, why_missing: str) -> Path:
    """The file ``name`` a train job wrote beside the summary of the figure's seed (``index``: its seeds.json)."""
    from fedrepro.io import read_json

    runs = {r["seed"]: r["dir"] for r in read_json(index)["runs"]}
    if spec["seed"] not in runs:
        raise ValueError(f"figure {spec['name']}: seed {spec['seed']} is not among the runs of {index} "
                         f"(seeds {sorted(runs)})")
    path = index.parent / runs[spec["seed"]] / name
    if not path.exists():
        raise ValueError(f"figure {spec['name']}: {path} is missing: method {spec['method']!r} {why_missing}")
    return path


# ------------------------------------------------------------------ curve, finetune_curve

def _render_curve(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    """runs.csv, and summary.csv: which seeds diverged."""
    from fedrepro.report.figures import render_curves

    read = _reader(spec)
    render_curves(spec, read(inputs[0]), Path(out_stem), read(inputs[1]))


def _render_finetune_curve(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    """Target accuracy per fine-tuning epoch (finetune_curves.csv; finetune.csv: which pre-trainings diverged)."""
    from fedrepro.report.figures import diverged_runs, render_curves

    read = _reader(spec)
    summary = read(inputs[1]) if len(inputs) > 1 else None
    curves = read(inputs[0], exempt=diverged_runs(summary))  # a diverged pre-training has no curve
    render_curves({**spec, "x": "epoch"}, curves, Path(out_stem))


def _finetune_curve_problems(study: dict, fig: dict) -> Problems:
    return [("", f"setting {s!r} has no `target` to fine-tune on")
            for s in fig["settings"] if "target" not in study["settings"][s]]


# ------------------------------------------------------------------ gain_grid, weight_probe (a method's sweep)

def _gain_grid_runs(study: dict, fig: dict) -> set[Run]:
    return {(fig["setting"], v["method"]) for v in study["sweeps"][fig["sweep"]]} | {(fig["setting"], fig["baseline"])}


def _gain_grid_problems(study: dict, fig: dict) -> Problems:
    if len(study["sweeps"][fig["sweep"]][0]["values"]) != 2:
        return [("sweep", "a gain_grid needs a sweep over exactly two keys")]
    return []


def _gain_grid_spec(study: dict, fig: dict) -> dict[str, Any]:
    """The heatmap's cells (each variant's two swept values), its axes' names (the swept keys unless the figure
    names them) and labels."""
    variants = study["sweeps"][fig["sweep"]]
    xkey, ykey = list(variants[0]["values"])
    return {"cells": [{"method": v["method"], "x": v["values"][xkey], "y": v["values"][ykey]} for v in variants],
            "x_label": fig.get("x_label", xkey.split(".")[1]), "y_label": fig.get("y_label", ykey.split(".")[1]),
            **_setting_label(study, fig), "baseline_label": label_of(study, "methods", fig["baseline"])}


def _weight_probe_runs(study: dict, fig: dict) -> set[Run]:
    return {(fig["setting"], v["method"]) for key in WEIGHT_PROBE_SWEEPS for v in study["sweeps"][fig[key]]}


def _weight_probe_problems(study: dict, fig: dict) -> Problems:
    problems = []
    for key, swept in WEIGHT_PROBE_SWEEPS.items():
        variants, weighting = study["sweeps"][fig[key]], WEIGHT_PROBE_KINDS[key]
        kinds = {study["methods"][v["method"]]["weighting"]["kind"] for v in variants}
        if set(variants[0]["values"]) != set(swept) or kinds != {weighting}:
            problems.append((key, f"a weight_probe's {key} sweeps exactly {list(swept)} of a method with "
                                  f"`weighting: {{kind: {weighting}}}`"))
    return problems


def weight_probe_cells(study: dict, fig: dict) -> dict[str, Any]:
    """What a weight_probe figure reads beyond its study entry: the pair sweep's runs (method, pair, r), the
    single sweep's (method, client), the study's seeds (one partition per seed) and the pairs' size tolerance."""
    pairs = [{"method": v["method"], "pair": v["values"]["weighting.pair"], "r": v["values"]["weighting.r"]}
             for v in study["sweeps"][fig["sweep"]]]
    tolerance = study["methods"][pairs[0]["method"]]["weighting"].get("size_tolerance")
    return {
        "pairs": pairs,
        "clients": [{"method": v["method"], "client": v["values"]["weighting.client"]}
                    for v in study["sweeps"][fig["single_sweep"]]],
        "seeds": list(study["seeds"]),
        **({"size_tolerance": tolerance} if tolerance is not None else {}),
    }


def _weight_probe_inputs(study: dict, fig: dict, folder: str) -> list[str]:
    """summary.csv, and each seed's partition stats: the pairs and sizes differ per seed."""
    return [f"{folder}/summary.csv", *(f"{folder}/partitions/{fig['setting']}/seed{seed}.json"
                                        for seed in study["seeds"])]


def _render_weight_probe(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    from fedrepro.io import read_json
    from fedrepro.report.figures_feddisco import render_weight_probe

    stats = {seed: read_json(p, checksum=True) for seed, p in zip(spec["seeds"], inputs[1:], strict=True)}
    render_weight_probe(spec, _reader(spec)(inputs[0]), stats, Path(out_stem))


# ------------------------------------------------------------------ gain_lines, sweep_line

def _gain_lines_runs(study: dict, fig: dict) -> set[Run]:
    return {(p["setting"], m) for p in fig["points"] for ser in fig["series"] for m in (ser["baseline"], ser["method"])}


def _sweep_line_runs(study: dict, fig: dict) -> set[Run]:
    return {(line.get("setting", fig["setting"]), m) for line in fig["lines"] for m in line["methods"]}


def _sweep_line_problems(study: dict, fig: dict) -> Problems:
    problems = []
    for i, line in enumerate(fig["lines"]):
        setting = line.get("setting", fig["setting"])
        if problem := unknown_name(setting, study["settings"], "setting"):
            problems.append((f"lines.{i}.setting", problem))
        if len(line["methods"]) != len(fig["x_values"]):
            problems.append((f"lines.{i}.methods", f"{len(line['methods'])} methods for {len(fig['x_values'])} "
                                                   "x_values: one run per swept value"))
    if fig["x_scale"] == "log" and min(fig["x_values"]) <= 0:
        problems.append(("x_scale", "a log axis needs positive x_values (categorical spaces them evenly)"))
    return problems


def _summary_and_runs(study: dict, fig: dict, folder: str) -> list[str]:
    """summary.csv, and the curves (runs.csv) for a metric derived from them (last_k_max_acc)."""
    return [f"{folder}/summary.csv", f"{folder}/runs.csv"]


def _render_sweep_line(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    from fedrepro.report.derived import add_derived
    from fedrepro.report.figures import render_sweep_line

    read = _reader(spec)
    as_table = {"name": spec["name"], "metric": spec["metric"], "columns": [{}]}
    render_sweep_line(spec, add_derived(as_table, read(inputs[0]), read(inputs[1])), Path(out_stem))


# ------------------------------------------------------------------ tsne, update_cosine (one seed's run files)

def figure_runs_methods(fig: dict) -> list[str]:
    """The methods of a tsne figure, one panel and one run each: its `methods` (FedL2G Fig. 4's -l and -f) or
    its single `method`."""
    return list(fig["methods"]) if "methods" in fig else [fig["method"]]


def _tsne_runs(study: dict, fig: dict) -> set[Run]:
    return {(fig["setting"], m) for m in figure_runs_methods(fig)}


def _tsne_inputs(study: dict, fig: dict, folder: str) -> list[str]:
    """Per method, the train job's index: the seed's embeddings.npz lies beside its summary."""
    return [f"{folder}/runs/{fig['setting']}/{m}/seeds.json" for m in figure_runs_methods(fig)]


def _tsne_spec(study: dict, fig: dict) -> dict[str, Any]:
    """One panel per method."""
    return {**_setting_label(study, fig),
            "methods": [{"method": m, "label": label_of(study, "methods", m)} for m in figure_runs_methods(fig)]}


def _render_tsne(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    """Per method, one seed's anchors and client representations, beside its summary.json."""
    from fedrepro.hetero.job import EMBEDDINGS
    from fedrepro.io import open_npz
    from fedrepro.report.figures_fedl2g import render_tsne

    panels = []
    for method, index in zip(spec["methods"], inputs, strict=True):  # one seeds.json per method
        path = seed_file({**spec, "method": method["method"]}, Path(index), EMBEDDINGS,
                         "holds no server vectors to embed (FedL2G's guiding vectors)")
        with open_npz(path, "file of embeddings", checksum=False) as f:
            panels.append({k: f[k] for k in f.files})
    render_tsne(spec, panels, Path(out_stem))


def _update_cosine_runs(study: dict, fig: dict) -> set[Run]:
    return {(s, fig["method"]) for s in (fig["setting"], *fig["settings"])}


def _update_cosine_problems(study: dict, fig: dict) -> Problems:
    problems = [("", f"setting {s!r} logs no true update: set its async.true_update (a federation: async study)")
                for s in sorted({fig["setting"], *fig["settings"]})
                if study["federation"] != "async" or not run_async(study, s).get("true_update")]
    return problems + _seed_problems(study, fig)


def _update_cosine_inputs(study: dict, fig: dict, folder: str) -> list[str]:
    """runs.csv, and the run's index: the seed's true_update_cosines.npz lies beside its summary."""
    return [f"{folder}/runs.csv", f"{folder}/runs/{fig['setting']}/{fig['method']}/seeds.json"]


def _update_cosine_spec(study: dict, fig: dict) -> dict[str, Any]:
    return {**_setting_label(study, fig), "method_label": label_of(study, "methods", fig["method"])}


def _render_update_cosine(spec: dict, inputs: list[Path], out_stem: Path) -> None:
    from fedrepro.asyncfl.job import TRUE_UPDATES
    from fedrepro.io import open_npz
    from fedrepro.report.figures_feddle import render_update_cosine

    path = seed_file(spec, Path(inputs[1]), TRUE_UPDATES, "logs no true update (set async.true_update)")
    with open_npz(path, "file of true-update cosines", checksum=False) as f:
        render_update_cosine(spec, _reader(spec)(inputs[0]), {k: f[k] for k in f.files}, Path(out_stem))


# ------------------------------------------------------------------ negative_effect

def _negative_effect_problems(study: dict, fig: dict) -> Problems:
    if fig["y"] in LOSSES:
        return []
    return [("y", f"a negative effect is the rise of a loss: one of {LOSSES}, not {fig['y']!r}")]


# ------------------------------------------------------------------ the registry

FIGURE_KINDS: dict[str, FigureKind] = {
    "curve": FigureKind(
        shows="{y} per round, one panel per setting, one colour per method (the same in every figure of every "
              "study); line: mean over the seeds that completed, band: ±1 sd over seeds (the same ones); a "
              "diverged seed: its own thin line, a cross where it stopped",
        inputs=_runs_and_summary, render=_render_curve, runs=_settings_x_methods),
    "finetune_curve": FigureKind(
        shows="{y} on the target domain per fine-tuning epoch, one colour per method; line: mean over seeds, band: "
              "±1 sd over seeds",
        inputs=lambda study, fig, folder: [f"{folder}/finetune_curves.csv", f"{folder}/finetune.csv"],
        render=_render_finetune_curve, runs=_settings_x_methods, check=_finetune_curve_problems),
    "partition": FigureKind(
        shows="samples per class (rows) and client (columns) of the seed-{seed} partition, one panel per setting",
        inputs=_partition_stats, render=_render_partition_stats_with("render_partition")),
    "class_histogram": FigureKind(
        shows="samples per class of the whole training set, one panel per setting",
        inputs=_partition_stats, render=_render_partition_stats_with("render_class_histogram")),
    "gain_grid": FigureKind(
        shows="accuracy gain of each swept variant over the baseline, a heatmap over the two swept values (mean "
              "over seeds of the {metric} accuracy)",
        inputs=_summary, render=_render_table_with("fedrepro.report.figures_feddisco", "render_gain_grid"),
        runs=_gain_grid_runs, check=_gain_grid_problems, spec=_gain_grid_spec, reports=_its_metric),
    "gain_lines": FigureKind(
        shows="accuracy gain of each method over its baseline across settings (mean over seeds of the {metric} "
              "accuracy)",
        inputs=_summary, render=_render_table_with("fedrepro.report.figures_feddisco", "render_gain_lines"),
        runs=_gain_lines_runs, reports=_its_metric),
    "sweep_line": FigureKind(
        shows="{metric} test accuracy against a swept hyper-parameter, one line per series; points: mean over "
              "seeds, bars: ±1 sd",
        inputs=_summary_and_runs, render=_render_sweep_line, runs=_sweep_line_runs, check=_sweep_line_problems,
        reports=_its_metric),
    "per_class": FigureKind(
        shows="test accuracy per category, one colour per method; bars: mean over seeds, whiskers: ±1 sd",
        inputs=_summary, render=_render_table_with("fedrepro.report.figures_feddisco", "render_per_class"),
        runs=_methods_on_setting, reports=lambda spec: "final_acc"),  # the final model's, per class
    "update_cosine": FigureKind(
        shows="(a) the cosine of each client's update to the true update (the size-weighted mean of every "
              "client's update from the same model, Sec. 2 of the paper) per round, one line per setting: mean "
              "over clients, band from the smallest to the largest, each averaged over seeds; (b) the cosine "
              "between the true updates of two rounds, seed {seed}",
        inputs=_update_cosine_inputs, render=_render_update_cosine, runs=_update_cosine_runs,
        check=_update_cosine_problems, spec=_update_cosine_spec),
    "negative_effect": FigureKind(
        shows="(a) the negative effect, the largest rise of the {y} above its lowest value in earlier rounds "
              "(rounds without training skipped), and (b) the best test accuracy over rounds, one bar per method; "
              "bars: mean over seeds, whiskers: ±1 sd",
        inputs=lambda study, fig, folder: [f"{folder}/runs.csv"],
        render=_render_table_with("fedrepro.report.figures_fedl2g", "render_negative_effect"),
        runs=_methods_on_setting, check=_negative_effect_problems, spec=_setting_label,
        reports=lambda spec: "best_acc"),  # panel (b)
    "weight_probe": FigureKind(
        shows="(a) the seed-{seed} partition; (b) the {metric} accuracy of (1 - r) w_A + r w_B after one round of "
              "local training from the same start, against r, for each pair of similar-size clients (B nearer "
              "the uniform class distribution; line: mean over seeds, band: ±1 sd, star: best r); (c), (d) each "
              "client's own-model accuracy against its relative dataset size and its l2 discrepancy to the "
              "uniform distribution, every seed, with the mean within-seed Spearman rho",
        inputs=_weight_probe_inputs, render=_render_weight_probe, runs=_weight_probe_runs,
        check=_weight_probe_problems, spec=lambda study, fig: {**weight_probe_cells(study, fig),
                                                               **_setting_label(study, fig)}),
    "tsne": FigureKind(
        shows="a t-SNE of the server's per-class vectors (diamonds) among the clients' own representations of "
              "their test samples (circles, at most 10 per class and client, in the vectors' space: logits or "
              "features), one colour per class, one panel per method, seed {seed}",
        inputs=_tsne_inputs, render=_render_tsne, runs=_tsne_runs, check=_seed_problems, spec=_tsne_spec),
}


def figure_kind(name: str) -> FigureKind:
    if name not in FIGURE_KINDS:
        raise ValueError(f"unknown figure kind {name!r}; known: {sorted(FIGURE_KINDS)}")
    return FIGURE_KINDS[name]


# ------------------------------------------------------------------ what the config check and the workflow call

def figure_problems(study: dict, fig: dict) -> Problems:
    """(key under the figure, problem) for what keeps a figure of ``study`` from being drawn, beyond the
    schema: names of settings and swept methods it uses that the study lacks, then its kind's own checks (which
    may take those names as resolved, so they run only once the names are)."""
    problems = [("", problem) for s in [*fig.get("settings", []), *(p["setting"] for p in fig.get("points", []))]
                if (problem := unknown_name(s, study["settings"], "setting"))]
    if "setting" in fig and (problem := unknown_name(fig["setting"], study["settings"], "setting")):
        problems.append(("setting", problem))
    problems += [(key, problem) for key in ("sweep", "single_sweep")
                 if key in fig and (problem := unknown_name(fig[key], study["sweeps"], "swept method"))]
    return problems or figure_kind(fig["kind"]).check(study, fig)


def figure_runs(study: dict, fig: dict) -> list[Run]:
    """The (setting, method) runs a figure of the study draws, sorted; every seed of each (none: a partition
    plot draws partitions)."""
    return sorted(figure_kind(fig["kind"]).runs(study, fig))


def figure_inputs(study: dict, fig: dict, folder: str) -> list[str]:
    """The files a figure's job reads, ``folder`` being the study's results folder."""
    return figure_kind(fig["kind"]).inputs(study, fig, folder)


def figure_metrics(specs: Iterable[dict]) -> dict[Run, set[str]]:
    """(setting, method) -> the per-run accuracy metrics the figures (job specs, figure_spec) show of its runs;
    runs drawn only as per-round curves or probes are in none."""
    out: dict[Run, set[str]] = {}
    for spec in specs:
        if (metric := figure_kind(spec["kind"]).reports(spec)) is not None:
            for setting, method in spec["drawn_runs"]:
                out.setdefault((setting, method), set()).add(metric)
    return out


def figure_spec(study: dict, name: str) -> dict[str, Any]:
    """The job spec of the study's figure ``name``: its options with labels filled in from the methods and
    settings, what its kind adds (``FigureKind.spec``), the runs it draws and the study's seeds (its tables must
    have rows for every one)."""
    fig = study["figures"][name]
    spec = {**fig, "name": name, "drawn_runs": [list(r) for r in figure_runs(study, fig)],
            "seeds": list(study["seeds"])}
    if "settings" in fig:
        spec["settings"] = [{"setting": k, "label": label_of(study, "settings", k)} for k in fig["settings"]]
    if "methods" in fig:
        spec["methods"] = [{"method": k, "label": label_of(study, "methods", k)} for k in fig["methods"]]
    spec.update(figure_kind(fig["kind"]).spec(study, fig))
    if "series" in fig:
        spec["series"] = [{"label": label_of(study, "methods", x["method"]), **x} for x in fig["series"]]
    return spec
