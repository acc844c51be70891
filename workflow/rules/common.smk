# Config resolution and the path helpers every stage uses.
import json
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# Jobs may run in the conda envs of envs/, where fedrepro is not installed, so import it from the checkout.
SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)

from fedrepro.config import TUNING_SEPARATOR, resolve_config, run_studies  # noqa: E402
from fedrepro.plugins import did_you_mean  # noqa: E402
from fedrepro.study import (  # noqa: E402
    NAME_PATTERNS,
    ConfigError,
    finetune_spec,
    grid_runs,
    job_resources,
    run_async,
    run_spec,
    spec_digest,
    transfer_runs,
)
from fedrepro.data.registry import get_spec, raw_files  # noqa: E402
from fedrepro.data.weights import weights_of  # noqa: E402
from fedrepro.report import figure_kinds, table_sources  # noqa: E402
from fedrepro.report.captions import figure_caption, table_caption  # noqa: E402
from fedrepro.report.table_sources import table_source  # noqa: E402
from fedrepro.tuning import TuningError, choice_path, stage_params  # noqa: E402

try:
    CFG = resolve_config(config, source="config", root=Path(workflow.basedir))
except ConfigError as exc:
    raise WorkflowError(f"invalid configuration: {exc}") from None

DATA = CFG["data_dir"]
WEIGHTS = CFG["weights_dir"]
RES = CFG["results_dir"]
STUDIES = CFG["studies"]
# the studies whose runs train: the config's, and each tuning stage's grid as a study of its own (<study>--tune-<stage>,
# fedrepro.config.tuning_stage_studies); only the config's have tables, figures and a scorecard section
RUN_STUDIES = run_studies(CFG)


def named(what, name, entries, where=""):
    """``entries[name]``; a target naming an unknown study, setting, method, table or figure is refused with the
    known ones (not a KeyError from an input function)."""
    if name not in entries:
        raise WorkflowError(f"unknown {what} {name!r}{where}{did_you_mean(name, entries)}; known: {sorted(entries)}")
    return entries[name]


def study_of(wildcards):
    return named("study", wildcards.study, RUN_STUDIES)


def seeds_of(wildcards):
    return study_of(wildcards)["seeds"]


def setting_of(wildcards):
    return named("setting", wildcards.setting, study_of(wildcards)["settings"], f" in study {wildcards.study!r}")


def run_of(wildcards):
    """(study, setting, method) of a train or fine-tuning target, the setting and method checked to exist."""
    setting_of(wildcards)
    named("method", wildcards.method, study_of(wildcards)["methods"], f" in study {wildcards.study!r}")
    return study_of(wildcards), wildcards.setting, wildcards.method


def table_of(wildcards):
    return named("table", wildcards.table, study_of(wildcards)["tables"], f" in study {wildcards.study!r}")


def figure_of(wildcards):
    return named("figure", wildcards.figure, study_of(wildcards)["figures"], f" in study {wildcards.study!r}")


def partition_files(wildcards):
    return [
        f"{RES}/{wildcards.study}/partitions/{wildcards.setting}/seed{s}.npz"
        for s in seeds_of(wildcards)
    ]


def artifacts():
    """Every table and figure of every study, the scorecard, and the README showcase if configured."""
    out = []
    for study, spec in STUDIES.items():
        out += expand(f"{RES}/{study}/tables/{{t}}.{{ext}}", t=spec["tables"], ext=["md", "tex", "html", "csv"])
        out += expand(f"{RES}/{study}/figures/{{f}}.{{ext}}", f=spec["figures"], ext=["png", "pdf"])
        out += [str(choice_path(RES, study, t["stage"], ".md")) for t in spec["tuned_by"]]
    if any(spec["tables"] for spec in STUDIES.values()):
        out += [f"{RES}/scorecard.md", f"{RES}/scorecard.html"]
    if CFG["showcase"]:
        out += ["docs/showcase/figure.png", "docs/showcase/scorecard.md"]
    return out


def table_title(study, name):
    return STUDIES[study]["tables"][name]["caption"] or name


def figure_title(study, name):
    return STUDIES[study]["figures"][name]["caption"] or name


def scorecard_tables():
    """Every table of every study, {study, spec}, in the order of scorecard_cells()."""
    return [{"study": s, "spec": table_spec(s, t)} for s, spec in STUDIES.items() for t in spec["tables"]]


def scorecard_cells():
    return [f"{RES}/{s}/tables/{t}.csv" for s, spec in STUDIES.items() for t in spec["tables"]]


def scorecard_figures():
    """study -> its figures' job specs: the per-run numbers they show judge the runs' plateau too."""
    return {s: [figure_spec(s, f) for f in spec["figures"]] for s, spec in STUDIES.items()}


