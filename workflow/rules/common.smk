# Config resolution and the path helpers every stage uses.
import json
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# Jobs may run in the conda envs of envs/, where fedrepro is not installed, so import it from the checkout.
SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)

from fedrepro.config import ConfigError, grid_runs, label_of, resolve_config, run_spec  # noqa: E402
from fedrepro.data.registry import get_spec, raw_files  # noqa: E402

try:
    CFG = resolve_config(config, source="config", root=Path(workflow.basedir))
except ConfigError as exc:
    raise WorkflowError(f"invalid configuration: {exc}") from None

DATA = CFG["data_dir"]
RES = CFG["results_dir"]
STUDIES = CFG["studies"]


def study_of(wildcards):
    return STUDIES[wildcards.study]


def seeds_of(wildcards):
    return study_of(wildcards)["seeds"]


def setting_of(wildcards):
    return study_of(wildcards)["settings"][wildcards.setting]


def partition_files(wildcards):
    return [
        f"{RES}/{wildcards.study}/partitions/{wildcards.setting}/seed{s}.npz"
        for s in seeds_of(wildcards)
    ]


def artifacts():
    out = []
    for study, spec in STUDIES.items():
        out += expand(f"{RES}/{study}/tables/{{t}}.{{ext}}", t=spec["tables"], ext=["md", "tex", "csv"])
        out += expand(f"{RES}/{study}/figures/{{f}}.{{ext}}", f=spec["figures"], ext=["png", "pdf"])
    return out


def table_spec(study, name):
    """A table of the study file with labels filled in from the methods and settings."""
    s = STUDIES[study]
    t = s["tables"][name]
    return {
        **t,
        "name": name,
        "rows": [{"label": label_of(s, "methods", r["method"]), "paper": None, **r} for r in t["rows"]],
        "columns": [
            {"label": label_of(s, "settings", c["setting"]), "paper": None, **c} for c in t["columns"]
        ],
    }


def figure_spec(study, name):
    s = STUDIES[study]
    f = s["figures"][name]
    return {
        **f,
        "name": name,
        "settings": [{"setting": k, "label": label_of(s, "settings", k)} for k in f["settings"]],
        "methods": [{"method": k, "label": label_of(s, "methods", k)} for k in f["methods"]],
    }


def published_numbers(wildcards):
    """The paper's published numbers (config/paper/<paper>.csv), if the study names a paper."""
    paper = study_of(wildcards)["paper"]
    return [f"{workflow.basedir}/config/paper/{paper}.csv"] if paper else []
