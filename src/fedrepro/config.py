"""Config and study files: schema validation with defaults, semantic checks, and the grid of runs.

Everything about a paper lives in its study file; this module only resolves it. Errors name the file,
the key path, the bad value and what would have been accepted.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from fedrepro.plugins import did_you_mean

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "workflow" / "schemas"
# Each scale writes under its own results root, so a run at one scale never overwrites the other's files
# (paper-scale runs cost GPU days; the embedded default reruns in minutes).
EMBEDDED_RESULTS = "results"
PAPER_RESULTS = "results/paper"
TRAINING_KEYS = ("rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay", "join_ratio",
                 "eval_every", "last_k", "checkpoint_every", "straggler_steps", "drop_last")
# names that become folders, files and Snakemake wildcards (the Snakefile's wildcard_constraints are these): no "/",
# space or other character a path or shell would read; settings and methods may hold the "." of a swept value
NAME_PATTERNS = {"studies": r"[A-Za-z0-9_\-]+", "settings": r"[A-Za-z0-9_.\-]+", "methods": r"[A-Za-z0-9_.\-]+",
                 "tables": r"[A-Za-z0-9_\-]+", "figures": r"[A-Za-z0-9_\-]+"}
# training keys a run spec carries only where the study sets them (absent: the engine's TrainingConfig default,
# plain SGD at a constant rate, no early stop), so the specs and checkpoint digests of the other runs are unchanged
OPTIONAL_TRAINING_KEYS = ("optimizer", "lr_decay", "lr_decay_every", "early_stop", "keep_best")


class ConfigError(ValueError):
    """A config or study file that cannot be used; the message says where and why."""


# libyaml's parser where PyYAML was built with it: the pure-Python one took a quarter second of every snakemake
# start on the schemas alone
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _schema(name: str) -> dict:
    return yaml.load((SCHEMAS / f"{name}.schema.yaml").read_text(), Loader=_SafeLoader)  # noqa: S506 (safe)


def _with_defaults(cls):
    """A validator class that also fills in schema defaults (the one place defaults live)."""
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(cls, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft7Validator)


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _describe(error: jsonschema.ValidationError, prefix: str) -> str:
    where = _key_path([*(prefix.split(".") if prefix else []), *error.absolute_path])
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        hints = [f"{key!r}{did_you_mean(key, allowed)}" for key in extra]
        return f"{where}: unknown key {', '.join(hints)}; allowed keys: {allowed}"
    if error.validator == "enum":
        renamed = error.schema.get("renamed", {})  # an old value -> what replaced it and why
        if isinstance(error.instance, str) and error.instance in renamed:
            return f"{where}: {error.instance!r} was {renamed[error.instance]}"
        synonyms = error.schema.get("synonyms", {})  # another word for an option -> that option
        hint = (f" (did you mean {synonyms[error.instance]!r}?)" if isinstance(error.instance, str)
                and error.instance in synonyms else did_you_mean(error.instance, error.validator_value))
        return f"{where}: {error.instance!r} is not one of {error.validator_value}{hint}"
    return f"{where}: {error.message}"


def validate(instance: dict, schema_name: str, source: str, prefix: str = "") -> dict:
    """Validate ``instance`` in place against a schema in workflow/schemas, filling defaults."""
    errors = sorted(_Validator(_schema(schema_name)).iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e, prefix) for e in errors[:5]))
    # a second pass fills defaults inside objects that were themselves created from defaults
    _Validator(_schema(schema_name)).validate(instance)
    return instance


class _UniqueKeyLoader(_SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping: plain YAML keeps the last silently, so a
    study file's second `deviations:` (or `rounds:`) would quietly replace the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # keys merged in (<<: *anchor) may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first at line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_study_file(path: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    """A study file, with the study it ``extends`` (a path relative to this file) underneath it: a laptop study
    states only what it reduces, and a change to its paper study reaches it. The file is a merge patch of its
    base (RFC 7396): a mapping merges into the base's mapping key by key, ``null`` removes a key (a method or
    table the reduced study does not have), any other value, lists included, replaces the base's."""
    path = Path(path).resolve()
    if path in seen:
        raise ConfigError(f"{path}: extends itself through {' -> '.join(str(p) for p in (*seen, path))}")
    study = load_yaml(path)
    base = study.pop("extends", None)
    if base is None:
        return study
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: {base!r} is not a path to a study file")
    return merge_patch(load_study_file(path.parent / base, (*seen, path)), study)


