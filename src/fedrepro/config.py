"""Config and study files loaded and resolved: schema validation with defaults, `extends`, sweeps expanded, tuning
stages derived, every study checked (fedrepro.checks) and its results root refused where it would mix scales.

Everything about a paper lives in its study file; this module only resolves it, and what a resolved study means
(its runs and their specs) is fedrepro.study's. Errors name the file, the key path, the bad value and what would
have been accepted.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from fedrepro.checks import check_study, name_problem, tuning_problems
from fedrepro.plugins import did_you_mean
from fedrepro.study import NAME_PATTERNS, ConfigError, key_path, tuned_entries  # noqa: F401 (the workflow's names)

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "workflow" / "schemas"
# Each scale writes under its own results root, so a run at one scale never overwrites the other's files
# (paper-scale runs cost GPU days; the embedded default reruns in minutes).
EMBEDDED_RESULTS = "results"
PAPER_RESULTS = "results/paper"


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


def _describe(error: jsonschema.ValidationError, prefix: str) -> str:
    where = key_path([*(prefix.split(".") if prefix else []), *error.absolute_path])
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


def add_configfile_option(parser: argparse.ArgumentParser) -> None:
    """A command's ``--configfile``: config files as Snakemake takes them, read after config/config.yaml."""
    parser.add_argument("--configfile", nargs="+", required=True,
                        help="config files as given to snakemake (config/config.yaml is read first)")


def command_config(configfiles: list[str]) -> dict:
    """config/config.yaml, then ``configfiles``, merged and resolved as Snakemake reads them (ConfigError naming
    the file and key at fault)."""
    return resolve_config(merge_configfiles(str(REPO / "config" / "config.yaml"), *configfiles),
                          source=", ".join(configfiles))


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
    try:
        sweeps = expand_sweeps(study)
    except ConfigError as err:
        raise ConfigError(f"{where}: {prefix + ': ' if prefix else ''}{err}") from None
    validate(study, "study", where, prefix)  # the swept values too
    study["sweeps"] = sweeps
    check_study(name, study, where, prefix)
    _resolve_compare_levels(study, scale)
    study["name"], study["tuned_by"] = name, tuned_by
    return study


TUNING_SEPARATOR = "--tune-"  # <study>--tune-<stage>: a tuning stage's runs, a study of their own


def run_studies(config: dict) -> dict[str, dict]:
    """Every study of a resolved ``config`` that has train jobs: its own studies and its tuning stages' runs."""
    return {**config["studies"], **config.get("tuning_studies", {})}


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
    for key, problem in tuning_problems(study):
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
                        "methods": list(stage["grids"]), "metric": tuning["metric"],
                        **({"per": tuning["per"]} if tuning.get("per") else {})})
    return out, earlier


def _resolve_compare_levels(study: dict, scale: str) -> None:
    """Each table's `compare_levels` left null (the schema default) set by the scale: at paper scale every table
    runs on the paper's own data sets, at embedded scale only those that say so (the others run on stand-ins)."""
    for table in study["tables"].values():
        if table["compare_levels"] is None:
            table["compare_levels"] = scale == "paper"


def _same_dir(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


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


def sweep_combinations(sweep: dict[str, list | dict], where: str = "sweep") -> list[tuple[dict, list[str]]]:
    """The points of a ``sweep`` (dotted key -> values, or {same_as: another key}): every combination of its
    axes, in their order, each as (dotted key -> value, its tied keys included; the keys that name it, the axes).
    ConfigError naming the key whose ``same_as`` is no axis of the same sweep."""
    axes = [k for k, v in sweep.items() if isinstance(v, list)]
    for key, value in sweep.items():
        if isinstance(value, dict) and value["same_as"] not in axes:
            raise ConfigError(f"{where}.{key}: same_as {value['same_as']!r} is no key of the same sweep with values "
                              f"of its own (those: {axes})")
    points = []
    for combo in itertools.product(*(sweep[k] for k in axes)):
        picked = dict(zip(axes, combo, strict=True))
        points.append(({k: picked[v["same_as"]] if isinstance(v, dict) else picked[k] for k, v in sweep.items()},
                       axes))
    return points


def expand_sweeps(study: dict) -> dict[str, list[dict]]:
    """Replace each method that has a ``sweep`` by one named variant per combination of values (sweep_combinations:
    a tied key follows its axis, and only the axes name the variant), and let grid blocks name the base method
    for all of them. Returns base name -> the variants with their values, for figures such as FedDisco's (a, b)
    grid."""
    sweeps: dict[str, list[dict]] = {}
    methods = {}
    for name, method in study["methods"].items():
        sweep = method.pop("sweep", None)
        if not sweep:
            methods[name] = method
            continue
        variants = []
        for point, axes in sweep_combinations(sweep, f"methods.{name}.sweep"):
            variant = copy.deepcopy(method)
            for key, value in point.items():
                section, field = key.split(".")
                variant.setdefault(section, {})[field] = value
            vname = "-".join([name, *(f"{key.split('.')[1]}{_format_value(point[key])}" for key in axes)])
            values = ", ".join(f"{key.split('.')[1]}={value}" for key, value in point.items())
            variant["label"] = f"{method.get('label', name)} ({values})"
            methods[vname] = variant
            variants.append({"method": vname, "values": point})
        sweeps[name] = variants
    study["methods"] = methods
    for block in study["grid"]:
        block["methods"] = [v["method"] for m in block["methods"] for v in sweeps.get(m, [{"method": m}])]
    return sweeps


