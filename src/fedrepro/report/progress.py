"""A study's tables from the train jobs finished so far, while the study runs in parts (days of a laptop's cores:
Feddle's Table 5, docs/measurements/laptop-feddle-table5.md).

The table rule renders a table only from every run of its cells (fedrepro.report.table_sources refuses any
missing seed), so a study run in parts shows nothing until its last part. ``progress_table`` renders the same
table, by the same code (derived metrics, plateau marks ‡, the published numbers beside ours), from the jobs of
its cells that have finished every seed of the config's current spec, each cell without one showing a dash, under
a line that says how many of the table's jobs it holds. It is a progress report, copied into a snapshot by
``fedrepro.report.snapshot --parts``; the complete run's table replaces it.
"""

from __future__ import annotations

from pathlib import Path

from fedrepro.config import REPO, run_studies
from fedrepro.io import listed_in_indexes
from fedrepro.report.collect import collect_runs
from fedrepro.report.convergence import add_plateau_changes
from fedrepro.report.derived import add_derived
from fedrepro.report.published import load_published
from fedrepro.report.table_sources import table_spec
from fedrepro.report.tables import render_table
from fedrepro.study import run_spec, spec_digest, table_runs
from fedrepro.tuning import chosen_digest


def finished_seeds_folder(config: dict, results: Path, job: str) -> Path | None:
    """Where a train job (study/setting/method) of ``config`` leaves its finished seeds' done-markers in
    ``results``, as the train job names it (fedrepro.pipeline.train): the checkpoint folder of its spec's digest
    and, for a tuned run, within it the folder of the choices its stages wrote; None while a choice is missing."""
    study, setting, method = job.split("/")
    spec = run_spec(run_studies(config)[study], setting, method)
    folder = results / study / "checkpoints" / setting / method / spec_digest(spec)
    tuned = chosen_digest(spec, results)
    if tuned is None:
        return None
    return folder if tuned == "untuned" else folder / f"tuned-{tuned}"


def finished_jobs(config: dict, study: str, jobs: list[tuple[str, str]], results: Path) -> list[tuple[str, str]]:
    """The (setting, method) of ``jobs`` whose every seed of ``study`` has finished under the config's current
    spec: its done-marker where a run of that spec leaves it (finished_seeds_folder) and its train job's index."""
    done, seeds = [], run_studies(config)[study]["seeds"]
    for setting, method in jobs:
        folder = finished_seeds_folder(config, results, f"{study}/{setting}/{method}")
        index = results / study / "runs" / setting / method / "seeds.json"
        if folder is not None and index.is_file() and all((folder / f"seed{s}.done.json").is_file() for s in seeds):
            done.append((setting, method))
    return done


def progress_table(config: dict, study: str, table: str, results: Path,
                   out_stem: Path) -> tuple[list[tuple[str, str]], int]:
    """Render ``table`` of ``study`` (out_stem.md/.tex/.html/.csv) from its finished jobs (finished_jobs), and say
    so at its top; returns (the jobs it holds, how many jobs the table has). Nothing is written when none has
    finished, nor for a table whose cells are not its training runs' (a fine-tuning or simulation source)."""
    spec = table_spec(config["studies"][study], table)
    jobs = table_runs(spec)
    done = finished_jobs(config, study, jobs, results) if spec["source"] == "train" else []
    if not done:
        return [], len(jobs)
    indexes = [results / study / "runs" / setting / method / "seeds.json" for setting, method in done]
    runs, summary = collect_runs(listed_in_indexes(indexes, "dir"))
    frame = add_plateau_changes(add_derived(spec, summary, runs), runs)
    paper = config["studies"][study]["paper"]
    published = load_published(REPO / "config" / "paper" / f"{paper}.csv") if paper else None
    render_table(spec, frame, published, out_stem, config["scale"])
    md = out_stem.with_suffix(".md")
    title, _, rest = md.read_text().partition("\n")
    md.write_text(f"{title}\n\n**In progress: {len(done)} of the table's {len(jobs)} train jobs have finished** "
                  "(each with every seed); a cell without its runs shows a dash. The complete run's table replaces "
                  f"this one.\n{rest}")
    return done, len(jobs)