def merge_patch(base: Any, patch: Any) -> Any:
    """``patch`` applied to ``base`` as an RFC 7396 merge patch (neither is changed)."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def merge_configfiles(*paths: str | Path, root: Path = REPO) -> dict:
    """The config Snakemake builds from ``--configfile a b ...``: each file merged into the ones before it,
    mapping into mapping, any other value replacing (so a study given as a file path replaces an inline one).
    Relative paths are taken from ``root``."""
    merged: dict = {}
    for path in paths:
        path = Path(path)
        _merge_into(merged, load_yaml(path if path.is_absolute() else root / path))
    return merged


def _merge_into(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge_into(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def resolve_config(config: dict, source: str = "config", root: Path = REPO) -> dict:
    """Validate the top-level config and each study (loading study files), returning a resolved copy."""
    config = copy.deepcopy(config)
    validate(config, "config", source)
    check_results_root(config, source)
    if only := config["studies_only"]:
        for name in only:
            if name not in config["studies"]:
                raise ConfigError(f"{source}: studies_only: unknown study {name!r}"
                                  f"{did_you_mean(name, config['studies'])}; known: {sorted(config['studies'])}")
        config["studies"] = {name: entry for name, entry in config["studies"].items() if name in only}
        if config["showcase"] and config["showcase"]["study"] not in only:
            config["showcase"] = None  # the README's showcase is the default's, not a study run on its own
    studies, tuning = {}, {}
    for name, entry in config["studies"].items():
        if problem := name_problem("studies", name):
            raise ConfigError(f"{source}: studies: {problem}")
        if isinstance(entry, str):
            path = Path(entry) if Path(entry).is_absolute() else root / entry
            study, where, prefix = load_study_file(path), str(entry), ""
        else:
            study, where, prefix = copy.deepcopy(entry), source, f"studies.{name}"
        validate(study, "study", where, prefix)
        # before the study's own sweeps expand: the stages' grids are of its methods
        stages, tuned_by = tuning_stage_studies(name, study)
        studies[name] = _resolved_study(name, study, where, prefix, config["scale"], tuned_by)
        for stage_name, (stage_study, earlier) in stages.items():
            tuning[stage_name] = _resolved_study(stage_name, stage_study, where, f"{prefix} tuning stage {stage_name}",
                                                 config["scale"], earlier)
    config["studies"] = studies
    config["tuning_studies"] = tuning
    showcase = config["showcase"]
    if showcase:
        if showcase["study"] not in studies:
            raise ConfigError(f"{source}: showcase.study: unknown study {showcase['study']!r}"
                              f"{did_you_mean(showcase['study'], studies)}; known: {sorted(studies)}")
        figures = studies[showcase["study"]]["figures"]
        if showcase["figure"] not in figures:
            raise ConfigError(f"{source}: showcase.figure: study {showcase['study']!r} has no figure "
                              f"{showcase['figure']!r}{did_you_mean(showcase['figure'], figures)}; "
                              f"known: {sorted(figures)}")
    return config


def _resolved_study(name: str, study: dict, where: str, prefix: str, scale: str, tuned_by: list[dict]) -> dict:
    """A validated study with its sweeps expanded, checked (check_study), its scale's table defaults set and the
    tuning stages whose choices its runs train with (``tuned_by``, tuning_stage_studies)."""
    sweeps = expand_sweeps(study)
    validate(study, "study", where, prefix)  # the swept values too
    study["sweeps"] = sweeps
    check_study(name, study, where, prefix)
    _resolve_compare_levels(study, scale)
    study["name"], study["tuned_by"] = name, tuned_by
    return study


TUNING_SEPARATOR = "--tune-"  # <study>--tune-<stage>: a tuning stage's runs, a study of their own


def tuning_stage_studies(name: str, study: dict) -> tuple[dict[str, tuple[dict, list[dict]]], list[dict]]:
    """The runs of each stage of ``study``'s `tuning`, as a study of their own named <study>--tune-<stage>: the
    stage's grids as its methods' sweeps, on the tuning settings and seeds, without tables or figures, each with
    the earlier stages whose choices its runs train with; and every stage, whose choices the study's own runs
    train with. Checks what the schema cannot (ConfigError naming the key): the stages' methods and settings
    exist, the tuning seeds are not reported ones, an `all` stage tunes one method's training keys, and no run
    sets or sweeps a key that an earlier stage chooses for it."""
    tuning = study.get("tuning")
    if not tuning:
        return {}, []
    for key, problem in _tuning_problems(study):
        raise ConfigError(f"{name}: tuning.{key}: {problem}")
    out, earlier = {}, []
    for stage in tuning["stages"]:
        stage_study = copy.deepcopy({k: v for k, v in study.items() if k not in ("tables", "figures", "tuning")})
        stage_study.update(
            seeds=list(tuning["seeds"]), tables={}, figures={}, tuning=None,
            settings={s: study["settings"][s] for s in tuning["settings"]},
            methods={m: {**copy.deepcopy(study["methods"][m]), "sweep": grid} for m, grid in stage["grids"].items()},
            grid=[{"settings": list(tuning["settings"]), "methods": list(stage["grids"])}])
        out[f"{name}{TUNING_SEPARATOR}{stage['name']}"] = (stage_study, copy.deepcopy(earlier))
        earlier.append({"study": name, "stage": stage["name"], "applies_to": stage["applies_to"],
                        "methods": list(stage["grids"]), "metric": tuning["metric"]})
    return out, earlier


def _tuning_problems(study: dict) -> Problems:
    """(key under `tuning`, problem) of a study's tuning stages, in order."""
    tuning = study["tuning"]
    for s in tuning["settings"]:
        yield from _unknown("settings", s, study["settings"], "setting")
    if reported := sorted(set(tuning["seeds"]) & set(study["seeds"])):
        yield "seeds", f"{reported} are reported seeds of the study: tune on others, so no table shows a tuned run"
    names = [stage["name"] for stage in tuning["stages"]]
    if len(set(names)) < len(names):
        yield "stages", f"stage names repeat: {names}"
    chosen: dict[str, set[str]] = {}  # method ('*': every method) -> keys an earlier stage chooses for it
    for i, stage in enumerate(tuning["stages"]):
        where = f"stages.{i}.grids"
        for m, grid in stage["grids"].items():
            yield from _unknown(f"{where}.{m}", m, study["methods"], "method")
            if "sweep" in study["methods"].get(m, {}):
                yield f"{where}.{m}", "a method with a `sweep` of its own cannot be tuned: tune its base values"
            taken = sorted((chosen.get("*", set()) | chosen.get(m, set())) & set(grid))
            if taken:
                yield f"{where}.{m}", f"{taken} were chosen by an earlier stage for this method"
        if stage["applies_to"] == "all":
            keys = {k for grid in stage["grids"].values() for k in grid}
            if len(stage["grids"]) != 1 or any(not k.startswith("training.") for k in keys):
                yield (where, "a stage that applies to all methods tunes one method's training keys (the clients' "
                       f"policy), got {sorted(stage['grids'])} with {sorted(keys)}")
            chosen.setdefault("*", set()).update(keys)
        else:
            for m, grid in stage["grids"].items():
                chosen.setdefault(m, set()).update(grid)
    for m, method in study["methods"].items():  # a run's own value would silently lose to the tuned one
        own = {f"{section}.{k}" for section in ("hparams", "weighting", "training") for k in method.get(section, {})}
        if clash := sorted(own & (chosen.get("*", set()) | chosen.get(m, set()))):
            yield f"stages: methods.{m}", f"{clash} are set by the method and chosen by a tuning stage; drop one"
    for s, setting in study["settings"].items():
        if clash := sorted({f"training.{k}" for k in setting.get("training", {})} & chosen.get("*", set())):
            yield f"stages: settings.{s}", f"{clash} are set by the setting and chosen by a tuning stage; drop one"


