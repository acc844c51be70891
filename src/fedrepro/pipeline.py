"""What each Snakemake rule does, as plain functions of paths and settings.

workflow/scripts/*.py only unpack the ``snakemake`` object and call these; tests call them directly.
Modules that need torch are imported inside the functions, so light rules stay light.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def rule_log(path: str | Path | None) -> Iterator[Callable[[str], None]]:
    """A line logger to the rule's log file (and stdout); a failure's traceback lands in the log too."""
    handle = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (closed below)

    def log(msg: str) -> None:
        print(msg, flush=True)
        if handle:
            handle.write(msg + "\n")

    try:
        yield log
    except BaseException:
        if handle:
            handle.write(traceback.format_exc())
        raise
    finally:
        if handle:
            handle.close()


def download(dataset: str, raw_dir: Path, mirror: str | None, log: Callable[[str], None],
             local_dirs: list[str] | None = None, checksums: dict[str, str] | None = None) -> None:
    """The download_dataset rule's step: fetch (or check the hand-placed) raw files of ``dataset``, each
    against its pinned checksum or the one ``checksums`` (config key checksums) gives by file name."""
    from fedrepro.data.download import md5sum
    from fedrepro.data.registry import download_dataset
    from fedrepro.io import atomic_write_json

    if local_dirs:
        log(f"{dataset}: looking in {', '.join(local_dirs)} before the network")
    for fname, checksum in (checksums or {}).items():
        log(f"{dataset}: {fname} is checked against the config's checksum {checksum}, not the pinned one")
    paths = download_dataset(dataset, Path(raw_dir), mirror=mirror, checksums=checksums or None,
                             local_dirs=local_dirs or ())
    for p in paths:
        log(f"{dataset}: {p} ({p.stat().st_size} bytes, checksum verified)")
    # the rule's declared output, written last: what was fetched, with the md5 of each file (every file was
    # checked against a pinned md5 or sha256 above; the md5 makes two machines' downloads comparable)
    atomic_write_json(Path(raw_dir) / "MANIFEST.json",
                      {"dataset": dataset, "files": {p.name: {"md5": md5sum(p), "bytes": p.stat().st_size}
                                                     for p in paths}})


def prepare(dataset: str, out: Path, raw_dir: Path | None, log: Callable[[str], None]) -> None:
    from fedrepro.data.registry import prepare_dataset

    meta = prepare_dataset(dataset, Path(out), Path(raw_dir) if raw_dir else None)
    log(f"{dataset}: {meta['shape']} x {meta['num_classes']} classes -> {out} (sha256 {meta['sha256'][:12]})")


def partition(data: Path, spec: dict, seeds: list[int], outs: list[Path], log: Callable[[str], None]) -> None:
    """One partition file (+ stats JSON) per seed of one setting."""
    import numpy as np

    from fedrepro.io import open_npz
    from fedrepro.partition import make_partition, partition_stats, save_partition

    def column(f: Any, train_key: str, test_key: str) -> Any:
        if train_key not in f.files:
            return None
        if not spec.get("pool_test"):
            return f[train_key]
        if test_key not in f.files:
            raise ValueError(f"{data}: has {train_key} but no {test_key}, which pool_test needs")
        # PFLlib/HtFLlib's generators: train and test together, clients re-split
        return np.concatenate([f[train_key], f[test_key]])

    with open_npz(data, "prepared data set") as f:
        meta = json.loads(str(f["meta"]))
        labels = column(f, "y_train", "y_test")
        # CIFAR-100 under its 20 superclasses is split over the 100 fine labels (Feddle); the stats below
        # still count the training labels, the ones the clients learn
        drawn_over = column(f, "partition_labels_train", "partition_labels_test")
        groups = column(f, "groups_train", "groups_test")  # writer / person ids (kind writer)
    for seed, out in zip(seeds, outs, strict=True):
        parts = make_partition(labels if drawn_over is None else drawn_over, spec, seed, meta, groups=groups)
        stats = partition_stats(parts, labels, meta["num_classes"])
        stats["partitioned_by"] = "y_train" if drawn_over is None else "partition_labels_train"
        save_partition(out, parts, stats, spec)
        log(f"seed {seed}: {len(parts)} clients, sizes {min(stats['sizes'])}..{max(stats['sizes'])} -> {out}")


def tuned_run(spec: dict, checkpoint_dir: Path, tuned: dict[tuple[str, str], Path] | None,
              log: Callable[[str], None]) -> tuple[dict, Path]:
    """A train job's run spec with the choices of its tuned stages applied (``tuned``: (study, stage) -> choice
    file; fedrepro.tuning), and the folder of its checkpoints and finished seeds: ``checkpoint_dir``, or within it
    the folder of those choices, where a fine-tuning job finds the run's kept model too."""
    from fedrepro.tuning import apply_choices, tuned_digest

    spec = apply_choices(spec, tuned or {})
    if digest := tuned_digest(spec):
        chosen = "; ".join(f"{t['stage']}: {t['values']}" for t in spec["tuned"])
        log(f"tuned: {chosen}")
        return spec, checkpoint_dir / f"tuned-{digest}"
    return spec, checkpoint_dir


