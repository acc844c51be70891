"""Checkpoints that are refused, never silently reused, when they belong to another configuration, and what
replaces a seed's checkpoint once it finished: a small marker (its fingerprint, status and the sha256 of its
run folder's files) and, where fine-tuning reads it, the final model alone. The checkpoint itself goes unless
the config keeps it (`keep_checkpoints`): at paper scale a finished seed's checkpoint holds every client's
state (0.5 to 2.3 GB per job), which nothing reads once the seed's metrics are written.
Checkpoints and model files carry a checksum beside them (fedrepro.io), verified on every read; a checkpoint
of an older partition of its seed is set aside (``STALE_DIR``), one of another config or data refused."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedrepro.data.weights import sha256sum
from fedrepro.io import (
    DamagedFileError,
    atomic_write,
    atomic_write_json,
    checksum_path,
    read_json,
    verify_checksum,
)
from fedrepro.sim.runs import STOP, Divergence, Preempted

FORMAT = 2  # 2: evaluation rows carry client accuracy mean and variance
RESTART = "delete it to start this run from scratch"
# a marker is written atomically: one that is no JSON was damaged afterwards
MARKER_REMEDY = "delete it: its seed then resumes from its checkpoint or trains again"
# the inputs a run's fingerprint covers (Fingerprint.inputs), as a refusal names them
INPUTS = {"config": "the run's config (its spec or seed)", "data": "the prepared data set",
          "partition": "the partition"}
STALE_DIR = "stale-partition"  # checkpoints of an older partition, set aside under <dir>/<its digest>/


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run (corrupt, or written by another config)."""


class Fingerprint(str):
    """A run's fingerprint (the hex digest that checkpoints and markers record) that also knows the digest of
    each input it covers (``inputs``: keys of ``INPUTS``), so that a refusal can say which changed. A str, so
    engines pass it on unchanged and markers written before still match."""

    inputs: dict[str, str]

    def __new__(cls, value: str, inputs: dict[str, str]) -> Fingerprint:
        fingerprint = super().__new__(cls, value)
        fingerprint.inputs = inputs
        return fingerprint


def _torch_save(blob: dict[str, Any], tmp: Path) -> None:
    # through a Python handle: a full disk then raises OSError(ENOSPC), which atomic_write names; torch's own
    # writer says only "basic_ios::clear: iostream error"
    with open(tmp, "wb") as fh:
        torch.save(blob, fh)


