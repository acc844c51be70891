"""The tuning stage: score every grid point of a stage, choose each method's best, and hand the choice to the runs
that train with it.

A study's `tuning` (workflow/schemas/study.schema.yaml) runs each stage as a study of its own, <study>--tune-<stage>
(fedrepro.config.tuning_stage_studies), whose methods are the stage's grid points. Once its runs are aggregated,
``choose`` scores each point by the stage's metric (the number the study's tables report), averaged over every
tuning setting and seed, and picks each method's best point: the first in grid order among equals, never a point
one of whose runs diverged. A tuning with ``per`` (a setting key: Feddle's ``model``) chooses once for each value of
that key among the tuning settings, each from its own settings, and a run takes the choice of its setting's value.
``write_choice`` keeps the choice (<stage>.json) and every point's score (<stage>.csv, <stage>.md). A train job
whose spec names tuned stages (``tuned``: the stages that apply to its method) reads their choices and applies them
before it trains (``apply_choices``): its fingerprint, checkpoints and summary.json are those of the tuned run, so
a changed choice trains the run again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from fedrepro.config import TUNING_SEPARATOR
from fedrepro.io import atomic_write_json, atomic_write_text, read_json
from fedrepro.report.derived import add_derived, metric_key
from fedrepro.study import unknown_name


class TuningError(ValueError):
    """A tuning stage whose runs cannot choose (missing runs, every point diverged), or a choice file a run cannot
    use; the message names the stage, the method or the file."""


def stage_params(config: dict, study_name: str, stage_name: str) -> dict:
    """What scoring a stage reads (``stage`` of point_scores and choose): its study and stage, whom its choice
    applies to, the study's tuning metric, settings and seeds, and each grid point (variant -> its method and
    values). TuningError naming a study or stage the resolved ``config`` does not have."""
    if problem := unknown_name(study_name, config["studies"], "study"):
        raise TuningError(problem)
    study = config["studies"][study_name]
    stages = [t["stage"] for t in study.get("tuned_by", [])]
    if problem := unknown_name(stage_name, stages, f"tuning stage of {study_name}"):
        raise TuningError(problem)
    stage_study = config["tuning_studies"][f"{study_name}{TUNING_SEPARATOR}{stage_name}"]
    params = {
        "study": study_name, "stage": stage_name,
        "applies_to": next(t["applies_to"] for t in study["tuned_by"] if t["stage"] == stage_name),
        "metric": study["tuning"]["metric"], "settings": list(study["tuning"]["settings"]),
        "seeds": list(study["tuning"]["seeds"]),
        "variants": {v["method"]: {"method": base, "values": v["values"]}
                     for base, variants in stage_study["sweeps"].items() for v in variants},
    }
    if per := study["tuning"].get("per"):  # only then, so an ungrouped stage's params (and its rule) stay as they were
        params |= {"per": per, "groups": setting_groups(study)}
    return params


def setting_groups(study: dict) -> dict[str, list[str]]:
    """The tuning settings of ``study`` by their value of its tuning's ``per`` key (value -> settings, in order):
    each value is chosen for from its own settings."""
    per = study["tuning"]["per"]
    groups: dict[str, list[str]] = {}
    for s in study["tuning"]["settings"]:
        groups.setdefault(str(study["settings"][s][per]), []).append(s)
    return groups


def stage_groups(stage: dict) -> dict[str | None, list[str]]:
    """The groups a stage chooses for, each with its settings: one per value of its ``per`` key, or one (None) of
    every tuning setting."""
    return stage.get("groups") or {None: list(stage["settings"])}


def point_scores(stage: dict, runs: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point of ``stage`` (its method, variant and values, in grid order): the mean of the
    stage's metric over its runs (every tuning setting and seed), its mean per setting, how many runs it has and
    how many diverged. A stage with ``per`` has one row per group and point instead (column ``group``: the value of
    its ``per`` key), scored over that group's settings. ``stage``: the rule's params (``variants``: variant ->
    {method, values}; ``metric``; ``settings``; ``seeds``; ``per`` and ``groups``). ``summary``: the stage's scored
    table (fedrepro.report.table_sources.scored_source: summary.csv, or finetune.csv for a target_* metric),
    ``runs`` its training curves. A point without a run of every setting and seed is refused by name."""
    metric, settings, seeds = stage["metric"], list(stage["settings"]), list(stage["seeds"])
    spec = {"name": f"tuning stage {stage['stage']}", "metric": metric, "columns": [{}]}
    values = add_derived(spec, summary, runs)
    key = metric_key(spec, {})
    for variant in stage["variants"]:
        mine = values[values["method"] == variant]
        have = {(str(s), int(seed)) for s, seed in zip(mine["setting"], mine["seed"], strict=True)}
        missing = sorted({(s, seed) for s in settings for seed in seeds} - have)
        if missing:
            raise TuningError(f"tuning stage {stage['stage']}: grid point {variant} has no run of "
                              f"{', '.join(f'{s} seed {seed}' for s, seed in missing)}")
    rows = []
    for group, group_settings in stage_groups(stage).items():
        for variant, point in stage["variants"].items():
            mine = values[(values["method"] == variant) & values["setting"].astype(str).isin(group_settings)]
            diverged = int((mine["status"] == "diverged").sum())
            finished = mine[mine["status"] != "diverged"]
            score = math.nan if diverged else float(finished[key].mean())
            per_setting = {f"score[{s}]": float(finished[finished["setting"] == s][key].mean())
                           for s in group_settings}
            rows.append({**({} if group is None else {"group": group}), "method": point["method"],
                         "variant": variant, **point["values"], "score": score, **per_setting, "runs": len(mine),
                         "diverged": diverged})
    return pd.DataFrame(rows)


