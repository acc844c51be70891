"""Copy one complete run's results into the repository, so that they can be read without running anything.

    python -m fedrepro.report.snapshot --configfile config/laptop-full.yaml --out docs/results/laptop-full \
        --wall-time "3 h 40 min"

Copies the scorecard, every table (Markdown) and every figure (PNG) of the config's studies from its results
root, and writes a README.md that says where they came from: the commit, the machines the runs ran on (the
scorecard's line, from each study's summary.csv), the wall time measured by whoever ran it, and each study's
train-job seconds (the split of that time). A run missing any table or figure, or whose train jobs did not run
the config's current specs, is refused with the names of what is missing: a snapshot is of one whole run or of
nothing. runs.json records each train job's spec digest and seeds; tests/test_snapshot.py checks the committed
snapshot against the config with ``snapshot_problems`` and ``stale_runs``, so it cannot fall behind the config
silently.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from fedrepro.config import REPO, grid_runs, merge_configfiles, resolve_config, run_spec, spec_digest
from fedrepro.report.integrity import read_checked_csv
from fedrepro.report.scorecard import machines_line

MANIFEST = "README.md"
RUNS = "runs.json"


def snapshot_files(config: dict) -> list[Path]:
    """The files a snapshot of ``config``'s run holds, relative to its results root (and to the snapshot)."""
    files = [Path("scorecard.md")]
    for study, spec in config["studies"].items():
        files += [Path(study, "tables", f"{t}.md") for t in spec["tables"]]
        files += [Path(study, "figures", f"{f}.png") for f in spec["figures"]]
    return files


def snapshot_problems(config: dict, folder: Path) -> list[str]:
    """What a snapshot (or a results root) in ``folder`` lacks for ``config``: one line per missing file."""
    return [f"{folder / f}: missing" for f in snapshot_files(config) if not (folder / f).is_file()]


def run_digests(config: dict) -> dict[str, str]:
    """Each train job of ``config`` (study/setting/method) -> the digest of what it computes (its run spec, as
    its checkpoint folder is named) and its seeds: what moves a table's numbers when the config changes."""
    return {f"{study}/{s}/{m}": f"{spec_digest(run_spec(spec, s, m))} seeds {spec['seeds']}"
            for study, spec in config["studies"].items() for s, m in grid_runs(spec)}


def stale_runs(config: dict, snapshot_runs: dict[str, str]) -> list[str]:
    """The train jobs of ``config`` that the snapshot did not run as configured now, by name."""
    now = run_digests(config)
    return [f"{job}: {'not in the snapshot' if job not in snapshot_runs else 'its spec changed since the snapshot'}"
            for job, digest in now.items() if snapshot_runs.get(job) != digest]


def unrun_specs(config: dict, results: Path) -> list[str]:
    """The train jobs whose results in ``results`` did not come from ``config``'s spec (no checkpoint folder of
    its digest, where each finished seed leaves its done-marker)."""
    missing = []
    for job, digest in run_digests(config).items():
        study, setting, method = job.split("/")
        folder = results / study / "checkpoints" / setting / method / digest.split()[0]
        if not any(folder.glob("seed*.done.json")):
            missing.append(f"{folder}: no finished seed of the config's run spec")
    return missing


def study_seconds(results: Path, study: str) -> tuple[int, float]:
    """(train jobs, their wall seconds summed) of a study, from each job's seeds.json ``job_seconds``."""
    jobs, seconds = 0, 0.0
    for index in (results / study / "runs").glob("*/*/seeds.json"):
        job = json.loads(index.read_text())
        if "job_seconds" in job:
            jobs += 1
            seconds += job["job_seconds"]
    return jobs, seconds


def machines(config: dict, results: Path) -> str | None:
    """The scorecard's machines line (CPU, torch CPU capability, runs) over every study's summary.csv, read
    checked against its sha256 as the scorecard reads it."""
    frames = [read_checked_csv(results / study / "summary.csv") for study in config["studies"]]
    return machines_line(pd.concat(frames, ignore_index=True))


def git_commit(root: Path = REPO) -> str:
    """HEAD's hash, with " (with uncommitted changes)" where the work tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def manifest(config: dict, results: Path, configfiles: list[str], wall_time: str, commit: str) -> str:
    rows = []
    total = 0.0
    for study in config["studies"]:
        jobs, seconds = study_seconds(results, study)
        total += seconds
        rows.append(f"| {study} | {jobs} | {seconds / 3600:.2f} |")
    lines = [
        f"# One complete run of `{' '.join(configfiles)}`",
        "",
        "Copied by `python -m fedrepro.report.snapshot` from a run's results root, so the results can be read",
        "without running anything. Regenerate it whenever a change moves these numbers.",
        "",
        f"- commit: `{commit}`",
        f"- wall time: {wall_time}",
        f"- {machines(config, results) or 'Machines: not recorded by these runs.'}",
        "",
        "| study | train jobs | their wall time, summed (core-hours at one thread a job) |",
        "|---|---:|---:|",
        *rows,
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


def snapshot(config: dict, results: Path, out: Path, configfiles: list[str], wall_time: str,
             commit: str | None = None) -> list[Path]:
    """Copy a complete run's scorecard, tables and figures from ``results`` into ``out``; refuse an incomplete one."""
    if problems := snapshot_problems(config, results) + unrun_specs(config, results):
        raise SystemExit("not a complete run, nothing copied:\n  " + "\n  ".join(problems))
    if out.exists():
        shutil.rmtree(out)  # a snapshot is one run's: nothing of an older one stays beside it
    written = []
    for f in snapshot_files(config):
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results / f, out / f)
        written.append(out / f)
    (out / MANIFEST).write_text(manifest(config, results, configfiles, wall_time, commit or git_commit()))
    (out / RUNS).write_text(json.dumps(run_digests(config), indent=1, sort_keys=True) + "\n")
    return written + [out / MANIFEST, out / RUNS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="+", required=True,
                        help="config files as given to snakemake (config/config.yaml is read first)")
    parser.add_argument("--out", required=True, type=Path, help="the snapshot's folder (replaced)")
    parser.add_argument("--wall-time", required=True, help='the run\'s measured wall time, e.g. "3 h 40 min"')
    parser.add_argument("--results", type=Path, help="the run's results root (default: the config's results_dir)")
    parser.add_argument("--commit", help="the commit the run came from (default: this checkout's HEAD)")
    args = parser.parse_args(argv)
    if not args.wall_time.strip():
        parser.error("--wall-time is empty: give the run's measured wall time (WALL_TIME=... with make)")
    files = [str(REPO / "config" / "config.yaml"), *args.configfile]
    config = resolve_config(merge_configfiles(*files), source=", ".join(args.configfile))
    results = args.results or Path(config["results_dir"])
    results = results if results.is_absolute() else REPO / results
    written = snapshot(config, results, args.out, args.configfile, args.wall_time, args.commit)
    print(f"{len(written)} files written under {args.out}")


if __name__ == "__main__":
    main()