def tuned_entries(study: dict, method: str) -> list[dict[str, str]]:
    """The tuning stages whose choice a run of ``method`` (a study method or a swept variant of one) trains with:
    (study, stage, and the method whose choice it takes, '*' for a stage that applies to all)."""
    base = next((b for b, variants in study.get("sweeps", {}).items() if any(v["method"] == method for v in variants)),
                method)
    return [{"study": t["study"], "stage": t["stage"], "method": "*" if t["applies_to"] == "all" else base}
            for t in study.get("tuned_by", []) if t["applies_to"] == "all" or base in t["methods"]]


def _resolve_compare_levels(study: dict, scale: str) -> None:
    """Each table's `compare_levels` left null (the schema default) set by the scale: at paper scale every table
    runs on the paper's own data sets, at embedded scale only those that say so (the others run on stand-ins)."""
    for table in study["tables"].values():
        if table["compare_levels"] is None:
            table["compare_levels"] = scale == "paper"


def _same_dir(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` cannot name one of a config's ``kind`` (studies, settings, methods, tables, figures), or None."""
    if re.fullmatch(NAME_PATTERNS[kind], name):
        return None
    return f"{name!r} is no usable name: it names folders and files, so it must match {NAME_PATTERNS[kind]}"


def unknown_name(name: str, known: Iterable[str], what: str) -> str | None:
    """Why ``name`` is none of ``known`` (the study's settings, methods, ...; ``what`` says which), or None."""
    if name in known:
        return None
    return f"unknown {what} {name!r}{did_you_mean(name, known)}; known: {sorted(known)}"


def check_results_root(config: dict, source: str = "config") -> None:
    """Refuse a results root that is no folder of its own inside the working directory (empty, the working
    directory itself, the file system's root, or outside without ``allow_results_outside``), and one that a
    scale shares with the other: a paper-scale config writing to the embedded default's root, an embedded one
    writing to the paper root, or an embedded study whose folder would be the paper root (a study named "paper")."""
    root, scale = config["results_dir"], config["scale"]
    # lexical, not resolved: a results folder that is a symbolic link to other storage is still inside
    workdir = Path.cwd()
    where = Path(os.path.normpath(workdir / root))
    if where == workdir:
        raise ConfigError(f"{source}: results_dir: {root!r} is the working directory itself: every study's folder "
                          f"and the scorecard would land among the project's files; name a folder (default "
                          f"{EMBEDDED_RESULTS!r})")
    if where == Path(where.anchor):
        raise ConfigError(f"{source}: results_dir: {root!r} is the file system's root; name a folder (default "
                          f"{EMBEDDED_RESULTS!r})")
    if workdir not in where.parents and not config["allow_results_outside"]:
        raise ConfigError(f"{source}: results_dir: {root!r} lies outside the working directory {workdir}; set "
                          "allow_results_outside: true to write there")
    if scale == "paper" and _same_dir(root, EMBEDDED_RESULTS):
        raise ConfigError(f"{source}: results_dir: {root!r} is the embedded default's results root; a paper-scale "
                          f"config needs its own (config/paper.yaml: results_dir: {PAPER_RESULTS}), or a run at "
                          "one scale overwrites the other's results")
    if scale == "embedded" and _same_dir(root, PAPER_RESULTS):
        raise ConfigError(f"{source}: results_dir: {root!r} is the paper scale's results root; an embedded "
                          f"config writes to its own (default {EMBEDDED_RESULTS!r})")
    if scale == "embedded":
        for name in config["studies"]:
            if _same_dir(str(Path(root) / name), PAPER_RESULTS):
                raise ConfigError(f"{source}: studies.{name}: this study's results folder {root}/{name} is the "
                                  f"paper scale's results root {PAPER_RESULTS!r}; rename the study")


def _format_value(value: object) -> str:
    return str(value).replace("-", "m")  # '-' separates the parts of a variant name


def expand_sweeps(study: dict) -> dict[str, list[dict]]:
    """Replace each method that has a ``sweep`` by one named variant per combination of values, and let
    grid blocks name the base method for all of them. Returns base name -> the variants with their
    values, for figures such as FedDisco's (a, b) grid."""
    sweeps: dict[str, list[dict]] = {}
    methods = {}
    for name, method in study["methods"].items():
        sweep = method.pop("sweep", None)
        if not sweep:
            methods[name] = method
            continue
        keys = list(sweep)
        variants = []
        for combo in itertools.product(*(sweep[k] for k in keys)):
            variant = copy.deepcopy(method)
            parts = [name]
            for key, value in zip(keys, combo, strict=True):
                section, field = key.split(".")
                variant.setdefault(section, {})[field] = value
                parts.append(f"{field}{_format_value(value)}")
            vname = "-".join(parts)
            values = ", ".join(f"{key.split('.')[1]}={value}" for key, value in zip(keys, combo, strict=True))
            variant["label"] = f"{method.get('label', name)} ({values})"
            methods[vname] = variant
            variants.append({"method": vname, "values": dict(zip(keys, combo, strict=True))})
        sweeps[name] = variants
    study["methods"] = methods
    for block in study["grid"]:
        block["methods"] = [v["method"] for m in block["methods"] for v in sweeps.get(m, [{"method": m}])]
    return sweeps


Problems = Iterator[tuple[str, str]]  # (key path in the study file, what is wrong), in the order they are checked


def check_study(name: str, study: dict, source: str, prefix: str = "") -> None:
    """What the schema cannot express, raised as a ConfigError naming the file and key of the first problem: names
    that must exist (and be usable as folders), settings against their data sets and federation, methods'
    hyper-parameters against their declared types and ranges (fedrepro.plugins) and their own __init__, training
    values the federation fixes, the runs the grid makes, what each table's and figure's cells need of them, and
    what each table's source and each figure's kind checks of its own (fedrepro.report.table_sources,
    fedrepro.report.figure_kinds)."""
    for check in (_name_problems, _setting_problems, _method_problems, _training_problems, _grid_problems,
                  _table_problems, _last_k_problems, _deviation_problems, _figure_problems):
        for key, problem in check(study):
            raise ConfigError(f"{source}: {_key_path([p for p in (prefix, key) if p])}: {problem}")


def _unknown(key: str, value: str, options: Iterable[str], what: str) -> Problems:
    if problem := unknown_name(value, options, what):
        yield key, problem


def _name_problems(study: dict) -> Problems:
    from fedrepro.data.registry import DATASETS

    for names in ("settings", "methods", "tables", "figures"):
        for key in study[names]:
            if problem := name_problem(names, key):
                yield names, problem
    for dataset in study.get("normalize", {}):
        yield from _unknown(f"normalize.{dataset}", dataset, DATASETS, "data set")


def _setting_problems(study: dict) -> Problems:
    """Each setting's data sets, partition, model (of its federation) and fine-tuning target."""
    from fedrepro.data.registry import DATASETS
    from fedrepro.federations import models_of

    kind = study["federation"]
    for s, setting in study["settings"].items():
        yield from _unknown(f"settings.{s}.dataset", setting["dataset"], DATASETS, "data set")
        for key, problem in partition_problems(setting):
            yield f"settings.{s}.partition.{key}", problem
        yield from _unknown(f"settings.{s}.model", setting["model"], models_of(kind),
                            "model group" if kind == "hetero" else "model")
        part = setting["partition"]
        need = {"dirichlet": "beta", "pathological": "classes_per_client"}.get(part["kind"])
        if need and need not in part:
            yield f"settings.{s}.partition", f"kind {part['kind']!r} needs key {need!r}"
        ood = run_async(study, s)["ood_dataset"]
        if ood is not None:
            yield from _unknown(f"settings.{s}.async.ood_dataset", ood, DATASETS, "data set")
        if part.get("pool_test") and kind != "hetero":
            # the other engines test on the test split: pooling it into the clients' data would leak it
            yield (f"settings.{s}.partition.pool_test", "only a `federation: hetero` study tests on the clients' "
                   "own held-out samples; elsewhere pooling the test split into training leaks it")
        if "target" in setting:
            yield from _unknown(f"settings.{s}.target.dataset", setting["target"]["dataset"], DATASETS, "data set")
        elif "finetune" in setting:
            yield f"settings.{s}.finetune", "fine-tuning options need a `target` data set"


def _method_problems(study: dict) -> Problems:
    """Each method's algorithm (of its federation) and hyper-parameters: names, declared types and ranges, and
    what its __init__ refuses (values that depend on each other), so they stop the run before any job."""
    from fedrepro.federations import hyperparameters_of, methods_of
    from fedrepro.plugins import hyperparameter_problems

    kind = study["federation"]
    methods = methods_of(kind)
    for m, method in study["methods"].items():
        yield from _unknown(f"methods.{m}.algorithm", method["algorithm"], methods, "algorithm")
        allowed = hyperparameters_of(kind, method["algorithm"])
        for key in method["hparams"]:
            if key not in allowed:
                yield (f"methods.{m}.hparams", f"{method['algorithm']} has no hyper-parameter {key!r}"
                       f"{did_you_mean(key, allowed)}; it accepts {sorted(allowed)}")
        for key, problem in hyperparameter_problems(methods[method["algorithm"]], method["hparams"]).items():
            yield f"methods.{m}.hparams.{key}", problem
        try:
            methods[method["algorithm"]](**method["hparams"])
        except (ValueError, TypeError) as exc:
            yield f"methods.{m}.hparams", f"{method['algorithm']} refuses {method['hparams']}: {exc}"


def _training_problems(study: dict) -> Problems:
    """[lo, hi] pairs of the training blocks (defaults, per setting, per method) in order."""
    trainings = {"defaults": study["defaults"],
                 **{f"settings.{s}.training": v.get("training", {}) for s, v in study["settings"].items()},
                 **{f"methods.{m}.training": v.get("training", {}) for m, v in study["methods"].items()}}
    for key, training in trainings.items():
        steps = training.get("straggler_steps")
        if steps and steps[0] > steps[1]:
            yield (f"{key}.straggler_steps", f"{steps}: [lo, hi] needs lo <= hi (a client's local steps are drawn "
                   "from lo..hi)")


def _grid_problems(study: dict) -> Problems:
    """The grid's names, and each run's training as its federation fixes it and its weighting needs it."""
    from fedrepro.federations import federation

    for i, block in enumerate(study["grid"]):
        for s in block["settings"]:
            yield from _unknown(f"grid.{i}.settings", s, study["settings"], "setting")
        for m in block["methods"]:
            yield from _unknown(f"grid.{i}.methods", m, study["methods"], "method")
    kind = study["federation"]
    for s, m in sorted(grid_runs(study)):
        training = run_training(study, s, m)
        for problem in probe_weighting_problems(study["methods"][m]["weighting"], training,
                                                study["settings"][s]["partition"]["clients"]):
            yield f"settings.{s} / methods.{m}.weighting", problem
        for key, value, why in federation(kind).fixed_training:
            if training.get(key, value) != value:
                yield (f"settings.{s} / methods.{m}: training.{key}",
                       f"must be {value!r} in a `federation: {kind}` study ({why}), got {training[key]!r}")
        yield from ((f"settings.{s} / methods.{m}: training.{key}", problem)
                    for key, problem in _schedule_problems(training))
        if training.get("optimizer") == "adam" and training["momentum"]:
            yield (f"settings.{s} / methods.{m}: training.momentum",
                   f"must be 0 with optimizer: adam (Adam's moments are its own), got {training['momentum']!r}")


def evaluations(training: dict) -> int:
    """How many evaluations a run of ``training`` makes: every ``eval_every`` rounds, and at its last round."""
    rounds, every = training["rounds"], training["eval_every"]
    return rounds // every + (rounds % every != 0)


def _schedule_problems(training: dict) -> Problems:
    """An evaluation interval longer than the run: it would be taken silently as "at the last round only"."""
    rounds, every = training["rounds"], training["eval_every"]
    if every > rounds:
        yield "eval_every", f"{every} exceeds rounds ({rounds}): the run would be evaluated at its last round only"


def _last_k_problems(study: dict) -> Problems:
    """A table cell that reports a number over the last k evaluations (last_k_acc, last_k_max_acc, last_k_sd_acc)
    of a run with fewer evaluations than k: it would silently be a number over all of them. (Runs no such cell
    reports may keep any last_k: one-round probes, say.)"""
    seen = set()
    for t, table in study["tables"].items():
        for row in table.get("rows", []):
            for column in table.get("columns", []):
                metric = column.get("metric") or table.get("metric") or ""
                if "average_of" in column or "method" not in row or not metric.startswith("last_k"):
                    continue
                s, m = table_cell_setting(row, column), table_cell_method(row, column)
                if (s, m) in seen or s not in study["settings"] or m not in study["methods"]:
                    continue  # unknown names: the grid's and the table's own checks say so
                seen.add((s, m))
                training = run_training(study, s, m)
                if training["eval_every"] <= training["rounds"] and training["last_k"] > (n := evaluations(training)):
                    yield (f"settings.{s} / methods.{m}: training.last_k",
                           f"{training['last_k']} exceeds the {n} evaluations of {training['rounds']} rounds "
                           f"evaluated every {training['eval_every']}, and tables.{t} reports its {metric}: that "
                           "would silently be a number over all of them")


def _table_problems(study: dict) -> Problems:
    """Each table's averaging columns, its source's own checks, its rows' `cells`, the grid runs behind its
    cells, and its claims."""
    from fedrepro.report.table_sources import table_source

    runs = set(grid_runs(study))
    for t, table in study["tables"].items():
        for j, col in enumerate(table["columns"]):
            for problem in average_column_problems(table, col):
                yield f"tables.{t}.columns.{j}", problem
        cells_from = table_source(table["source"])  # its metrics and cells (fedrepro.report.table_sources)
        for key, problem in cells_from.check(study, table):
            yield ".".join(k for k in ("tables", t, key) if k), problem
        if not cells_from.has_runs:
            continue  # no runs behind its cells
        column_settings = [c["setting"] for c in table["columns"] if "setting" in c]  # not average columns
        for row in table["rows"]:
            yield from _row_cells_problems(study, f"tables.{t}.rows.{row['method']}", row, column_settings)
        for setting, method in table_runs(table):
            if (setting, method) not in runs:
                yield (f"tables.{t}", f"cell ({method}, {setting}) names a run the grid "
                       "does not produce; add it to `grid` or remove it from the table")
            if problem := cells_from.cell_problem(study, setting):
                yield f"tables.{t}", problem
        for i, claim in enumerate(table["claims"]):
            for problem in claim_problems(claim, table):
                yield f"tables.{t}.claims.{i}", problem


def _row_cells_problems(study: dict, where: str, row: dict, column_settings: list[str]) -> Problems:
    """A table row's `cells` entries: known settings and columns, each column in one entry at most, and a
    not_applicable entry naming no run."""
    filled: set[str] = set()
    for i, entry in enumerate(row.get("cells", [])):
        key = f"{where}.cells.{i}"
        run_keys = sorted({"method", "setting", "paper_column"} & set(entry))
        if entry.get("not_applicable") and run_keys:
            yield key, f"a `not_applicable` cell has no run: drop {run_keys}"
        if "setting" in entry:
            yield from _unknown(f"{key}.setting", entry["setting"], study["settings"], "setting")
        for s in entry.get("columns", column_settings):
            yield from _unknown(f"{key}.columns", s, column_settings, "column setting of the table")
            if s in filled:
                yield f"{key}.columns", f"column setting {s!r} is already in another entry of the row's `cells`"
            filled.add(s)


def _deviation_problems(study: dict) -> Problems:
    """Every id a table or figure names must be a row of docs/deviations.md (its captions link there)."""
    from fedrepro.report.deviations import PAGE, deviation_ids

    known_ids = deviation_ids()
    for kind in ("tables", "figures"):
        for key, entry in study[kind].items():
            for deviation in entry["deviations"]:
                if deviation not in known_ids:
                    yield (f"{kind}.{key}.deviations", f"unknown deviation {deviation!r}"
                           f"{did_you_mean(deviation, known_ids)}: not a row of {PAGE}; known: {sorted(known_ids)}")


def _figure_problems(study: dict) -> Problems:
    """Each figure's settings and its kind's own checks, and the grid runs it draws."""
    from fedrepro.report.figure_kinds import figure_problems, figure_runs

    runs = set(grid_runs(study))
    for f, fig in study["figures"].items():
        for key, problem in figure_problems(study, fig):  # its settings, and its kind's own checks
            yield ".".join(k for k in ("figures", f, key) if k), problem
        for s, m in figure_runs(study, fig):
            if (s, m) not in runs:
                yield f"figures.{f}", f"({m}, {s}) is not a run of the grid"


def partition_problems(setting: dict) -> list[tuple[str, str]]:
    """(partition key, problem) for what keeps a setting's partition from being drawn, known before any job from
    its data set's sizes (fedrepro.data.registry.SHAPES; none for a data set without exact ones): more classes
    per client than the data set has, more `samples` than it holds, more clients than samples (clients holding
    nothing), or clients x min_size beyond the samples (dirichlet and imbalance)."""
    from fedrepro.data.registry import ESTIMATED_SIZES, PARTITION_CLASSES, SHAPES, TEST_SIZES
    from fedrepro.partition import MIN_SIZE

    name, part = setting["dataset"], setting["partition"]
    if name not in SHAPES:
        return []
    train, _, classes = SHAPES[name]
    classes = PARTITION_CLASSES.get(name, classes)
    problems = [(key, f"{part[key]} is more than the {classes} classes of {name}")
                for key in ("classes_per_client", "classes_per_biased") if part.get(key, 0) > classes]
    pooled = part.get("pool_test", False)
    if part["kind"] in ("domain", "writer") or name in ESTIMATED_SIZES or (pooled and name not in TEST_SIZES):
        return problems  # its clients are the data set's domains or writers, or its size is not known exactly
    held = train + TEST_SIZES[name] if pooled else train
    what = f"the {held} {'training and test' if pooled else 'training'} samples of {name}"
    if part.get("samples"):
        if part["samples"] > held:
            return [*problems, ("samples", f"{part['samples']} is more than {what}")]
        held, what = part["samples"], f"the {part['samples']} samples it partitions (`samples`)"
    clients, min_size = part["clients"], part.get("min_size", MIN_SIZE)
    if clients > held:
        problems.append(("clients", f"{clients} clients share {what}: some would hold none"))
    elif part["kind"] in ("dirichlet", "imbalance") and clients * min_size > held:
        problems.append(("min_size", f"{clients} clients x min_size {min_size} = {clients * min_size} samples, "
                                     f"more than {what}"))
    return problems


def probe_weighting_problems(weighting: dict, training: dict, clients: int) -> list[str]:
    """What keeps a `pair` / `single` weighting from running on a setting of ``clients`` clients: the options
    it needs, clients it names that do not exist, and sampling that may leave them out of a round."""
    kind = weighting["kind"]
    need = {"pair": ("pair", "r"), "single": ("client",)}.get(kind)
    if need is None:
        return []
    problems = [f"kind {kind!r} needs option {key!r}" for key in need if key not in weighting]
    if kind == "pair" and weighting.get("pair", 0) >= clients // 2:
        problems.append(f"pair {weighting['pair']} does not exist: {clients} clients make {clients // 2} "
                        f"disjoint pairs (0..{clients // 2 - 1})")
    if kind == "single" and weighting.get("client", 0) >= clients:
        problems.append(f"client {weighting['client']} does not exist (clients 0..{clients - 1})")
    if training["join_ratio"] < 1:
        problems.append(f"kind {kind!r} weights named clients, so every client must be sampled every round "
                        f"(join_ratio 1, got {training['join_ratio']})")
    return problems


def table_cell(row: dict, column: dict) -> dict:
    """The entry of the row's ``cells`` that covers this column (by its setting), or {}: which run fills the cell
    when it is not the row's method on the column's setting (see the study schema's `cells`)."""
    for entry in row.get("cells", []):
        if "columns" not in entry or column.get("setting") in entry["columns"]:
            return entry
    return {}


def table_cell_method(row: dict, column: dict) -> str:
    """The method of a table cell: the row's (or its ``cells`` entry's), with the column's ``method_suffix``
    (e.g. "-disco") appended, so a "without / with Disco" pair of columns needs no duplicated rows, and a paper
    row that names different runs per data set (FedDisco's Table 1 row is SCAFFOLD + Disco on Fashion-MNIST,
    FedDyn + Disco elsewhere) stays one row."""
    return table_cell(row, column).get("method", row["method"]) + column.get("method_suffix", "")


def table_cell_setting(row: dict, column: dict) -> str:
    """The setting whose runs fill a table cell: the column's, or its ``cells`` entry's (one run shown in several
    columns of a row whose method does not depend on what they vary: Feddle's Center trains on the server's data
    only, so one run per data set fills every partition and delay column of its Table 5 row)."""
    return table_cell(row, column).get("setting", column["setting"])


def table_runs(table: dict) -> list[tuple[str, str]]:
    """The (setting, method) runs whose seeds fill a table's cells (not an `average_of` column's, nor a row's
    `not_applicable` cells'), in table order, each once."""
    runs: dict[tuple[str, str], None] = {}
    for row in table["rows"]:
        for col in table["columns"]:
            if "average_of" not in col and not table_cell(row, col).get("not_applicable"):
                runs[(table_cell_setting(row, col), table_cell_method(row, col))] = None
    return list(runs)


def column_refs(column: dict) -> set[str]:
    """The names a claim (or an `average_of`) may call a table column by: its `label` (if given) and its
    `setting` (an averaging column has none)."""
    return {*([column["setting"]] if "setting" in column else []), *([column["label"]] if column.get("label") else [])}


# what makes two columns' numbers the same kind of number: an average over columns mixes none of them
_COLUMN_NUMBER_KEYS = ("metric", "round", "reduce", "scale", "paper_value")
# keys that choose a column's runs or number, which an averaging column takes from the columns it averages
_RUN_KEYS = ("setting", "method_suffix", "metric", "round", "reduce", "scale")


def average_sources(table: dict, column: dict) -> list[int]:
    """Indices (in ``table["columns"]``) of the columns an averaging column's `average_of` names, by label or
    setting; raises ValueError unless each name picks exactly one column that is not itself an average."""
    out = []
    for name in column["average_of"]:
        hits = [j for j, c in enumerate(table["columns"]) if "average_of" not in c and name in column_refs(c)]
        if len(hits) != 1:
            known = sorted({r for c in table["columns"] if "average_of" not in c for r in column_refs(c)})
            hint = did_you_mean(name, known) if not hits else " (name them by their labels)"
            raise ValueError(f"average_of: {name!r} must name exactly one (non-averaging) column of the table, "
                             f"it names {len(hits)}{hint}; columns: {known}")
        out.append(hits[0])
    return out


def average_column_problems(table: dict, column: dict) -> list[str]:
    """What is wrong with one table column's choice between a run (`setting`) and an average over other
    columns of its row (`average_of`, the papers' "Average" columns)."""
    if ("setting" in column) == ("average_of" in column):
        return ["a column needs exactly one of `setting` (its runs) or `average_of` (columns of the table)"]
    if "setting" in column:
        return []
    problems = [f"an averaging column takes {key!r} from the columns it averages; remove it"
                for key in _RUN_KEYS if key in column]
    if not column.get("label"):
        problems.append("an averaging column needs a `label` (it has no setting to take one from)")
    if column.get("paper_value", "mean") != "mean":
        problems.append("an averaging column compares with a published mean (`paper_value: mean`)")
    try:
        sources = average_sources(table, column)
    except ValueError as err:
        return [*problems, str(err)]
    kinds = {tuple((key, table["columns"][j].get(key)) for key in _COLUMN_NUMBER_KEYS) for j in sources}
    if len(kinds) > 1:
        problems.append(f"average_of: the columns {column['average_of']} show different kinds of numbers "
                        f"({', '.join(_COLUMN_NUMBER_KEYS)} differ); an average needs one kind")
    return problems


def claim_problems(claim: dict, table: dict) -> list[str]:
    """What is wrong with one ranking claim of a table: rows it names that the table lacks, columns that
    match none of the table's (or, for a column pair, not exactly one)."""
    forms = (("best",), ("better", "than"), ("better_column", "than_column"))
    given = sorted(k for form in forms for k in form if k in claim)
    if tuple(given) not in {tuple(sorted(f)) for f in forms}:
        return [f"a claim is one of {' | '.join('{' + ', '.join(f) + '}' for f in forms)}; this one has {given}"]
    rows = [r["method"] for r in table["rows"]]
    refs = [column_refs(c) for c in table["columns"]]
    known_cols = sorted(set().union(*refs))
    problems = []
    for key in ("best", "better", "than"):
        if key in claim and claim[key] not in rows:
            problems.append(f"{key}: {claim[key]!r} is not a row's method{did_you_mean(claim[key], rows)}; "
                            f"rows: {rows}")
    for name in claim.get("rows") or []:
        if name not in rows:
            problems.append(f"rows: {name!r} is not a row's method{did_you_mean(name, rows)}; rows: {rows}")
    if claim.get("rows") is not None and "better_column" not in claim:
        problems.append("rows: only better_column claims take `rows`")
    for name in claim.get("columns") or []:
        if not any(name in r for r in refs):
            problems.append(f"columns: {name!r} names no column{did_you_mean(name, known_cols)}; "
                            f"columns: {known_cols}")
    for key in ("better_column", "than_column"):
        if key in claim and sum(claim[key] in r for r in refs) != 1:
            problems.append(f"{key}: {claim[key]!r} must name exactly one column (by label); columns: {known_cols}")
    return problems


def grid_runs(study: dict) -> list[tuple[str, str]]:
    """(setting, method) pairs of the study, in grid order, without duplicates."""
    seen: dict[tuple[str, str], None] = {}
    for block in study["grid"]:
        for s in block["settings"]:
            for m in block["methods"]:
                seen[(s, m)] = None
    return list(seen)


def run_spec(study: dict, setting: str, method: str) -> dict[str, Any]:
    """Everything one train job needs, fully resolved (the job fingerprints exactly this)."""
    s, m = study["settings"][setting], study["methods"][method]
    return {
        "study": study["name"], "federation": study["federation"], "setting": setting, "method": method,
        "dataset": s["dataset"], "partition": s["partition"], "model": s["model"],
        "image_size": s.get("image_size"), "channels": s.get("channels"),
        "test_longtail_rho": s.get("test_longtail_rho"),
        # only settings that set it carry the key, so other runs' specs (and checkpoint digests) are unchanged
        **({"test_samples": s["test_samples"]} if s.get("test_samples") else {}),
        **({"normalize": normalize} if (normalize := run_normalize(study, setting)) else {}),
        "algorithm": m["algorithm"], "hparams": m["hparams"], "weighting": m["weighting"],
        "training": run_training(study, setting, method),
        # only async studies carry the key, so the specs (and checkpoint digests) of the others are unchanged
        **({"async": run_async(study, setting)} if study["federation"] == "async" else {}),
        # the tuning stages whose choice the job reads and applies before it trains (fedrepro.tuning)
        **({"tuned": tuned} if (tuned := tuned_entries(study, method)) else {}),
    }


def run_normalize(study: dict, setting: str) -> dict[str, list[float]] | None:
    """The fixed input normalisation of a setting: its own `normalize`, else the study's for its data set,
    else None (the training split's statistics)."""
    s = study["settings"][setting]
    return s.get("normalize") or study.get("normalize", {}).get(s["dataset"])


def run_async(study: dict, setting: str) -> dict[str, Any]:
    """The asynchronous settings of one run: the study's `async` defaults, overridden by the setting's."""
    return {**study["async"], **study["settings"][setting].get("async", {})}


def run_training(study: dict, setting: str, method: str) -> dict[str, Any]:
    """The training keys of one run: the study's defaults, overridden by the setting's, then the method's."""
    training = {k: study["defaults"][k] for k in TRAINING_KEYS}
    training.update({k: study["defaults"][k] for k in OPTIONAL_TRAINING_KEYS if k in study["defaults"]})
    training.update(study["settings"][setting].get("training", {}))
    training.update(study["methods"][method].get("training", {}))
    return training


def job_resources(train_resources: dict, study: dict, setting: str, method: str) -> dict[str, Any]:
    """The cluster resources of one train or fine-tuning job: the config's ``train_resources``, overridden by
    the setting's ``resources``, then the method's."""
    return {**train_resources, **study["settings"][setting].get("resources", {}),
            **study["methods"][method].get("resources", {})}


def label_of(study: dict, kind: str, key: str) -> str:
    """Display label of a method or setting (its `label`, else its key)."""
    return study[kind][key].get("label", key)


FINETUNE_KEYS = ("epochs", "mode", "optimizer", "lr", "momentum", "weight_decay", "batch_size", "max_train_samples")


def transfer_runs(study: dict) -> list[tuple[str, str]]:
    """The grid runs whose setting has a `target` data set: each gets a fine-tuning job (FedGTST)."""
    return [(s, m) for s, m in grid_runs(study) if "target" in study["settings"][s]]


def finetune_spec(study: dict, setting: str, method: str) -> dict[str, Any]:
    """Everything one fine-tuning job needs: the pre-trained model's architecture and input, the target
    data set and the fine-tuning options (the study's, overridden by the setting's)."""
    s = study["settings"][setting]
    options = {k: study["finetune"][k] for k in FINETUNE_KEYS}
    options.update(s.get("finetune", {}))
    return {
        "study": study["name"], "setting": setting, "method": method, "model": s["model"],
        "dataset": s["dataset"], "image_size": s.get("image_size"), "channels": s.get("channels"),
        "target": s["target"]["dataset"], "finetune": options,
    }


def spec_digest(spec: dict) -> str:
    """A short hash of what a run computes (not how often it checkpoints): checkpoints live under it, so
    editing a hyper-parameter starts fresh runs beside the old checkpoints instead of tripping over them."""
    import hashlib
    import json

    relevant = {**spec, "training": {k: v for k, v in spec["training"].items() if k != "checkpoint_every"}}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]