def choose(stage: dict, scores: pd.DataFrame) -> dict[str, Any]:
    """Each method's chosen point: the highest score, the first in grid order among equals; a point with a diverged
    run has no score and is never chosen (TuningError when every point of a method diverged). A stage with ``per``
    chooses for each group: group -> method -> its point."""
    if "per" not in stage:
        return _choose_each(stage, scores, "")
    return {group: _choose_each(stage, scores[scores["group"] == group], f" for {stage['per']} {group}")
            for group in stage_groups(stage)}


def _choose_each(stage: dict, scores: pd.DataFrame, where: str) -> dict[str, Any]:
    chosen = {}
    for method in dict.fromkeys(scores["method"]):
        points = scores[(scores["method"] == method) & scores["score"].notna()]
        if points.empty:
            raise TuningError(f"tuning stage {stage['stage']}: every grid point of {method} has a diverged "
                              f"run{where}; widen its grid or fix the divergence")
        best = points.loc[points["score"].idxmax()]  # idxmax: the first of equal maxima
        values = stage["variants"][best["variant"]]["values"]
        chosen[method] = {"variant": best["variant"], "values": values, "score": float(best["score"])}
    return chosen


def chosen_by_group(choice: dict) -> dict[str | None, dict[str, Any]]:
    """A choice file's (or ``choose``'s, given as {"chosen": ...} with its stage's ``per``) picks by group: one
    group (None) for a stage without ``per``, else its value -> method -> point."""
    return choice["chosen"] if choice.get("per") else {None: choice["chosen"]}


def grid_edges(stage: dict, method: str, values: dict[str, Any]) -> dict[str, str]:
    """Each key whose chosen value in ``values`` is the smallest or largest of the numbers ``method``'s grid in
    ``stage`` gives it ("smallest" / "largest"): a point beyond it was never tried, so it may score higher. Keys
    with one value or non-numeric values are left out."""
    grid: dict[str, set] = {}
    for point in stage["variants"].values():
        if point["method"] == method:
            for key, value in point["values"].items():
                grid.setdefault(key, set()).add(value)
    edges = {}
    for key, tried in grid.items():
        if len(tried) < 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in tried):
            continue
        if values[key] == min(tried):
            edges[key] = "smallest"
        elif values[key] == max(tried):
            edges[key] = "largest"
    return edges


def write_choice(stage: dict, runs: pd.DataFrame, summary: pd.DataFrame, out_json: Path, out_csv: Path,
                 out_md: Path) -> dict[str, Any]:
    """Score and choose (point_scores, choose); write the choice (JSON: what runs read), every point's score
    (CSV) and a table of them (Markdown, the chosen point of each method in bold). Returns the choice."""
    scores = point_scores(stage, runs, summary)
    chosen = choose(stage, scores)
    choice = {"study": stage["study"], "stage": stage["stage"], "applies_to": stage["applies_to"],
              "metric": stage["metric"], "settings": stage["settings"], "seeds": stage["seeds"],
              **({"per": stage["per"], "groups": stage["groups"]} if "per" in stage else {}), "chosen": chosen}
    atomic_write_text(out_csv, scores.to_csv(index=False, lineterminator="\n"))
    atomic_write_text(out_md, _markdown(stage, scores, chosen))
    atomic_write_json(out_json, choice)
    return choice


