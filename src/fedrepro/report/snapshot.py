"""Copy one complete run's results into the repository, so that they can be read without running anything.

    python -m fedrepro.report.snapshot --configfile config/laptop-full.yaml --out docs/results/laptop-full \
        --wall-time "3 h 40 min"

Copies the scorecard, every table (Markdown) and every figure (PNG) of the config's studies from its results
root, and writes a README.md that says where they came from: the commit, the machines the runs ran on (the
scorecard's line, from each study's summary.csv), the wall time measured by whoever ran it, and each study's
train-job seconds (the split of that time). A run missing any table or figure, or whose train jobs did not run
the config's current specs, is refused with the names of what is missing: a snapshot is of one whole run or of
nothing. runs.json records each train job's spec digest and seeds, provenance.json each study's commit, wall
time, job seconds and machines; tests/report/test_snapshot.py checks the committed snapshot against the config with
``snapshot_problems`` and ``stale_runs``, so it cannot fall behind the config silently.

    python -m fedrepro.report.snapshot --configfile config/laptop-full.yaml --out docs/results/laptop-full \
        --refresh feddisco --results /elsewhere/results/laptop-full --wall-time "2 h 10 min"

replaces one study's files (a change that moves only its numbers) from a complete run of that study alone
(``snakemake --configfile config/laptop-full.yaml --config 'studies_only=["feddisco"]'``): its tables, figures,
scorecard section, digests and provenance; every other study's files stay those of their own complete run.

    python -m fedrepro.report.snapshot --configfile config/laptop-full.yaml --out docs/results/laptop-full --prune

drops the studies the config no longer has (their tables, figures, scorecard sections, digests and provenance);
every study kept stays its own complete run, unchanged.

    python -m fedrepro.report.snapshot --configfile config/laptop-feddle-table5.yaml \
        --out docs/results/laptop-feddle-table5 --parts

copies what a study run in parts has finished, from runs of the config's current specs, before the study itself
has: every finished tuning stage (its table, scores and choice: one complete run of its own grid; a later call adds
the stages finished since) and each table rendered from the jobs of its cells finished so far (progress tables,
fedrepro.report.progress). A complete run's snapshot replaces it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from fedrepro.config import REPO, TUNING_SEPARATOR, add_configfile_option, command_config, run_studies
from fedrepro.io import job_seconds
from fedrepro.report.integrity import read_checked_csv
from fedrepro.report.progress import finished_seeds_folder, progress_table
from fedrepro.report.scorecard import machine_counts, machines_text
from fedrepro.study import grid_runs, run_spec, spec_digest
from fedrepro.tuning import chosen_digest

SCORECARD = Path("scorecard.md")
MANIFEST = "README.md"
RUNS = "runs.json"
PROVENANCE = "provenance.json"


_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")  # a Markdown link's target: ](path#anchor)


def relinked(text: str, src_dir: Path, dst_dir: Path, tree: Path) -> str:
    """``text`` of a Markdown file moved from ``src_dir`` to ``dst_dir``: each relative link to a file outside
    the copied ``tree`` (a row of docs/deviations.md, say, which a table links relative to where it was rendered)
    made relative to the copy's folder; links inside the tree, absolute ones and URLs are left as they are."""
    src_dir, dst_dir, tree = (Path(os.path.abspath(d)) for d in (src_dir, dst_dir, tree))

    def fix(m: re.Match) -> str:
        if "://" in m[2] or m[2].startswith(("/", "mailto:")):
            return m[0]
        target = Path(os.path.normpath(src_dir / m[2]))
        if target.is_relative_to(tree):
            return m[0]
        return f"{m[1]}{Path(os.path.relpath(target, dst_dir)).as_posix()}{m[3] or ''}{m[4]}"

    return _LINK.sub(fix, text)