def train(spec: dict, data: Path, partitions: list[Path], seeds: list[int], index: Path,
          checkpoint_dir: Path, device: str, threads: int, log: Callable[[str], None],
          engine: dict | None = None, started: float | None = None, keep_checkpoints: bool = False,
          keep_model: bool = False, tuned: dict[tuple[str, str], Path] | None = None) -> None:
    """Every seed of one method x setting; ``index`` (seeds.json) is written last and lists the folders and,
    given ``started`` (time.perf_counter() at the job's start), the job's wall seconds: this process's, plus the
    training seconds earlier attempts spent on its seeds (after a preemption or a stop). A finished seed keeps
    its run folder and a marker, its last checkpoint only with ``keep_checkpoints``, its final model with
    ``keep_model`` (train.run_seeds). A spec with tuned stages trains with their choices (``tuned``: (study,
    stage) -> choice file; fedrepro.tuning), its checkpoints in a folder of those choices."""
    import time

    from fedrepro.io import atomic_write_json
    from fedrepro.train import train_job

    spec, checkpoint_dir = tuned_run(spec, Path(checkpoint_dir), tuned, log)
    index = Path(index)
    out_dirs = {s: index.parent / f"seed{s}" for s in seeds}
    results = train_job(
        spec, Path(data),
        partitions=dict(zip(seeds, map(Path, partitions), strict=True)),
        out_dirs=out_dirs, checkpoint_dir=Path(checkpoint_dir), device=device, threads=threads, log=log,
        engine=engine, keep_checkpoints=keep_checkpoints, keep_model=keep_model,
    )
    atomic_write_json(index, {"runs": [
        {"seed": s, "dir": out_dirs[s].name, "status": r.status} for s, r in results.items()
    ], **({"job_seconds": round(time.perf_counter() - started + sum(r.earlier_seconds for r in results.values()), 2)}
          if started is not None else {})})


def choose_tuning(stage: dict, runs: Path, summary: Path, out_json: Path, out_csv: Path, out_md: Path,
                  log: Callable[[str], None]) -> None:
    """Score a tuning stage's grid points from its aggregated runs (checked against their sha256) and write the
    choice, the scores and their table (fedrepro.tuning)."""
    from fedrepro.report.integrity import read_checked_csv
    from fedrepro.tuning import chosen_by_group, write_choice

    choice = write_choice(stage, read_checked_csv(runs), read_checked_csv(summary), Path(out_json), Path(out_csv),
                          Path(out_md))
    for group, picks in chosen_by_group(choice).items():
        where = "" if group is None else f" ({choice['per']} {group})"
        for method, picked in picks.items():
            log(f"tuning stage {stage['stage']}: {method}{where} takes {picked['values']} "
                f"(score {picked['score']:.2f})")


def finetune(spec: dict, runs_index: Path, source: Path, target: Path, checkpoint_dir: Path, index: Path,
             device: str, threads: int, log: Callable[[str], None], train_spec: dict | None = None,
             tuned: dict[tuple[str, str], Path] | None = None) -> None:
    """Fine-tune every seed of one method x setting on the setting's target, from the models its train job kept
    (in the folder of its tuned choices, for a run of ``train_spec`` with ``tuned`` stages: tuned_run);
    ``index`` (seeds.json) is written last and lists the per-seed records (seed{N}.json beside it)."""
    from fedrepro.finetune import finetune_job
    from fedrepro.io import atomic_write_json, read_json

    if train_spec is not None:
        _, checkpoint_dir = tuned_run(train_spec, Path(checkpoint_dir), tuned, log)
    runs = read_json(runs_index)["runs"]
    index = Path(index)
    records = finetune_job(spec, Path(source), Path(target), runs, Path(checkpoint_dir), index.parent,
                           device=device, threads=threads, log=log)
    atomic_write_json(index, {"runs": [{"seed": r["seed"], "file": f"seed{r['seed']}.json", "status": r["status"]}
                                       for r in records]})


def aggregate_finetune(indexes: list[Path], summary_csv: Path, curves_csv: Path, log: Callable[[str], None]) -> None:
    """Collect the fine-tuning records listed by each finetune job's seeds.json: one row per run
    (target_acc, best_target_acc, status) and one per run and fine-tuning epoch (the curves), each table with
    its sha256 beside it (fedrepro.report.integrity)."""
    from fedrepro.io import listed_in_indexes
    from fedrepro.report.collect import collect_finetune
    from fedrepro.report.integrity import write_checked_csv

    summary, curves = collect_finetune(listed_in_indexes(indexes, "file"))
    write_checked_csv(summary, Path(summary_csv))
    write_checked_csv(curves, Path(curves_csv))
    log(f"{len(summary)} fine-tuned runs, {len(curves)} epoch rows -> {summary_csv}, {curves_csv}")


