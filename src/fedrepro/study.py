"""What a resolved study means: the runs its grid makes and what each run trains with (its spec), which runs
fill a table's cells, and the names a study may use. No loading and no checks here (fedrepro.config loads and
resolves, fedrepro.checks checks), so the report and the workflow read a study's semantics from one module that
imports neither."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from fedrepro import defaults
from fedrepro.plugins import did_you_mean

# names that become folders, files and Snakemake wildcards (the Snakefile's wildcard_constraints are these): no "/",
# space or other character a path or shell would read; settings and methods may hold the "." of a swept value
NAME_PATTERNS = {"studies": r"[A-Za-z0-9_\-]+", "settings": r"[A-Za-z0-9_.\-]+", "methods": r"[A-Za-z0-9_.\-]+",
                 "tables": r"[A-Za-z0-9_\-]+", "figures": r"[A-Za-z0-9_\-]+"}


class ConfigError(ValueError):
    """A config or study file that cannot be used; the message says where and why."""


TRAINING_KEYS = defaults.training_keys()  # every run spec carries these


# training keys a run spec carries only where the study sets them (the schema's `absent:` says what absence means:
# plain SGD at a constant rate, no early stop), so the specs and checkpoint digests of the other runs are unchanged
OPTIONAL_TRAINING_KEYS = defaults.optional_training_keys()


def sweep_base(study: dict, method: str) -> str:
    """The study method whose `sweep` made the variant ``method`` (a grid point), or ``method`` itself."""
    return next((base for base, variants in study.get("sweeps", {}).items()
                 if any(v["method"] == method for v in variants)), method)


def tuned_entries(study: dict, setting: str, method: str) -> list[dict[str, str]]:
    """The tuning stages whose choice a run of ``method`` (a study method or a swept variant of one) on ``setting``
    trains with: (study, stage, the method whose choice it takes, '*' for a stage that applies to all, and for a
    tuning chosen `per` a setting key, ``group``: the setting's value of it). A method with ``tuned_as`` takes that
    method's choices, and so does each variant its `sweep` makes (the variant carries it)."""
    base = study["methods"].get(method, {}).get("tuned_as") or sweep_base(study, method)
    return [{"study": t["study"], "stage": t["stage"], "method": "*" if t["applies_to"] == "all" else base,
             **({"group": str(study["settings"][setting][t["per"]])} if t.get("per") else {})}
            for t in study.get("tuned_by", []) if t["applies_to"] == "all" or base in t["methods"]]


def unknown_name(name: str, known: Iterable[str], what: str) -> str | None:
    """Why ``name`` is none of ``known`` (the study's settings, methods, ...; ``what`` says which), or None."""
    if name in known:
        return None
    return f"unknown {what} {name!r}{did_you_mean(name, known)}; known: {sorted(known)}"


def evaluations(training: dict) -> int:
    """How many evaluations a run of ``training`` makes: every ``eval_every`` rounds, and at its last round."""
    rounds, every = training["rounds"], training["eval_every"]
    return rounds // every + (rounds % every != 0)


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
        **({"tuned": tuned} if (tuned := tuned_entries(study, setting, method)) else {}),
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


FINETUNE_KEYS = defaults.finetune_keys()


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
    relevant = {**spec, "training": {k: v for k, v in spec["training"].items() if k != "checkpoint_every"}}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]


def key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"