def copy_into_snapshot(src: Path, dst: Path, tree: Path) -> Path:
    """Copy ``src`` (a file of the results ``tree``) to ``dst``, a Markdown file with its links out of the tree
    still pointing where they did (relinked)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".md":
        dst.write_text(relinked(src.read_text(encoding="utf-8"), src.parent, dst.parent, tree), encoding="utf-8")
    else:
        shutil.copyfile(src, dst)
    return dst


def snapshot_files(config: dict) -> list[Path]:
    """The files a snapshot of ``config``'s run holds, relative to its results root (and to the snapshot)."""
    files = [SCORECARD]
    for study, spec in config["studies"].items():
        files += [Path(study, "tables", f"{t}.md") for t in spec["tables"]]
        files += [Path(study, "figures", f"{f}.png") for f in spec["figures"]]
        for t in spec.get("tuned_by", []):  # every point's score, and the choice the runs trained with
            files += [Path(study, "tuning", f"{t['stage']}.md"), Path(study, "tuning", f"{t['stage']}.json")]
    return files


def snapshot_problems(config: dict, folder: Path) -> list[str]:
    """What a snapshot (or a results root) in ``folder`` lacks for ``config``: one line per missing file."""
    return [f"{folder / f}: missing" for f in snapshot_files(config) if not (folder / f).is_file()]


def run_digests(config: dict, choices: Path | None = None) -> dict[str, str]:
    """Each train job of ``config`` (study/setting/method) -> the digest of what it computes (its run spec, as
    its checkpoint folder is named) and its seeds: what moves a table's numbers when the config changes. With
    ``choices`` (a results root, or a snapshot of parts, holding the tuning stages' choices), a tuned job's digest
    also names the choices it trains with (tuning.chosen_digest; "missing" while one is not there), so that a
    changed earlier choice, say the clients' policy, moves every job trained with it."""
    studies = run_studies(config)  # the tuning stages' runs choose values
    digests = {}
    for study, spec in studies.items():
        for s, m in grid_runs(spec):
            run = run_spec(spec, s, m)
            digests[f"{study}/{s}/{m}"] = f"{spec_digest(run)} seeds {spec['seeds']}"
            if choices is not None and run.get("tuned"):
                digests[f"{study}/{s}/{m}"] += f" tuned {chosen_digest(run, choices) or 'missing'}"
    return digests


def stale_runs(config: dict, snapshot_runs: dict[str, str], choices: Path | None = None) -> list[str]:
    """The train jobs of ``config`` that the snapshot did not run as configured now (with ``choices``: with the
    choices held there), by name."""
    now = run_digests(config, choices)
    return [f"{job}: {'not in the snapshot' if job not in snapshot_runs else 'its spec changed since the snapshot'}"
            for job, digest in now.items() if snapshot_runs.get(job) != digest]


def unrun_specs(config: dict, results: Path) -> list[str]:
    """The train jobs whose results in ``results`` did not come from ``config``'s spec: no finished seed's
    done-marker where a run of that spec leaves it (finished_seeds_folder)."""
    missing = []
    for job in run_digests(config):
        folder = finished_seeds_folder(config, results, job)
        if folder is None:
            missing.append(f"{results / job}: a tuning stage it trains with has no choice yet")
        elif not any(folder.glob("seed*.done.json")):
            missing.append(f"{folder}: no finished seed of the config's run spec")
    return missing


def study_seconds(results: Path, study: str) -> tuple[int, float]:
    """(train jobs, their wall seconds summed) of a study, from each job's seeds.json ``job_seconds``."""
    timed = [t for t in map(job_seconds, (results / study / "runs").glob("*/*/seeds.json")) if t is not None]
    return len(timed), float(sum(timed))


def study_provenance(results: Path, study: str, commit: str, wall_time: str) -> dict:
    """Where one study's snapshot files came from: the commit and wall time of its run, its train jobs and their
    summed seconds (study_seconds), and the machines of its runs (summary.csv, read checked against its
    sha256 as the scorecard reads it)."""
    jobs, seconds = study_seconds(results, study)
    counts = machine_counts(read_checked_csv(results / study / "summary.csv"))
    return {"commit": commit, "wall_time": wall_time, "jobs": jobs, "seconds": round(seconds, 1),
            "machines": [[cpu, capability, n] for (cpu, capability), n in sorted(counts.items())]}


