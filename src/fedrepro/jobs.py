"""A part of a config's train jobs, as Snakemake targets: run a long study a few hours at a time.

    python -m fedrepro.jobs --configfile config/laptop-feddle-table5.yaml --study feddle-table5 \
        --methods fedbuff ca2fl [--settings fm-d01-n20] [--table table5] [--cost]

prints the train jobs' outputs (<results>/<study>/runs/<setting>/<method>/seeds.json) of that study whose method, or
the method a grid point varies, is one of ``--methods`` and whose setting is one of ``--settings`` (default: all of
either) and, with ``--table``, whose runs fill that table's cells, one per line, for ``snakemake <targets>``:
Snakemake then runs those jobs and what they need (partitions, the tuning choices they train with) and nothing else;
each resumes where it stopped. With ``--cost``, it prints instead their runs and estimated CPU core-hours
(fedrepro.cost, measured on this machine), and for the jobs already finished, those hours as measured. A name
that matches nothing stops it, naming the name and what there is.
"""

from __future__ import annotations

import argparse
import sys

from fedrepro.config import add_configfile_option, command_config, run_studies
from fedrepro.study import ConfigError, grid_runs, sweep_base, table_runs, unknown_name


def part_jobs(config: dict, study_name: str, methods: list[str] | None = None,
              settings: list[str] | None = None, table: str | None = None) -> list[tuple[str, str]]:
    """(setting, method) of ``study_name``'s train jobs (a study or a tuning stage's) in ``methods`` (their
    grid points included) and ``settings``, and behind ``table``'s cells; ConfigError naming any study, method,
    setting or table that is not there."""
    studies = run_studies(config)
    if problem := unknown_name(study_name, studies, "study"):
        raise ConfigError(f"--study: {problem}")
    study = studies[study_name]
    jobs = grid_runs(study)
    if table is not None:
        if problem := unknown_name(table, study["tables"], "table"):
            raise ConfigError(f"--table: {problem}")
        jobs = [job for job in jobs if job in set(table_runs(study["tables"][table]))]
    for option, names, known in (("--methods", methods, {sweep_base(study, m) for _, m in jobs}),
                                 ("--settings", settings, {s for s, _ in jobs})):
        for name in names or []:
            if problem := unknown_name(name, known, f"{option[2:-1]} of {study_name}'s jobs"):
                raise ConfigError(f"{option}: {problem}")
    return [(s, m) for s, m in jobs
            if (not methods or sweep_base(study, m) in methods) and (not settings or s in settings)]


def job_outputs(config: dict, study_name: str, jobs: list[tuple[str, str]]) -> list[str]:
    """The train jobs' outputs (rule train's), the targets that make Snakemake run exactly them."""
    return [f"{config['results_dir']}/{study_name}/runs/{s}/{m}/seeds.json" for s, m in jobs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_configfile_option(parser)
    parser.add_argument("--study", required=True, help="a study, or a tuning stage's runs (<study>--tune-<stage>)")
    parser.add_argument("--methods", nargs="+", help="study methods (a tuned method: all its grid points)")
    parser.add_argument("--settings", nargs="+")
    parser.add_argument("--table", help="only the runs behind this table's cells")
    parser.add_argument("--cost", action="store_true", help="print the part's runs and estimated core-hours")
    args = parser.parse_args(argv)
    try:
        config = command_config(args.configfile)
        jobs = part_jobs(config, args.study, args.methods, args.settings, args.table)
    except ConfigError as err:
        sys.exit(f"{', '.join(args.configfile)}: {err}")
    if not args.cost:
        print("\n".join(job_outputs(config, args.study, jobs)))
        return
    # imported here: fedrepro.cost loads torch, which listing the targets does not need
    from fedrepro.cost import GPU_TFLOPS, STEP_FLOOR_MS, FlopsCache, costed_spec, cpu_seconds_per_flop, job_cost

    study = run_studies(config)[args.study]
    cpu_spf, flops_of = cpu_seconds_per_flop(), FlopsCache()
    specs = [costed_spec(config, study, s, m) for s, m in jobs]
    costs = [job_cost(spec, len(study["seeds"]), flops_of, GPU_TFLOPS, STEP_FLOOR_MS, cpu_spf) for spec, _ in specs]
    hours = sum(c["cpu_s"] + c["server_cpu_s"] for c in costs) / 3600
    print(f"{args.study}: {len(jobs)} train jobs, {len(jobs) * len(study['seeds'])} runs, ~{hours:.1f} CPU "
          f"core-hours (clients and server; {1 / cpu_spf / 1e9:.1f} GFLOP/s a core measured here)")
    if unchosen := sum(not chosen for _, chosen in specs):
        print(f"{unchosen} of them train with tuning choices not made yet: costed with the values the study file "
              "gives")
    if measured := measured_seconds(config, args.study, jobs):
        estimated = sum(c["cpu_s"] + c["server_cpu_s"] for job, c in zip(jobs, costs, strict=True) if job in measured)
        spent = sum(measured.values())
        print(f"finished so far: {len(measured)} of the {len(jobs)} jobs, {spent / 3600:.2f} core-hours measured "
              f"(their jobs' wall time), estimated {estimated / 3600:.2f}")


def measured_seconds(config: dict, study_name: str, jobs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(setting, method) -> the wall seconds its train job took (io.job_seconds: set-up and evaluations included,
    every attempt summed; a job runs on one core, train_resources' threads), for the ``jobs`` that have finished
    every seed under the config's current spec (fedrepro.report.progress.finished_jobs)."""
    from pathlib import Path

    from fedrepro.io import job_seconds
    from fedrepro.report.progress import finished_jobs

    results = Path(config["results_dir"])
    done = finished_jobs(config, study_name, jobs, results)
    timed = {(s, m): job_seconds(results / study_name / "runs" / s / m / "seeds.json") for s, m in done}
    return {job: seconds for job, seconds in timed.items() if seconds is not None}


if __name__ == "__main__":
    main()