def save_checkpoint(path: Path, fingerprint: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` with the run's fingerprint (and its inputs' digests), atomically, with its checksum."""
    blob = {"format": FORMAT, "fingerprint": str(fingerprint), "inputs": getattr(fingerprint, "inputs", None),
            **payload}
    atomic_write(path, lambda tmp: _torch_save(blob, tmp), checksum=True)


def read_checkpoint(path: Path, remedy: str = RESTART) -> Any:
    """What ``save_checkpoint`` wrote to ``path``, once it matches its checksum; CheckpointError naming the
    file and ``remedy`` when it does not or cannot be read."""
    try:
        verify_checksum(path, remedy)
    except DamagedFileError as exc:
        raise CheckpointError(f"checkpoint {exc}") from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}: {exc}); "
                              f"{remedy}") from exc


def load_checkpoint(path: Path, fingerprint: str, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if it exists and matches ``fingerprint``; None if there is none, or if it
    was written for another partition of this seed: then it is moved under ``STALE_DIR`` and ``log`` says so
    (the pipeline rebuilt the partition, so the run starts afresh). Another config or data is refused, naming
    which."""
    path = Path(path)
    if not path.exists():
        return None
    blob = read_checkpoint(path)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format; delete it to start from scratch")
    if blob["fingerprint"] == fingerprint:
        return blob
    then, now = blob.get("inputs") or {}, getattr(fingerprint, "inputs", None) or {}
    changed = [k for k in INPUTS if k in then and k in now and then[k] != now[k]]
    if "partition" in changed:
        aside = path.parent / STALE_DIR / then["partition"][:12] / path.name
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, aside)
        os.replace(checksum_path(path), checksum_path(aside))
        log(f"checkpoint {path} was written for another partition of this seed (digest {then['partition'][:12]}, "
            f"now {now['partition'][:12]}): set aside as {aside}; this seed starts from scratch")
        return None
    raise CheckpointError(_refusal(path, blob["fingerprint"], fingerprint, changed, then, now))


def _refusal(path: Path, was: str, wanted: str, changed: list[str], then: dict[str, str],
             now: dict[str, str]) -> str:
    """Why the checkpoint at ``path`` (fingerprint ``was``) is not resumed for ``wanted``: the inputs that
    differ, or, for a checkpoint that records no digest per input, all three."""
    if not changed:
        why = (f"by another configuration, data set or partition (fingerprint {was[:12]} != {wanted[:12]}; it "
               "records no digest per input)")
    else:
        lead = "by another configuration" if "config" in changed else "for other inputs"
        why = lead + ": " + "; ".join(f"{INPUTS[k]} differs (digest {then[k][:12]} then, {now[k][:12]} now)"
                                      for k in changed)
    return f"checkpoint {path} was written {why}; refusing to resume from it. Delete it to start this run from scratch"


def module_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's buffers (BatchNorm running statistics) on the CPU: state the flat parameter vector does not
    hold, so a checkpoint must, or a resumed BatchNorm model starts from stale statistics."""
    return {name: buf.detach().cpu().clone() for name, buf in model.named_buffers()}


def restore_buffers(model: torch.nn.Module, saved: dict[str, torch.Tensor] | None) -> None:
    """Copy ``saved`` (from module_buffers) back into the model's buffers."""
    own = dict(model.named_buffers())
    for name, value in (saved or {}).items():
        own[name].copy_(value)


def close_round(rnd: int, rounds: int, divergence: Divergence | None, result: Any, checkpoint: Path | None,
                fingerprint: str, every: int, payload: Callable[[], dict[str, Any]],
                log: Callable[[str], None], finished: bool = False) -> bool:
    """The end of every engine's round: mark a divergence (``divergence``: why the round diverged, None when it did
    not) in the result and the log, checkpoint when due (every ``every`` rounds, at the end, on divergence, when
    the engine says the run is ``finished`` early and on a stop signal; ``payload()`` builds what to save, only
    then), and stop: True to leave the loop after a divergence or an early finish; a stop signal (SIGTERM,
    preemption) raises Preempted once it is saved."""
    diverged = divergence is not None
    if diverged:
        result.status, result.diverged_round = "diverged", rnd
        result.divergence = {**dataclasses.asdict(divergence), "why": divergence.text()}
        log(f"diverged at round {rnd}: {divergence.text()}")
    done = diverged or finished or rnd == rounds
    stop = STOP.is_set() and not done
    if checkpoint and (done or stop or rnd % every == 0):
        # the engines' payloads hold the status and round; the diagnosis rides along for a resumed diverged run
        save_checkpoint(checkpoint, fingerprint, {**payload(), "divergence": result.divergence})
    if stop:
        raise Preempted(f"stopped by a signal after round {rnd}" +
                        (f"; checkpoint {checkpoint}" if checkpoint else " (no checkpoint)"))
    return diverged or finished


def resume_progress(resumed: dict[str, Any], result: Any) -> tuple[int, int, int, float]:
    """Put a checkpoint's history and status back into ``result``; (next round, bytes up, bytes down, seconds)
    so far: what every engine's resume shares (each restores its own state beside it)."""
    result.history = resumed["history"]
    result.status, result.diverged_round = resumed["status"], resumed["diverged_round"]
    result.divergence = resumed.get("divergence")  # None in a checkpoint written before diagnoses were kept
    result.earlier_seconds = float(resumed["seconds"])
    return resumed["round"] + 1, resumed["bytes_up"], resumed["bytes_down"], resumed["seconds"]


@dataclass(frozen=True)
class SeedFiles:
    """One seed's files in its train job's checkpoint directory."""

    checkpoint: Path  # the resumable state, rewritten every checkpoint_every rounds
    marker: Path  # the seed finished: its fingerprint, status and the sha256 of its run folder's files
    model: Path  # the final parameters alone, for what reads them after training (FedGTST's fine-tuning)

    @classmethod
    def of(cls, checkpoint_dir: Path, seed: int) -> SeedFiles:
        stem = Path(checkpoint_dir) / f"seed{seed}"
        return cls(stem.with_suffix(".pt"), stem.with_suffix(".done.json"), stem.with_suffix(".model.pt"))


def _run_files(out_dir: Path) -> list[Path]:
    """The files of a seed's run folder (metrics.csv, summary.json and what an engine adds), not an atomic
    write's leftover temporary file."""
    return sorted(p for p in Path(out_dir).iterdir() if p.is_file() and not p.name.startswith("."))


def kept_parameters(blob: dict[str, Any]) -> torch.Tensor:
    """The parameters a checkpoint hands to what follows the run: the best evaluated model's where the run kept it
    (``keep_best``, sim/sync.py), else its last."""
    return blob["best"]["w"] if blob.get("best") else blob["w"]


def mark_finished(files: SeedFiles, fingerprint: str, out_dir: Path, result: Any, keep_model: bool) -> None:
    """Write a finished seed's marker, after its model file when ``keep_model``: both come from its last
    checkpoint, which the caller may then delete; a crash in between leaves either no marker (the next
    invocation resumes from the finished checkpoint, training nothing) or a valid one."""
    if keep_model:  # the same parameters fine-tuning read from the checkpoint before it was deleted
        final = read_checkpoint(files.checkpoint)
        save_checkpoint(files.model, fingerprint, {"w": kept_parameters(final), "status": final["status"],
                                                   "diverged_round": final["diverged_round"]})
    atomic_write_json(files.marker, {
        "fingerprint": fingerprint, "status": result.status, "diverged_round": result.diverged_round,
        "stopped_round": result.stopped_round, "checkpoint_bytes": files.checkpoint.stat().st_size,
        "files": {p.name: sha256sum(p) for p in _run_files(out_dir)},
    })


def finished_marker(files: SeedFiles, fingerprint: str, out_dir: Path, keep_model: bool) -> dict[str, Any] | None:
    """The seed's marker if it says this run (``fingerprint``: config, seed, data and partition) finished,
    every run-folder file it lists is unchanged and, when ``keep_model``, the model file is there; else None
    (the seed trains, or resumes from its checkpoint)."""
    try:
        marker = read_json(files.marker, remedy=MARKER_REMEDY)
    except FileNotFoundError:  # not finished (yet)
        return None
    if marker.get("fingerprint") != fingerprint or (keep_model and not files.model.is_file()):
        return None
    out = Path(out_dir)
    for name, sha in marker["files"].items():
        if not (out / name).is_file() or sha256sum(out / name) != sha:
            return None
    return marker


@dataclass(frozen=True)
class DiskFootprint:
    """A train job's bytes on disk. While it runs: the finished seeds' ``kept_bytes`` so far plus the running
    seed's checkpoint (seeds run one after another), and twice that for a moment while a checkpoint is
    rewritten (the new file is written beside the old one). Once finished: ``kept_bytes``."""

    checkpoint_bytes: int  # the largest checkpoint of its seeds (a finished seed's is recorded in its marker)
    kept_bytes: int  # the finished seeds' run folders, markers, model files and any checkpoint kept


def job_footprint(checkpoint_dir: Path, out_dirs: dict[int, Path]) -> DiskFootprint:
    """Measure a train job's footprint from the files it wrote (``out_dirs``: seed -> run folder, as the job
    got them); a seed not started yet counts nothing."""
    checkpoint_bytes = kept_bytes = 0
    for seed, out_dir in out_dirs.items():
        files = SeedFiles.of(checkpoint_dir, seed)
        live = files.checkpoint.stat().st_size if files.checkpoint.is_file() else 0
        if not files.marker.is_file():
            checkpoint_bytes = max(checkpoint_bytes, live)
            continue
        marker = read_json(files.marker, remedy=MARKER_REMEDY)
        checkpoint_bytes = max(checkpoint_bytes, marker["checkpoint_bytes"])
        kept = [files.marker, files.model, *_run_files(out_dir)]
        kept_bytes += live + sum(p.stat().st_size for p in kept if p.is_file())
    return DiskFootprint(checkpoint_bytes, kept_bytes)