def git_commit(root: Path = REPO) -> str:
    """HEAD's hash, with " (with uncommitted changes)" where the work tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def manifest(config: dict, provenance: dict[str, dict], configfiles: list[str]) -> str:
    """The snapshot's README: where each study's files came from (provenance: study -> study_provenance), the
    split of the train-job hours, and a link to every table and figure."""
    runs: dict[tuple[str, str], list[str]] = {}
    for study in config["studies"]:
        runs.setdefault((provenance[study]["commit"], provenance[study]["wall_time"]), []).append(study)
    machines: dict[tuple[str, str], int] = {}
    for study in config["studies"]:
        for cpu, capability, n in provenance[study]["machines"]:
            machines[cpu, capability] = machines.get((cpu, capability), 0) + n
    if len(runs) == 1:
        (commit, wall_time), = runs
        origin = [f"- commit: `{commit}`", f"- wall time: {wall_time}"]
    else:  # a refreshed snapshot: each study's files are still one complete run of its train jobs
        origin = [line for (commit, wall_time), studies in runs.items()
                  for line in (f"- {', '.join(studies)}: commit `{commit}`", f"  - wall time: {wall_time}")]
    total = sum(provenance[study]["seconds"] for study in config["studies"])
    lines = [
        f"# {'One complete run' if len(runs) == 1 else 'Complete runs, one per study,'} of `{' '.join(configfiles)}`",
        "",
        "Copied by `python -m fedrepro.report.snapshot` from a run's results root, so the results can be read",
        "without running anything. Regenerate it whenever a change moves these numbers.",
        "",
        *origin,
        f"- {machines_text(machines) if machines else 'Machines: not recorded by these runs.'}",
        "",
        "| study | train jobs | their wall time, summed (core-hours at one thread a job) |",
        "|---|---:|---:|",
        *(f"| {study} | {provenance[study]['jobs']} | {provenance[study]['seconds'] / 3600:.2f} |"
          for study in config["studies"]),
        f"| all | | {total / 3600:.2f} |",
        "",
        "[The scorecard](scorecard.md): per table, the cells against the published ones, the paper's claims with",
        "their seed noise, and the runs that have not finished (its convergence section).",
        "",
    ]
    for study, spec in config["studies"].items():
        lines += [f"## {study}", ""]
        lines += [f"- [{spec['tables'][t].get('caption') or t}]({study}/tables/{t}.md)" for t in spec["tables"]]
        lines += [f"- ![{spec['figures'][f].get('caption') or f}]({study}/figures/{f}.png)" for f in spec["figures"]]
        lines.append("")
    return "\n".join(lines)


def _write_index(config: dict, out: Path, configfiles: list[str], provenance: dict[str, dict],
                 digests: dict[str, str]) -> list[Path]:
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    (out / RUNS).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    (out / MANIFEST).write_text(manifest(config, provenance, configfiles))
    return [out / MANIFEST, out / RUNS, out / PROVENANCE]


def snapshot(config: dict, results: Path, out: Path, configfiles: list[str], wall_time: str,
             commit: str | None = None) -> list[Path]:
    """Copy a complete run's scorecard, tables and figures from ``results`` into ``out``; refuse an incomplete one."""
    if problems := snapshot_problems(config, results) + unrun_specs(config, results):
        raise SystemExit("not a complete run, nothing copied:\n  " + "\n  ".join(problems))
    if out.exists():
        shutil.rmtree(out)  # a snapshot is one run's: nothing of an older one stays beside it
    written = []
    for f in snapshot_files(config):
        written.append(copy_into_snapshot(results / f, out / f, results))
    commit = commit or git_commit()
    provenance = {study: study_provenance(results, study, commit, wall_time) for study in config["studies"]}
    return written + _write_index(config, out, configfiles, provenance, run_digests(config, results))