def _markdown(stage: dict, scores: pd.DataFrame, chosen: dict[str, Any]) -> str:
    settings = ", ".join(stage["settings"])
    seeds = ", ".join(map(str, stage["seeds"]))
    scope = ("every method trains with the choice" if stage["applies_to"] == "all"
             else "each method trains with its own choice")
    if "per" in stage:
        over = (f"the mean over the settings of the same {stage['per']} ("
                + "; ".join(f"{g}: {', '.join(ss)}" for g, ss in stage["groups"].items())
                + f") and seeds {seeds}; each {stage['per']} has its own choice, which runs of its {stage['per']} "
                  "train with")
    else:
        over = f"the mean over settings {settings} and seeds {seeds}"
    lines = [f"# Tuning stage {stage['stage']} of {stage['study']}", "",
             f"Score: {stage['metric']}, {over}; the highest is chosen "
             f"(bold; the first in grid order among equals; a point with a diverged run is never chosen); {scope}.",
             ""]
    picks = chosen_by_group({"per": stage.get("per"), "chosen": chosen})
    for group, group_settings in stage_groups(stage).items():
        mine = scores if group is None else scores[scores["group"] == group]
        for method in dict.fromkeys(mine["method"]):
            points = mine[mine["method"] == method]
            keys = list(stage["variants"][points["variant"].iloc[0]]["values"])
            per_setting = [f"score[{s}]" for s in group_settings]
            head = [*keys, "score", *per_setting, "diverged runs"]
            title = method if group is None else f"{method}, {stage['per']} {group}"
            lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for row in points.to_dict("records"):
                values = stage["variants"][row["variant"]]["values"]  # as the grid states them (not as floats)
                cells = [str(values[k]) for k in keys]
                cells += ["—" if math.isnan(row["score"]) else f"{row['score']:.2f}"]
                cells += ["—" if math.isnan(row[c]) else f"{row[c]:.2f}" for c in per_setting]
                cells += [f"{row['diverged']} of {row['runs']}"]
                if row["variant"] == picks[group][method]["variant"]:
                    cells = [f"**{c}**" for c in cells]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
            edges = grid_edges(stage, method, picks[group][method]["values"])
            if edges:
                lines += ["The chosen point lies on its grid's edge (" + "; ".join(
                    f"{key}: the {side} tried" for key, side in edges.items()) + "): a point beyond it was not tried "
                    "and may score higher (docs/tuning.md, widening a grid).", ""]
    return "\n".join(lines)


def choice_path(results: str | Path, study: str, stage: str, suffix: str = ".json") -> Path:
    """Where a study's tuning stage writes its choice (.json), scores (.csv) and table (.md)."""
    return Path(results) / study / "tuning" / f"{stage}{suffix}"


def apply_choices(spec: dict, choices: dict[tuple[str, str], Path]) -> dict:
    """``spec`` with the choices of its ``tuned`` stages applied (``choices``: (study, stage) -> its choice file):
    each chosen dotted key set in the spec's training, hparams or weighting, and ``tuned`` replaced by what was
    applied (stage and values), so the job's fingerprint and summary.json are the tuned run's. A spec without
    ``tuned`` is returned as it is."""
    if not spec.get("tuned"):
        return spec
    out = copy.deepcopy(spec)
    applied = []
    for entry in spec["tuned"]:
        path = choices.get((entry["study"], entry["stage"]))
        if path is None:
            raise TuningError(f"{spec['study']}/{spec['setting']}/{spec['method']}: no choice file of tuning stage "
                              f"{entry['study']}/{entry['stage']} was given to the job")
        choice = read_json(Path(path), remedy="rerun its tuning stage: it is written again from the stage's runs")
        picked = choice.get("chosen", {})
        if per := choice.get("per"):  # chosen for each value of a setting key: the run's setting's value
            if entry.get("group") not in picked:
                raise TuningError(f"{path}: no choice for {per} {entry.get('group')!r} (it has {sorted(picked)}): "
                                  f"the run's setting needs a tuning setting of its {per}")
            picked = picked[entry["group"]]
        method = entry["method"] if entry["method"] != "*" else next(iter(picked), None)
        if method not in picked:
            raise TuningError(f"{path}: no choice for method {method!r} (it has {sorted(picked)})")
        values = picked[method]["values"]
        for dotted, value in values.items():
            section, key = dotted.split(".", 1)
            out.setdefault(section, {})[key] = value
        applied.append({"study": entry["study"], "stage": entry["stage"], "method": method,
                        **({"group": entry["group"]} if "group" in entry else {}), "values": values})
    out["tuned"] = applied
    return out


def tuned_digest(spec: dict) -> str | None:
    """A short hash of what a tuned spec's stages chose (None for an untuned spec): its checkpoints live in a folder
    of their own, so a run resumed after its choice changed starts afresh instead of being refused."""
    if not spec.get("tuned"):
        return None
    return hashlib.sha256(json.dumps(spec["tuned"], sort_keys=True).encode()).hexdigest()[:12]


def written_choices_applied(spec: dict, root: str | Path) -> dict | None:
    """``spec`` with the choices its ``tuned`` stages wrote under ``root`` (a results root, or a snapshot of one:
    <study>/tuning/<stage>.json) applied, as its train job applies them; None while one of them is not there.
    A spec no stage tunes is returned as it is."""
    if not spec.get("tuned"):
        return spec
    choices = {(t["study"], t["stage"]): choice_path(root, t["study"], t["stage"]) for t in spec["tuned"]}
    if not all(path.is_file() for path in choices.values()):
        return None
    return apply_choices(spec, choices)


def chosen_digest(spec: dict, root: str | Path) -> str | None:
    """tuned_digest of ``spec`` with the choices its ``tuned`` stages wrote under ``root`` applied; None while one
    of them is not there, "untuned" for a spec no stage tunes."""
    if not spec.get("tuned"):
        return "untuned"
    applied = written_choices_applied(spec, root)
    return None if applied is None else tuned_digest(applied)