def scorecard_coverage():
    """study -> [published cells shown beside ours, published cells] (fedrepro.report.coverage)."""
    from fedrepro.report.coverage import config_coverage

    return {s: [c.shown, c.total] for s, c in config_coverage(CFG).items()}


def published_files():
    """Every study's published-numbers file: the scorecard's coverage counts read them."""
    return sorted({f"{workflow.basedir}/config/paper/{s['paper']}.csv" for s in STUDIES.values() if s["paper"]})


def showcase_figure(wildcards):
    return f"{RES}/{CFG['showcase']['study']}/figures/{CFG['showcase']['figure']}.png"


def showcase_caption():
    study, figure = CFG["showcase"]["study"], CFG["showcase"]["figure"]
    return f"{figure_title(study, figure)} ({study}, {CFG['scale']} scale)"


def table_spec(study, name):
    """A table of the study file with labels filled in and the study's seeds: fedrepro.report.table_sources."""
    return table_sources.table_spec(STUDIES[study], name)


def figure_spec(study, name):
    """A figure of the study file with labels, and what its kind adds, filled in, and the runs it draws and the
    study's seeds (its tables must have rows for every one): fedrepro.report.figure_kinds."""
    return figure_kinds.figure_spec(STUDIES[study], name)


def finetune_indexes(wildcards):
    """The fine-tuning jobs' indexes of a study (one per transferred method x setting)."""
    return [f"{RES}/{wildcards.study}/finetune/{s}/{m}/seeds.json" for s, m in transfer_runs(study_of(wildcards))]


def table_summary(wildcards):
    """What a table's cells read: its source's aggregated table (summary.csv; finetune.csv for `source: finetune`),
    nothing for a table its job computes (fedrepro.report.table_sources)."""
    source = table_source(table_of(wildcards)["source"])
    return f"{RES}/{wildcards.study}/{source.cells_from}" if source.has_runs else []


def table_runs(wildcards):
    """runs.csv, for the metrics derived from the curves of the runs behind the cells; nothing for a computed table."""
    return [f"{RES}/{wildcards.study}/runs.csv"] if table_source(table_of(wildcards)["source"]).has_runs else []


def figure_inputs(wildcards):
    """The files a figure's job reads, in the order its kind's renderer takes them (fedrepro.report.figure_kinds)."""
    return figure_kinds.figure_inputs(study_of(wildcards), figure_of(wildcards), f"{RES}/{wildcards.study}")


def published_numbers(wildcards):
    """The paper's published numbers (config/paper/<paper>.csv), if the study names a paper."""
    paper = study_of(wildcards)["paper"]
    return [f"{workflow.basedir}/config/paper/{paper}.csv"] if paper else []


def server_data_files(wildcards):
    """The out-of-domain server data set of an async setting (Feddle), if it names one."""
    study = study_of(wildcards)
    ood = run_async(study, wildcards.setting)["ood_dataset"] if study["federation"] == "async" else None
    return [f"{DATA}/{ood}.npz"] if ood else []


def weights_files(wildcards):
    """The pretrained weights file of the setting's model (Feddle's ResNet18 / ViT), if it loads one."""
    name = weights_of(setting_of(wildcards)["model"])
    return [f"{WEIGHTS}/{name}.pth"] if name else []


def tuned_choices(wildcards):
    """The choice files of the tuning stages a train job's runs train with (fedrepro.tuning): "study/stage" -> path."""
    return {f"{t['study']}/{t['stage']}": str(choice_path(RES, t["study"], t["stage"]))
            for t in run_spec(*run_of(wildcards)).get("tuned", [])}


def tuning_stage(wildcards):
    """What choose_tuning reads of <study>/<stage> (fedrepro.tuning.stage_params)."""
    try:
        return stage_params(CFG, wildcards.study, wildcards.stage)
    except TuningError as err:
        raise WorkflowError(str(err)) from None


def tuning_scored(wildcards):
    """The aggregated table choose_tuning scores <study>/<stage>'s runs from (fedrepro.report.table_sources)."""
    return table_sources.scored_source(tuning_stage(wildcards)["metric"]).cells_from


def train_spec(wildcards):
    """The run spec, plus the path of the pretrained weights its model loads (models trained from scratch:
    the bare run spec, so their checkpoints' fingerprints do not change)."""
    spec = run_spec(*run_of(wildcards))
    weights = weights_files(wildcards)
    return {**spec, "weights": weights[0]} if weights else spec


def resource_of(key):
    """A rule's resource ``key`` of the job's setting x method (train_resources, or the study's override)."""
    return lambda w: job_resources(CFG["train_resources"], *run_of(w))[key]


def checkpoint_dir(wildcards):
    """Checkpoints of a train job, under a digest of its run spec (an edited config starts fresh)."""
    spec = run_spec(*run_of(wildcards))
    return f"{RES}/{wildcards.study}/checkpoints/{wildcards.setting}/{wildcards.method}/{spec_digest(spec)}"