def stage_files(name: str) -> list[Path]:
    """A tuning stage's files (by its runs' study name, <study>--tune-<stage>) in a snapshot, relative to it: every
    point's score (table and CSV) and the choice, last."""
    study, stage = name.split(TUNING_SEPARATOR)
    return [Path(study, "tuning", f"{stage}{suffix}") for suffix in (".md", ".csv", ".json")]


def stages_of(config: dict) -> list[str]:
    """Every tuning stage of ``config``'s studies, by its runs' study name <study>--tune-<stage>, in stage order."""
    return [f"{study}{TUNING_SEPARATOR}{t['stage']}" for study, spec in config["studies"].items()
            for t in spec.get("tuned_by", [])]


def stage_config(config: dict, name: str) -> dict:
    """``config`` narrowed to one tuning stage's runs (for run_digests and unrun_specs)."""
    return {"studies": {}, "tuning_studies": {name: config["tuning_studies"][name]}}


def finished_stages(config: dict, results: Path, held: frozenset[str] = frozenset()) -> list[str]:
    """The tuning stages of ``config`` whose choice is written in ``results`` from runs of the config's current
    specs, each with the choices of earlier stages that are finished too, there or in a snapshot that holds the
    same choice (``held``): a stage whose runs are of another spec, whose choice is missing, or that trained with
    the choice of a stage not finished (one whose own grid changed since), is not finished."""
    finished: list[str] = []
    for name in stages_of(config):
        study = config["tuning_studies"][name]
        earlier = {f"{t['study']}{TUNING_SEPARATOR}{t['stage']}" for s, m in grid_runs(study)
                   for t in run_spec(study, s, m).get("tuned", [])}
        if (all((results / f).is_file() for f in stage_files(name)) and earlier <= set(finished) | held
                and not unrun_specs(stage_config(config, name), results)):
            finished.append(name)
    return finished


def progress_files(study: str, table: str) -> list[Path]:
    """A progress table's files in a snapshot, relative to it (fedrepro.report.progress)."""
    return [Path(study, "progress", f"{table}{suffix}") for suffix in (".md", ".csv")]