def aggregate(indexes: list[Path], runs_csv: Path, summary_csv: Path, log: Callable[[str], None]) -> None:
    """Collect the seed folders listed by each train job's seeds.json into two tidy CSVs, each with its sha256
    beside it (fedrepro.report.integrity)."""
    from fedrepro.io import listed_in_indexes
    from fedrepro.report.collect import collect_runs
    from fedrepro.report.integrity import write_checked_csv

    runs, summary = collect_runs(listed_in_indexes(indexes, "dir"))
    write_checked_csv(runs, Path(runs_csv))
    write_checked_csv(summary, Path(summary_csv))
    log(f"{len(summary)} runs, {len(runs)} evaluation rows -> {runs_csv}, {summary_csv}")


def table(spec: dict, summary_csv: Path, runs_csv: Path, published_csv: Path | None, out_stem: Path, scale: str,
          log: Callable[[str], None]) -> None:
    """Render one table; its aggregated tables are refused unless whole (their checksums) and holding every
    seed (the spec's ``seeds``, the study's; without them, some seed) of every run of its cells."""
    from fedrepro.report.published import load_published
    from fedrepro.report.table_sources import table_source
    from fedrepro.report.tables import render_table

    published = load_published(published_csv) if published_csv else None
    # the cells' frame as the table's source reads it (fedrepro.report.table_sources); a spec without a source
    # shows pre-training runs, the schema's default
    summary = table_source(spec.get("source", "train")).read(spec, summary_csv, runs_csv)
    cells = render_table(spec, summary, published, Path(out_stem), scale)
    log(f"{spec['name']}: {len(cells)} cells -> {out_stem}.{{md,tex,csv}}")


def figure(spec: dict, inputs: list[Path], out_stem: Path, log: Callable[[str], None]) -> None:
    """Render one figure; what it reads (runs.csv, summary.csv, partition stats, a seed's run files) and how it
    draws them is its kind's (fedrepro.report.figure_kinds). An aggregated table is refused unless whole (its
    checksum) and holding every seed (the spec's ``seeds``, the study's; without them, some seed) of every run
    the figure draws (the spec's ``drawn_runs``; without them, the runs it holds)."""
    from fedrepro.report.figure_kinds import figure_kind

    figure_kind(spec["kind"]).render(spec, inputs, Path(out_stem))
    log(f"{spec['name']} ({spec['kind']}) -> {out_stem}.{{png,pdf}}")


def scorecard(tables: list[dict], cell_csvs: list[Path], scale: str, md_out: Path, html_out: Path,
              log: Callable[[str], None], coverage: dict[str, list[int]] | None = None,
              runs: dict[str, list[Path]] | None = None, papers: dict[str, str | None] | None = None,
              figures: dict[str, list[dict]] | None = None) -> None:
    """Score every table (``tables``: {study, spec}, in the order of ``cell_csvs``) into one scorecard;
    ``coverage``: study -> [published cells shown, published cells]; ``runs``: study -> [runs.csv, summary.csv]
    for its convergence section, which must hold every seed (the specs' ``seeds``) of every run the study's
    tables show; ``papers``: study -> its paper's key (the trials behind the published sds); ``figures``: study
    -> its figures' job specs (their per-run numbers judge the runs' plateau too)."""
    from fedrepro.report.scorecard import build_scorecard
    from fedrepro.report.table_sources import table_source
    from fedrepro.study import table_runs

    shown: dict[str, tuple[list[tuple[str, str]], list[int] | None]] = {}
    for t in tables:
        if table_source(t["spec"].get("source", "train")).has_runs:  # a computed table shows no runs
            earlier = shown.get(t["study"], ([], None))[0]
            shown[t["study"]] = (earlier + table_runs(t["spec"]), t["spec"].get("seeds"))
    scores = build_scorecard([(t["study"], t["spec"], Path(p)) for t, p in zip(tables, cell_csvs, strict=True)],
                             scale, Path(md_out), Path(html_out),
                             {s: (c[0], c[1]) for s, c in coverage.items()} if coverage else None,
                             {s: (Path(r[0]), Path(r[1])) for s, r in runs.items()} if runs else None, papers,
                             shown, figures)
    claims = [c for s in scores for c in s.claims]
    log(f"{len(scores)} tables, {sum(c.holds is True for c in claims)} of {len(claims)} ranking claims hold "
        f"-> {md_out}, {html_out}")


def showcase(readme: Path, figure_png: Path, scorecard_md: Path, study: str, caption: str, figure_out: Path,
             excerpt_out: Path, log: Callable[[str], None]) -> None:
    """Refresh the README's showcase block from this run's figure and scorecard."""
    from fedrepro.report.showcase import write_showcase

    changed = write_showcase(Path(readme), Path(figure_png), Path(scorecard_md), study, caption,
                             Path(figure_out), Path(excerpt_out))
    log(f"{figure_png} -> {figure_out}; {readme} {'updated' if changed else 'unchanged'}")


def main_from_snakemake(snakemake, step: Callable[..., None], **kwargs) -> None:
    """Run ``step`` with the rule's log; used by the thin scripts in workflow/scripts."""
    log_path = snakemake.log[0] if len(snakemake.log) else None
    with rule_log(log_path) as log:
        step(**kwargs, log=log)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the Snakemake workflow (snakemake) or import fedrepro.pipeline")
