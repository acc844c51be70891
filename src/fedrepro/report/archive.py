"""Keep a study's finished runs in the repository, and put them back into a results root on another machine.

A study run in parts over many sessions (Feddle's Table 5 at the paper's tuning protocol: ~93 core-hours,
docs/measurements/laptop-feddle-table5.md) outlives the machine that runs it: a results root that is not kept
loses every finished run with it, and a snapshot of its tables holds none of the runs behind them.

    python -m fedrepro.report.archive save --configfile config/laptop-feddle-table5.yaml
    python -m fedrepro.report.archive restore --configfile config/laptop-feddle-table5.yaml

``save`` copies every finished seed of the config's train jobs (its run folder: metrics.csv, summary.json and
what its engine adds; its done-marker; its kept model where fine-tuning reads one) from the results root into
docs/results/runs/<config>/, at the same paths, with the choices of the finished tuning stages (which name the
folders of a tuned job's markers), beside the seeds an earlier save kept that are still of the config's specs;
seeds of older specs or choices go. ``restore`` copies the archived seeds back into a results root; the train
jobs that then run (``snakemake`` as usual) find each seed finished as its marker says and train nothing
(fedrepro.train.run_seeds checks the marker's fingerprint against the config, data and partition, and the
sha256 of every run file), and the aggregation, tuning choices and tables that follow are rebuilt from them.
``restore`` never overwrites a finished seed of the results root (one that differs from the archive's is kept
and named); ``save`` replaces an archived seed with the results root's where they differ (a rerun of the same
spec on another CPU: what the tables there were rendered from; the archived one stays in git's history). A seed
whose files do not match its marker is refused by name, the others copied.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from fedrepro.config import REPO, add_configfile_option, command_config, run_studies
from fedrepro.data.weights import sha256sum
from fedrepro.report.progress import finished_seeds_folder
from fedrepro.study import grid_runs

ARCHIVES = REPO / "docs" / "results" / "runs"
INDEX = "archive.json"


def archive_of(configfiles: list[str]) -> Path:
    """The folder that archives the runs of the config read from ``configfiles``, named by the last of them."""
    return ARCHIVES / Path(configfiles[-1]).stem


@dataclass(frozen=True)
class FinishedSeed:
    """One finished seed's files, relative to a results root (or an archive of one)."""

    job: str  # study/setting/method
    seed: int
    marker: Path  # <study>/checkpoints/<setting>/<method>/<spec digest>[/tuned-<choices digest>]/seed<N>.done.json
    run: Path  # <study>/runs/<setting>/<method>/seed<N>

    @property
    def model(self) -> Path:
        return self.marker.with_name(f"seed{self.seed}.model.pt")

    def files(self, root: Path) -> list[Path]:
        """The seed's files under ``root``, the marker last (what a copy writes last: a seed without it is not
        finished); its run files as its marker lists them."""
        marker = json.loads((root / self.marker).read_text())
        listed = [self.run / name for name in sorted(marker["files"])]
        return [*listed, *([self.model] if (root / self.model).is_file() else []), self.marker]

    def problem(self, root: Path) -> str | None:
        """Why the seed under ``root`` is not a finished run its marker describes (a missing or changed run file,
        a summary of another fingerprint, a marker that is not JSON), or None."""
        try:
            marker = json.loads((root / self.marker).read_text())
            for name, sha in marker["files"].items():
                if not (root / self.run / name).is_file():
                    return f"{root / self.run / name}: missing, though {root / self.marker} lists it"
                if sha256sum(root / self.run / name) != sha:
                    return f"{root / self.run / name}: its sha256 is not the one {root / self.marker} records"
            summary = json.loads((root / self.run / "summary.json").read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{root / self.marker}: not a finished seed's marker ({type(exc).__name__}: {exc})"
        if summary.get("fingerprint") != marker.get("fingerprint"):
            return f"{root / self.run / 'summary.json'}: a run of another fingerprint than {root / self.marker}"
        return None


def finished_seeds(config: dict, root: Path) -> list[FinishedSeed]:
    """Every seed of ``config``'s train jobs that has a done-marker under ``root`` where a run of the config's
    current spec leaves it (fedrepro.report.progress.finished_seeds_folder: a tuned job's, under the choices its
    stages wrote in ``root``), in job and seed order; whether its files match is ``FinishedSeed.problem``'s."""
    seeds = []
    for study, spec in run_studies(config).items():
        for setting, method in grid_runs(spec):
            job = f"{study}/{setting}/{method}"
            folder = finished_seeds_folder(config, root, job)
            if folder is None:  # a stage it trains with has not chosen under root
                continue
            for seed in spec["seeds"]:
                marker = folder / f"seed{seed}.done.json"
                if marker.is_file():
                    seeds.append(FinishedSeed(job, seed, marker.relative_to(root),
                                           Path(study, "runs", setting, method, f"seed{seed}")))
    return seeds


def stage_choices(config: dict, root: Path) -> list[Path]:
    """The tuning stages' choice files under ``root``, relative to it: what locates a tuned job's markers."""
    names = [(study, t["stage"]) for study, spec in config["studies"].items() for t in spec.get("tuned_by", [])]
    return [Path(study, "tuning", f"{stage}.json") for study, stage in names
            if (root / study / "tuning" / f"{stage}.json").is_file()]


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.part")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)


def _same(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)


@dataclass
class Outcome:
    """What a save or restore did, seed by seed (study/setting/method seed N)."""

    copied: list[str]
    unchanged: list[str]
    differing: list[str]  # the destination held a finished seed that differs: kept, or replaced (``overwrite``)
    refused: list[str]  # damaged: its files do not match its marker

    def lines(self, verb: str, overwrite: bool) -> list[str]:
        out = [f"{len(self.copied)} seeds {verb}, {len(self.unchanged)} already there"]
        out += [f"{'replaced' if overwrite else 'kept'}, it differs from the one copied: {seed}"
                for seed in self.differing]
        out += [f"refused: {problem}" for problem in self.refused]
        return out


def _seed_name(seed: FinishedSeed) -> str:
    return f"{seed.job} seed {seed.seed}"


def copy_seeds(seeds: list[FinishedSeed], src: Path, dst: Path, overwrite: bool = False) -> Outcome:
    """Copy each finished seed in ``src`` to the same paths in ``dst``, the marker last; a seed whose files do not
    match its marker is refused (by name); one whose files ``dst`` holds already is left as it is where they are
    the same, and where they differ is kept (replaced with ``overwrite``)."""
    outcome = Outcome([], [], [], [])
    for seed in seeds:
        if problem := seed.problem(src):
            outcome.refused.append(problem)
            continue
        files = seed.files(src)
        there = (dst / seed.marker).is_file() or any((dst / f).is_file() for f in files if f.parent == seed.run)
        if there:
            if all(_same(src / f, dst / f) for f in files):
                outcome.unchanged.append(_seed_name(seed))
                continue
            outcome.differing.append(_seed_name(seed))
            if not overwrite:
                continue
            (dst / seed.marker).unlink(missing_ok=True)  # first: a copy cut short leaves the seed unfinished
        for f in files:
            _copy(src / f, dst / f)
        if not there:
            outcome.copied.append(_seed_name(seed))
    return outcome


def save(config: dict, results: Path, archive: Path) -> Outcome:
    """Add the finished seeds of ``results`` to ``archive`` (with the stages' choices that locate the tuned ones)
    and drop what it holds of older specs or choices; refused seeds of ``results`` are left out, by name."""
    archive.mkdir(parents=True, exist_ok=True)
    for choice in stage_choices(config, results):  # a stage chosen again: its tuned jobs' seeds move folder
        if not _same(results / choice, archive / choice):
            _copy(results / choice, archive / choice)
    outcome = copy_seeds(finished_seeds(config, results), results, archive, overwrite=True)
    held = [seed for seed in finished_seeds(config, archive) if seed.problem(archive) is None]
    keep = {f for seed in held for f in seed.files(archive)} | set(stage_choices(config, archive))
    for old in sorted(p for p in archive.rglob("*") if p.is_file() and p.name != INDEX):
        if old.relative_to(archive) not in keep:
            old.unlink()
    for folder in sorted((p for p in archive.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    index = {}
    for seed in held:
        index.setdefault(seed.job, []).append(seed.seed)
    (archive / INDEX).write_text(json.dumps({"seeds": index, "count": len(held)}, indent=1, sort_keys=True) + "\n")
    return outcome


def restore(config: dict, archive: Path, results: Path) -> Outcome:
    """Copy ``archive``'s finished seeds of ``config``'s current specs into ``results`` (never over a finished
    seed of its own); the choices are not copied: the stages choose again from the restored runs."""
    return copy_seeds(finished_seeds(config, archive), archive, results)


def archive_problems(config: dict, archive: Path) -> list[str]:
    """What makes a committed archive not of ``config`` as it is: a seed whose files do not match its marker, a
    file no finished seed of the config's current specs holds (a seed of an older spec or choice), or an index
    that does not list exactly the seeds held."""
    seeds = finished_seeds(config, archive)
    damaged = {seed: problem for seed in seeds if (problem := seed.problem(archive))}
    problems = list(damaged.values())
    held = {f for seed in seeds if seed not in damaged for f in seed.files(archive)}
    held |= set(stage_choices(config, archive)) | {Path(INDEX)}
    problems += [f"{p}: no finished seed of the config's current specs holds it"
                 for p in sorted(archive.rglob("*")) if p.is_file() and p.relative_to(archive) not in held]
    index = json.loads((archive / INDEX).read_text()).get("seeds", {}) if (archive / INDEX).is_file() else {}
    listed = {(job, s) for job, ss in index.items() for s in ss}
    have = {(seed.job, seed.seed) for seed in seeds}
    problems += [f"{archive / INDEX}: lists {job} seed {s}, which the archive does not hold"
                 for job, s in sorted(listed - have)]
    problems += [f"{archive / INDEX}: does not list {job} seed {s}" for job, s in sorted(have - listed)]
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    add_configfile_option(parser)
    parser.add_argument("--results", type=Path, help="the results root (default: the config's results_dir)")
    parser.add_argument("--archive", type=Path,
                        help="the archive's folder (default: docs/results/runs/<the last config file's name>)")
    args = parser.parse_args(argv)
    config = command_config(args.configfile)
    results = args.results or Path(config["results_dir"])
    results = results if results.is_absolute() else REPO / results
    archive = args.archive or archive_of(args.configfile)
    if args.action == "save":
        outcome = save(config, results, archive)
        print("\n".join(outcome.lines(f"archived from {results} into {archive}", overwrite=True)))
        print(f"{archive}: {json.loads((archive / INDEX).read_text())['count']} finished seeds held")
    else:
        outcome = restore(config, archive, results)
        print("\n".join(outcome.lines(f"restored from {archive} into {results}", overwrite=False)))
    if outcome.refused:
        raise SystemExit(f"{len(outcome.refused)} damaged seeds refused (named above); the others were copied")


if __name__ == "__main__":
    main()