def _same_file(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def parts_problems(config: dict, folder: Path) -> list[str]:
    """What makes a snapshot of parts in ``folder`` not a run of ``config`` as it is: a stage or progress table it
    records (provenance.json) whose files are missing, a stage the config no longer has, or a train job it holds
    that ran another spec or seeds than configured now, or trained with other choices than the stages it holds
    chose (an earlier stage run again with another outcome)."""
    recorded = json.loads((folder / PROVENANCE).read_text())
    problems = [f"{name}: no tuning stage of the config" for name in recorded["stages"]
                if name not in stages_of(config)]
    files = [f for name in recorded["stages"] for f in stage_files(name)]
    files += [f for name in recorded["progress"] for f in progress_files(*name.split("/"))]
    problems += [f"{folder / f}: missing" for f in files if not (folder / f).is_file()]
    now = run_digests(config, folder)  # a tuned job: with the choices the snapshot holds
    held = json.loads((folder / RUNS).read_text())
    changed = "its spec, or a choice it trains with, changed since the snapshot"
    problems += [f"{job}: {'no train job of the config' if job not in now else changed}"
                 for job, digest in held.items() if now.get(job) != digest]
    problems += [f"{job}: a job of stage {name.split(TUNING_SEPARATOR)[1]} missing from runs.json"
                 for name in recorded["stages"] if name in stages_of(config)
                 for job in run_digests(stage_config(config, name)) if job not in held]
    return problems


def parts_manifest(config: dict, provenance: dict, configfiles: list[str]) -> str:
    """The README of a snapshot of parts: each finished stage's commit, jobs and machines, the pending stages, and
    the progress tables with how many of their jobs they hold."""
    lines = [f"# `{' '.join(configfiles)}` run in parts: what has finished so far", "",
             "Copied by `python -m fedrepro.report.snapshot --parts` from a study run in parts, from runs of the",
             "config's current specs: each tuning stage below is one complete run of its grid (every point's score,",
             "the chosen point in bold); each progress table holds the train jobs of its cells finished so far. A",
             "complete run's snapshot replaces all of it.", "",
             "| stage | table | commit | train jobs | core-hours (one thread a job) | machines |",
             "|---|---|---|---:|---:|---|"]
    pending = []
    for name in stages_of(config):
        study, stage = name.split(TUNING_SEPARATOR)
        if name not in provenance["stages"]:
            pending.append(f"`{study}/{stage}`")
            continue
        p = provenance["stages"][name]
        machines = "; ".join(f"{cpu} ({capability}): {n} runs" for cpu, capability, n in p["machines"])
        lines.append(f"| {study}/{stage} | [{stage}.md]({study}/tuning/{stage}.md) | `{p['commit']}` | "
                     f"{p['jobs']} | {p['seconds'] / 3600:.2f} | {machines} |")
    lines += ["", f"Stages not yet finished: {', '.join(pending)}." if pending else "Every stage has finished.", ""]
    if provenance["progress"]:
        lines += ["| progress table | train jobs finished | commit |", "|---|---:|---|"]
        lines += [f"| [{name}]({name.split('/')[0]}/progress/{name.split('/')[1]}.md) | {p['jobs']} of {p['of']} | "
                  f"`{p['commit']}` |" for name, p in provenance["progress"].items()]
        lines.append("")
    return "\n".join(lines)


def snapshot_parts(config: dict, results: Path, out: Path, configfiles: list[str],
                   commit: str | None = None) -> list[Path]:
    """Copy what a study run in parts has finished in ``results`` into ``out``: every finished tuning stage
    (finished_stages), beside the stages an earlier call copied that are still whole and of the config's specs
    (from runs since gone, say), and each table of a study with tuning rendered from its finished jobs
    (fedrepro.report.progress). Refused where nothing has finished, or where ``out`` holds a complete run's
    snapshot (a scorecard), which has all of it."""
    if (out / SCORECARD).exists():
        raise SystemExit(f"{out} holds a complete run's snapshot, every stage and table included: nothing copied")
    provenance = json.loads((out / PROVENANCE).read_text()) if (out / PROVENANCE).is_file() else {"stages": {}}
    held = json.loads((out / RUNS).read_text()) if (out / RUNS).is_file() else {}
    # a stage whose runs trained with a choice the snapshot holds, of the same specs, finished with it
    same_choice = frozenset(name for name in provenance["stages"] if name in stages_of(config)
                            and all((out / f).is_file() for f in stage_files(name))
                            and _same_file(out / stage_files(name)[-1], results / stage_files(name)[-1])
                            and not stale_runs(stage_config(config, name), held, out))
    done = finished_stages(config, results, same_choice)
    if not done:
        raise SystemExit(f"no tuning stage of {' '.join(configfiles)} has finished in {results}: nothing copied")
    # a finished stage the snapshot holds already, of the same specs, choices and outcome, is the same run: it keeps
    # the commit it came from
    same = [name for name in done if name in provenance["stages"]
            and not stale_runs(stage_config(config, name), held, results)
            and _same_file(out / stage_files(name)[-1], results / stage_files(name)[-1])]
    written = []
    for name in done:  # first: the stages kept from earlier calls must have trained with these choices
        for f in stage_files(name):
            written.append(copy_into_snapshot(results / f, out / f, results))
    kept = [name for name in stages_of(config) if name not in done and name in provenance["stages"]
            and all((out / f).is_file() for f in stage_files(name))
            and not stale_runs(stage_config(config, name), held, out)]
    keep = {MANIFEST, RUNS, PROVENANCE} | {f.as_posix() for name in kept + done for f in stage_files(name)}
    for old in [f for f in out.rglob("*") if f.is_file()]:
        if old.relative_to(out).as_posix() not in keep:  # a stage of older specs or choices, an older progress table
            old.unlink()
    commit = commit or git_commit()
    stages = {name: provenance["stages"][name] for name in kept + same}
    digests = {job: d for name in kept for job, d in run_digests(stage_config(config, name), out).items()}
    for name in done:
        stages.setdefault(name, study_provenance(results, name, commit, ""))
        digests |= run_digests(stage_config(config, name), results)
    progress = {}
    now = run_digests(config, results)
    for study in (s for s, spec in config["studies"].items() if spec.get("tuned_by")):
        for table in config["studies"][study]["tables"]:
            with tempfile.TemporaryDirectory() as tmp:
                jobs, total = progress_table(config, study, table, results, Path(tmp) / table)
                for f in progress_files(study, table) if jobs else []:
                    written.append(copy_into_snapshot(Path(tmp) / f.name, out / f, Path(tmp)))
            if jobs:
                progress[f"{study}/{table}"] = {"jobs": len(jobs), "of": total, "commit": commit}
                digests |= {f"{study}/{s}/{m}": now[f"{study}/{s}/{m}"] for s, m in jobs}
    provenance = {"stages": stages, "progress": progress}
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    (out / RUNS).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    (out / MANIFEST).write_text(parts_manifest(config, provenance, configfiles))
    return written + [out / MANIFEST, out / RUNS, out / PROVENANCE]


def scorecard_sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A scorecard's lines before its first study, and each study's section (from its "## study" heading)."""
    preamble: list[str] = []
    sections: dict[str, list[str]] = {}
    current = preamble
    for line in text.split("\n"):
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        current.append(line)
    return preamble, sections


def joined_scorecard(preamble: list[str], sections: dict[str, list[str]]) -> str:
    """A scorecard from its preamble and study sections, the all-studies count of published cells shown summed
    again from the sections' own counts. The rest of the preamble depends on the config alone (which tables
    compare levels), not on any run's numbers."""
    shown = [re.search(r"^Published cells shown: (\d+) / (\d+)\.$", "\n".join(lines), re.M)
             for lines in sections.values()]
    if all(shown):
        total = (sum(int(m[1]) for m in shown), sum(int(m[2]) for m in shown))
        preamble = [re.sub(r"^(Published cells shown, all studies[^:]*): \d+ / \d+\.$",
                           lambda m: f"{m[1]}: {total[0]} / {total[1]}.", line) for line in preamble]
    return "\n".join(preamble + [line for lines in sections.values() for line in lines])


