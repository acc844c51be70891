"""What the schema cannot check of a study, each problem named by the study file and key path: names that must
exist (and be usable as folders), settings against their data sets and federation, methods' hyper-parameters,
training values, the runs the grid makes, what each table's and figure's cells need of them, and a tuning's
stages. fedrepro.config runs them on every study it resolves."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from fedrepro.plugins import did_you_mean
from fedrepro.study import (
    NAME_PATTERNS,
    ConfigError,
    average_sources,
    column_refs,
    evaluations,
    grid_runs,
    key_path,
    run_async,
    run_training,
    table_cell_method,
    table_cell_setting,
    table_runs,
    unknown_name,
)


def tuning_problems(study: dict) -> Problems:
    """(key under `tuning`, problem) of a study's tuning stages, in order."""
    from fedrepro.report.table_sources import scored_source

    tuning = study["tuning"]
    for s in tuning["settings"]:
        yield from _unknown("settings", s, study["settings"], "setting")
        if s in study["settings"] and (problem := scored_source(tuning["metric"]).cell_problem(study, s)):
            yield "settings", f"{problem}, which the metric {tuning['metric']} scores"
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
    gridded = {m for stage in tuning["stages"] for m in stage["grids"]}
    for m, method in study["methods"].items():
        if (like := method.get("tuned_as")) is None:
            continue
        key = f"stages: methods.{m}.tuned_as"
        if like not in study["methods"]:
            continue  # named by the method checks
        if like not in chosen:
            yield key, f"{like!r} is tuned by no stage's grid (tuned: {sorted(set(chosen) - {'*'})})"
        elif m in gridded:
            yield key, "the method is in a stage's grid itself: take its own choice or the other's, not both"
    for m, method in study["methods"].items():  # a run's own value would silently lose to the tuned one
        own = {f"{section}.{k}" for section in ("hparams", "weighting", "training") for k in method.get(section, {})}
        tuned_like = method.get("tuned_as") or m
        if clash := sorted(own & (chosen.get("*", set()) | chosen.get(tuned_like, set()))):
            yield f"stages: methods.{m}", f"{clash} are set by the method and chosen by a tuning stage; drop one"
    for s, setting in study["settings"].items():
        if clash := sorted({f"training.{k}" for k in setting.get("training", {})} & chosen.get("*", set())):
            yield f"stages: settings.{s}", f"{clash} are set by the setting and chosen by a tuning stage; drop one"
    if per := tuning.get("per"):
        yield from _per_problems(study, per, chosen)


def _per_problems(study: dict, per: str, chosen: dict[str, set[str]]) -> Problems:
    """(key, problem) of a tuning chosen ``per`` a setting key: a setting that a tuned run trains on (a grid block
    of a method some stage tunes: ``chosen``, '*' for every method) whose value of it no tuning setting has, as no
    choice would be made for it."""
    settings = study["settings"]
    tuned_values = {str(settings[s][per]) for s in study["tuning"]["settings"] if s in settings}
    for i, block in enumerate(study["grid"]):
        tuned = [m for m in block["methods"] if "*" in chosen or m in chosen
                 or study["methods"].get(m, {}).get("tuned_as") in chosen]
        for s in block["settings"]:
            if tuned and s in settings and str(settings[s][per]) not in tuned_values:
                yield (f"per: grid.{i}", f"setting {s}'s {per} {settings[s][per]!r} has no tuning setting, so its "
                       f"tuned runs ({', '.join(tuned)}) would have no choice; tuning settings' {per}s: "
                       f"{sorted(tuned_values)}")


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` cannot name one of a config's ``kind`` (studies, settings, methods, tables, figures), or None."""
    if re.fullmatch(NAME_PATTERNS[kind], name):
        return None
    return f"{name!r} is no usable name: it names folders and files, so it must match {NAME_PATTERNS[kind]}"


# what makes two columns' numbers the same kind of number: an average over columns mixes none of them
_COLUMN_NUMBER_KEYS = ("metric", "round", "reduce", "scale", "paper_value")


# keys that choose a column's runs or number, which an averaging column takes from the columns it averages
_RUN_KEYS = ("setting", "method_suffix", "metric", "round", "reduce", "scale")

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
            raise ConfigError(f"{source}: {key_path([p for p in (prefix, key) if p])}: {problem}")


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
        if (like := method.get("tuned_as")) is not None:
            if not study.get("tuning"):
                yield f"methods.{m}.tuned_as", "the study has no `tuning` block: nothing chooses values to take"
            yield from _unknown(f"methods.{m}.tuned_as", like, set(study["methods"]) - {m}, "method")
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
            named = [(f"{kind}.{key}.deviations", d) for d in entry["deviations"]]
            named += [(f"{kind}.{key}.rows.{i}.deviations", d)
                      for i, row in enumerate(entry.get("rows") or []) for d in row.get("deviations") or []]
            for where, deviation in named:
                if deviation not in known_ids:
                    yield (where, f"unknown deviation {deviation!r}"
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
