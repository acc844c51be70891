"""One train job: one method on one setting, every seed in one process (torch import costs seconds)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

import fedrepro
from fedrepro.algorithms import build_algorithm
from fedrepro.data.format import Prepared, load_prepared
from fedrepro.io import atomic_write_json, atomic_write_text, read_json, remove_checksummed
from fedrepro.models import build_model
from fedrepro.partition import load_partition, longtail_test_indices, stratified_subset
from fedrepro.seeding import INIT, derive_seed
from fedrepro.sim.checkpoint import Fingerprint, SeedFiles, finished_marker, mark_finished
from fedrepro.sim.runs import RunResult, request_stop
from fedrepro.sim.sync import FederatedRun, TrainingConfig
from fedrepro.sim.tensors import DeviceData, to_device_data

METRIC_COLUMNS = ("round", "test_acc", "test_loss", "train_loss", "bytes_up", "bytes_down", "seconds",
                  "client_acc_mean", "client_acc_var")


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda was requested but torch.cuda.is_available() is False")
    return torch.device(name)


def fingerprint(spec: dict, seed: int, data_sha: str, partition: list[np.ndarray]) -> Fingerprint:
    """What a checkpoint must match to be resumed: the run's config, seed, data and partition (one digest of
    all, as checkpoints and markers record it, and one per input, to say which changed)."""
    relevant = {k: v for k, v in spec.items() if k != "training"}
    relevant["training"] = {k: v for k, v in spec["training"].items() if k != "checkpoint_every"}
    config = json.dumps(relevant, sort_keys=True).encode()
    whole, config_part, partition_part = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    whole.update(config)
    whole.update(f"|seed={seed}|data={data_sha}|".encode())
    config_part.update(config + f"|seed={seed}".encode())
    for idx in partition:
        for h in (whole, partition_part):
            h.update(np.ascontiguousarray(idx, dtype=np.int64).tobytes())
            h.update(b"|")
    return Fingerprint(whole.hexdigest(), {"config": config_part.hexdigest(), "data": data_sha,
                                           "partition": partition_part.hexdigest()})


def summarize(result: RunResult, last_k: int) -> dict:
    """final, best and mean-of-last-k test accuracy of a run's evaluated rounds."""
    accs = [row["test_acc"] for row in result.history]
    if not accs:
        return {"final_acc": None, "best_acc": None, "last_k_acc": None}
    return {
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "last_k_acc": float(np.mean(accs[-last_k:])),
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name: Linux's /proc/cpuinfo "model name", else platform.processor(), else "unknown"."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:  # no /proc (macOS, Windows)
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """What produced a run's numbers: the CPU model, torch's CPU capability (the vector instructions its kernels
    use, e.g. AVX512, or what ATEN_CPU_CAPABILITY caps it to: results differ in the last bits between them), the
    cap oneDNN's convolutions were held to (ONEDNN_MAX_CPU_ISA, None: the CPU's best), torch's version and the CPU
    threads torch uses."""
    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def write_run(out_dir: Path, spec: dict, seed: int, result: RunResult, device: torch.device,
              fingerprint: str = "") -> None:
    """metrics.csv and summary.json of one seed; summary.json last, so it marks a finished run. Its
    ``fingerprint`` (the run's: train.fingerprint) tells a later job of another configuration whose run the
    folder holds (set_aside)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # the engine's columns first, then whatever a method adds (Algorithm.round_metrics)
    first = result.history[0] if result.history else {}
    columns = list(METRIC_COLUMNS) + [c for c in first if c not in METRIC_COLUMNS]
    lines = [",".join(columns)]
    lines += [",".join(repr(row.get(c)) if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns)
              for row in result.history]
    metrics = "\n".join(lines) + "\n"
    atomic_write_text(out_dir / "metrics.csv", metrics)
    last = result.history[-1] if result.history else {}
    summary = {
        "study": spec["study"], "setting": spec["setting"], "method": spec["method"], "seed": seed,
        # what the aggregation checks metrics.csv against (fedrepro.report.collect): a cut file may still parse
        "metrics_sha256": hashlib.sha256(metrics.encode()).hexdigest(),
        "status": result.status, "diverged_round": result.diverged_round, "stopped_round": result.stopped_round,
        # a diverged run's round, training loss and first non-finite quantity (sim/runs.py, Divergence)
        "divergence": result.divergence,
        "fingerprint": fingerprint, "rounds": spec["training"]["rounds"], "last_k": spec["training"]["last_k"],
        **summarize(result, spec["training"]["last_k"]),
        "per_class_acc": result.per_class_acc,
        "seconds": last.get("seconds"), "config": spec, "device": str(device), "machine": machine(),
        # what an engine's result adds (the heterogeneous engine: per-client accuracies)
        **{k: v for k, v in vars(result).items() if k not in {f.name for f in dataclasses.fields(RunResult)}},
        "versions": {"fedrepro": fedrepro.__version__, "python": platform.python_version(),
                     "torch": torch.__version__, "numpy": np.__version__},
    }
    atomic_write_json(out_dir / "summary.json", summary)


def set_aside(out_dir: Path, fingerprint: str) -> Path | None:
    """Move a finished run of another fingerprint (an edited config's earlier run) out of ``out_dir``, which the
    run of ``fingerprint`` is about to write, to ``seed{N}.{its fingerprint[:12]}`` beside it (``-2``, ``-3``,
    ... when taken; ``unknown`` for a run that recorded none) with NOTE.json saying whose run it is, when and
    why it was moved; the new folder, or None when there was nothing to move. A run of ``fingerprint`` itself
    (retrained because its files changed) is overwritten: it is the same run."""
    out_dir = Path(out_dir)
    try:
        old = json.loads((out_dir / "summary.json").read_text()).get("fingerprint") or None
    except FileNotFoundError:  # no finished run here
        return None
    except (OSError, ValueError, AttributeError):  # a summary that cannot say whose run it is: keep it too
        old = None
    if old == fingerprint:
        return None
    stem = out_dir.with_name(f"{out_dir.name}.{old[:12] if old else 'unknown'}")
    moved, n = stem, 1
    while moved.exists():  # the same earlier config set aside before (configs edited back and forth)
        n += 1
        moved = stem.with_name(f"{stem.name}-{n}")
    os.rename(out_dir, moved)  # same folder: atomic, and the run's files stay byte for byte
    atomic_write_json(moved / "NOTE.json", {
        "moved_from": str(out_dir), "fingerprint": old, "replaced_by": fingerprint,
        "moved_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "why": "a train job of another configuration (replaced_by) was about to write its run into moved_from; "
               "this finished run was moved here instead of being overwritten",
    })
    return moved


def job_data(spec: dict, data_path: Path, device: str, threads: int) -> tuple[torch.device, Prepared, DeviceData]:
    """What every train job does first: threads, the preemption signal, the device, the data on it."""
    torch.set_num_threads(threads)
    signal.signal(signal.SIGTERM, request_stop)  # preemption: checkpoint after this round, then exit non-zero
    dev = pick_device(device)
    prepared = load_prepared(data_path)
    if spec["partition"].get("pool_test"):
        # the partition indexes train + test together (FedL2G: each client splits its own samples 75/25)
        prepared = dataclasses.replace(prepared, x_train=np.concatenate([prepared.x_train, prepared.x_test]),
                                       y_train=np.concatenate([prepared.y_train, prepared.y_test]))
    if spec.get("test_longtail_rho"):
        # FedDisco Table 5: test on a long-tailed set matching the long-tailed training data
        keep = longtail_test_indices(prepared.y_test, spec["test_longtail_rho"], np.random.default_rng(0))
        prepared = dataclasses.replace(prepared, x_test=prepared.x_test[keep], y_test=prepared.y_test[keep])
    if spec.get("test_samples") and spec["test_samples"] < len(prepared.y_test):
        keep = stratified_subset(prepared.y_test, spec["test_samples"], np.random.default_rng(0))
        prepared = dataclasses.replace(prepared, x_test=prepared.x_test[keep], y_test=prepared.y_test[keep])
    return dev, prepared, to_device_data(prepared, dev, spec.get("image_size"), spec.get("channels"),
                                         spec.get("normalize"))


class SeedRun(Protocol):
    """What a federation's engine builds for one seed (FederatedRun, HeteroRun, AsyncRun)."""

    def run(self, checkpoint: Path | None, fingerprint: str) -> RunResult: ...


def run_seeds(
    spec: dict,
    data_path: Path,
    partitions: dict[int, Path],
    out_dirs: dict[int, Path],
    checkpoint_dir: Path | None,
    device: str,
    threads: int,
    log: Callable[[str], None],
    build: Callable[[int, list[np.ndarray], DeviceData, Callable[[str], None]], SeedRun],
    finish: Callable[[SeedRun, Path], None] | None = None,
    keep_checkpoints: bool = False,
    keep_model: bool = False,
) -> dict[int, RunResult]:
    """Every seed of one train job, whatever the engine: ``build(seed, parts, data, log)`` makes the seed's run
    (torch's RNG seeded first, so models initialise alike); it resumes from its checkpoint if one matches;
    ``finish(run, out_dir)`` writes what an engine adds; summary.json comes last and marks the seed done.
    With a ``checkpoint_dir``, a finished seed leaves a marker there (sim/checkpoint.py) and its checkpoint
    goes unless ``keep_checkpoints``; ``keep_model`` keeps its final parameters (fine-tuning reads them). A
    seed whose marker matches is not trained again: its result holds only its status (the rest is in its
    run folder). A finished run of another fingerprint in a seed's folder is moved aside (set_aside) just
    before the seed's new run is written there."""
    dev, prepared, data = job_data(spec, data_path, device, threads)
    results = {}
    for seed, part_path in partitions.items():
        parts = load_partition(part_path)
        tag = f"{spec['study']}/{spec['setting']}/{spec['method']} seed {seed}"
        run_fingerprint = fingerprint(spec, seed, prepared.meta["sha256"], parts)
        out = Path(out_dirs[seed])
        files = SeedFiles.of(checkpoint_dir, seed) if checkpoint_dir else None
        done = files and finished_marker(files, run_fingerprint, out, keep_model)
        if done:
            log(f"{tag}: finished ({done['status']}) as {files.marker} says, its metrics unchanged: not trained again")
            results[seed] = RunResult(status=done["status"], diverged_round=done["diverged_round"],
                                      stopped_round=done["stopped_round"],
                                      earlier_seconds=float(read_json(out / "summary.json").get("seconds") or 0.0))
        else:
            log(f"{tag}: {len(parts)} clients, model {spec['model']}, device {dev}")
            torch.manual_seed(derive_seed(seed, INIT))
            run = build(seed, parts, data, lambda msg, tag=tag: log(f"{tag}: {msg}"))
            results[seed] = run.run(files.checkpoint if files else None, run_fingerprint)
            if moved := set_aside(out, run_fingerprint):
                log(f"{tag}: {out} held a finished run of another configuration: moved to {moved} (NOTE.json)")
            out.mkdir(parents=True, exist_ok=True)
            if finish:
                finish(run, out)
            write_run(out, spec, seed, results[seed], dev, run_fingerprint)
            if files:
                mark_finished(files, run_fingerprint, out, results[seed], keep_model)
        if files and not keep_checkpoints:  # also one a crash left behind after the marker was written
            remove_checksummed(files.checkpoint)
    return results


RunBuilder = Callable[[int, list[np.ndarray], DeviceData, Callable[[str], None]], SeedRun]
RunFinisher = Callable[[SeedRun, Path], None]


def train_job(
    spec: dict,
    data_path: Path,
    partitions: dict[int, Path],
    out_dirs: dict[int, Path],
    checkpoint_dir: Path | None,
    device: str = "auto",
    threads: int = 1,
    log: Callable[[str], None] = print,
    engine: dict | None = None,
    keep_checkpoints: bool = False,
    keep_model: bool = False,
) -> dict[int, RunResult]:
    """Train ``spec`` for every seed, each with the run its federation builds (fedrepro.federations: ``runs``);
    each seed resumes from its checkpoint if one matches (what a finished seed keeps: run_seeds)."""
    from fedrepro.federations import runs_of

    build, finish = runs_of(spec.get("federation", "sync"))(spec, Path(data_path), engine or {})
    return run_seeds(spec, data_path, partitions, out_dirs, checkpoint_dir, device, threads, log, build, finish,
                     keep_checkpoints=keep_checkpoints, keep_model=keep_model)


def sync_runs(spec: dict, data_path: Path, engine: dict) -> tuple[RunBuilder, RunFinisher | None]:
    """How a `federation: sync` job builds each seed's run. ``engine: {mode: auto}`` on CUDA measures in the job's
    first seed; the later seeds keep its choice."""
    training = TrainingConfig(**spec["training"])
    previous: list[FederatedRun] = []  # the seed built last, finished when the next one is built

    def build(seed: int, parts: list[np.ndarray], data: DeviceData, log: Callable[[str], None]) -> FederatedRun:
        model = build_model(spec["model"], data.shape, data.num_classes, weights=spec.get("weights"),
                            **data.model_kwargs)
        chosen = previous.pop().engine if previous else None
        run = FederatedRun(
            model=model.to(data.x_train.device),
            algorithm=build_algorithm(spec["algorithm"], **spec["hparams"]),
            data=data,
            client_indices=parts,
            training=training,
            weighting=spec["weighting"],
            seed=seed,
            log=log,
            engine=chosen or engine.get("mode", "auto"),
            side_by_side=engine.get("side_by_side", 32),
        )
        previous.append(run)
        return run

    return build, None