def splice_scorecard(old: str, new: str, studies: list[str]) -> str:
    """``old`` scorecard with the sections of ``studies`` taken from ``new`` (a scorecard of those studies alone)."""
    preamble, sections = scorecard_sections(old)
    _, fresh = scorecard_sections(new)
    for study in studies:
        if study not in fresh:
            raise SystemExit(f"the run's scorecard has no section for {study!r}: nothing copied")
        sections[study] = fresh[study]
    return joined_scorecard(preamble, sections)


def refresh(config: dict, results: Path, out: Path, studies: list[str], configfiles: list[str], wall_time: str,
            commit: str | None = None) -> list[Path]:
    """Replace the files of ``studies`` in the complete snapshot ``out`` with those of a complete run of these
    studies alone (``studies_only``) in ``results``: their tables and figures, their scorecard sections, their
    train jobs' digests and where they came from. The other studies' files stay as they are, each still one
    complete run of its own; refused, with nothing written, unless both are whole."""
    for study in studies:
        if study not in config["studies"]:
            raise SystemExit(f"--refresh: unknown study {study!r}; known: {sorted(config['studies'])}")
    only = {**config, "studies": {s: config["studies"][s] for s in studies}}
    problems = snapshot_problems(config, out) + [f"{out / f}: missing" for f in (RUNS, PROVENANCE)
                                                 if not (out / f).is_file()]
    problems += snapshot_problems(only, results) + unrun_specs(only, results)
    if problems:
        raise SystemExit("not a complete snapshot and run, nothing copied:\n  " + "\n  ".join(problems))
    scorecard = splice_scorecard((out / SCORECARD).read_text(), (results / SCORECARD).read_text(), studies)
    commit = commit or git_commit()
    provenance = json.loads((out / PROVENANCE).read_text())
    digests = json.loads((out / RUNS).read_text())
    written = []
    for study in studies:
        shutil.rmtree(out / study)  # nothing of the study's older run stays beside the new one
        digests = {job: d for job, d in digests.items() if not job.startswith(f"{study}/")}
        provenance[study] = study_provenance(results, study, commit, wall_time)
    digests |= run_digests(only, results)
    for f in snapshot_files(only):
        if f != SCORECARD:  # spliced above
            written.append(copy_into_snapshot(results / f, out / f, results))
    (out / SCORECARD).write_text(scorecard)
    return written + [out / SCORECARD] + _write_index(config, out, configfiles, provenance, digests)


def prune(config: dict, out: Path, configfiles: list[str]) -> list[Path]:
    """Drop from the complete snapshot ``out`` the studies that ``config`` no longer has: their folders, scorecard
    sections, train jobs' digests and provenance. Every study kept stays the complete run it was; refused, with
    nothing changed, unless what is kept is whole and of the config as it is."""
    provenance = json.loads((out / PROVENANCE).read_text())
    digests = json.loads((out / RUNS).read_text())
    gone = sorted(set(provenance) - set(config["studies"]))
    if not gone:
        raise SystemExit(f"--prune: {out} holds no study the config lacks; nothing to drop")
    problems = snapshot_problems(config, out) + stale_runs(config, digests, out)
    problems += [f"{out}: no provenance for {s!r}" for s in config["studies"] if s not in provenance]
    if problems:
        raise SystemExit("not a complete snapshot of what is kept, nothing dropped:\n  " + "\n  ".join(problems))
    preamble, sections = scorecard_sections((out / SCORECARD).read_text())
    for study in gone:
        shutil.rmtree(out / study, ignore_errors=True)
        sections.pop(study, None)
        del provenance[study]
    digests = {job: d for job, d in digests.items() if job.split("/", 1)[0] in config["studies"]}
    (out / SCORECARD).write_text(joined_scorecard(preamble, sections))
    return [out / SCORECARD] + _write_index(config, out, configfiles, provenance, digests)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_configfile_option(parser)
    parser.add_argument("--out", required=True, type=Path, help="the snapshot's folder (replaced)")
    parser.add_argument("--wall-time", help='the run\'s measured wall time, e.g. "3 h 40 min" (not with --parts: '
                                            "a stage's train-job hours are recorded instead)")
    parser.add_argument("--results", type=Path, help="the run's results root (default: the config's results_dir)")
    parser.add_argument("--commit", help="the commit the run came from (default: this checkout's HEAD)")
    parser.add_argument("--refresh", nargs="+", metavar="STUDY",
                        help="replace only these studies' files in the existing snapshot --out, from a complete run "
                             "of them alone (--config studies_only=[...]); the others stay as they are")
    parser.add_argument("--prune", action="store_true",
                        help="drop from the snapshot --out the studies the config no longer has")
    parser.add_argument("--parts", action="store_true",
                        help="copy what a study run in parts has finished so far (its tuning stages, its tables from "
                             "the jobs finished) into --out")
    args = parser.parse_args(argv)
    if not (args.parts or args.prune) and not (args.wall_time or "").strip():
        parser.error("--wall-time is empty: give the run's measured wall time (WALL_TIME=... with make)")
    config = command_config(args.configfile)
    results = args.results or Path(config["results_dir"])
    results = results if results.is_absolute() else REPO / results
    if args.prune:
        written = prune(config, args.out, args.configfile)
    elif args.parts:
        written = snapshot_parts(config, results, args.out, args.configfile, args.commit)
    elif args.refresh:
        written = refresh(config, results, args.out, args.refresh, args.configfile, args.wall_time, args.commit)
    else:
        written = snapshot(config, results, args.out, args.configfile, args.wall_time, args.commit)
    print(f"{len(written)} files written under {args.out}")


if __name__ == "__main__":
    main()
