"""Issue #24: what the pipeline writes and reads back (checkpoints, partitions, prepared data, its JSON) is
refused by name when damaged, never loaded silently; a write that fails says which file and why; a checkpoint
of an older partition is set aside by the pipeline itself, one of other data or config refused naming which."""

from __future__ import annotations

import copy
import dataclasses
import errno
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support.common import digits_job_inputs, dirichlet_clients, sync_run, tiny_digits_spec

from fedrepro import pipeline
from fedrepro.data.format import load_prepared, save_prepared
from fedrepro.data.registry import prepare_dataset
from fedrepro.partition import load_partition, make_partition, partition_stats, save_partition
from fedrepro.sim.checkpoint import CheckpointError, SeedFiles, finished_marker, save_checkpoint
from fedrepro.sim.sync import TrainingConfig
from fedrepro.train import train_job

SPEC = tiny_digits_spec("fedavg")


def flip(path: Path, at: float = 0.5) -> None:
    """Flip two bytes of ``path`` at fraction ``at`` of its length: a failing disk, a bad copy."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i] ^= 0xFF
    data[i + 1] ^= 0xFF
    path.write_bytes(bytes(data))


def named(path: Path) -> str:
    return re.escape(str(path))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, dict[int, Path]]:
    """digits, and the IID partition of partition seeds 0 and 1 (two valid, different partitions)."""
    return digits_job_inputs(tmp_path_factory.mktemp("integrity"), SPEC["partition"], (0, 1))


def train(inputs, root: Path, spec: dict = SPEC, partition: int = 0, data: Path | None = None) -> list[str]:
    """Seed 0 of ``spec`` into ``root`` (run folder seed0, checkpoints ckpt, kept); returns the job's log."""
    logs: list[str] = []
    train_job(spec, data or inputs[0], {0: inputs[1][partition]}, {0: root / "seed0"}, root / "ckpt",
              log=logs.append, keep_checkpoints=True)
    return logs


@pytest.fixture(scope="module")
def finished(inputs, tmp_path_factory) -> Path:
    """One finished run whose last checkpoint is kept (``keep_checkpoints``)."""
    root = tmp_path_factory.mktemp("finished")
    train(inputs, root)
    return root


def copy_of(finished: Path, tmp_path: Path) -> tuple[Path, SeedFiles]:
    root = tmp_path / "run"
    shutil.copytree(finished, root)
    return root, SeedFiles.of(root / "ckpt", 0)


# ---------------------------------------------------------------- checkpoints


def test_a_damaged_finished_checkpoint_is_refused_naming_it(inputs, finished, tmp_path):
    root, files = copy_of(finished, tmp_path)
    files.marker.unlink()  # its job reruns from the finished checkpoint, training nothing
    flip(files.checkpoint)
    with pytest.raises(CheckpointError, match=named(files.checkpoint) + ".*does not match its checksum"):
        train(inputs, root)


def test_a_damaged_mid_run_checkpoint_is_refused_before_resuming(small_data, tmp_path):
    parts = dirichlet_clients(small_data.y_train.numpy())
    cfg = TrainingConfig(rounds=2, local_epochs=1, batch_size=32, lr=0.05, eval_every=1, checkpoint_every=1)
    ckpt = tmp_path / "seed0.pt"
    sync_run(small_data, parts, cfg=cfg).run(ckpt, "fp")  # after round 2 of the 3 below
    flip(ckpt)
    with pytest.raises(CheckpointError, match=named(ckpt) + ".*does not match its checksum"):
        sync_run(small_data, parts, cfg=dataclasses.replace(cfg, rounds=3)).run(ckpt, "fp")


def test_a_changed_partition_sets_its_stale_checkpoint_aside_and_says_so(inputs, finished, tmp_path):
    root, files = copy_of(finished, tmp_path)
    stale = files.checkpoint.read_bytes()
    logs = train(inputs, root, partition=1)  # the pipeline rebuilt the partition: another valid one
    (moved,) = [p for p in (root / "ckpt").rglob("seed0.pt") if p != files.checkpoint]
    assert moved.parent.parent.name == "stale-partition" and moved.read_bytes() == stale
    said = [m for m in logs if "another partition" in m]
    assert len(said) == 1 and f"{files.checkpoint} was written for" in said[0] and f"set aside as {moved}" in said[0]
    assert any("round 2/2" in m for m in logs)  # trained afresh on the new partition
    assert files.checkpoint.read_bytes() != stale


@pytest.mark.parametrize("change", ["data", "config"])
def test_a_checkpoint_of_other_data_or_config_is_refused_naming_which(inputs, finished, tmp_path, change):
    root, files = copy_of(finished, tmp_path)
    spec, data = SPEC, None
    if change == "data":  # the same labels (so the same partition), one pixel changed
        prepared = load_prepared(inputs[0])
        x_train = prepared.x_train.copy()
        x_train[0, 0, 0, 0] ^= 1
        data = tmp_path / "digits.npz"
        save_prepared(data, x_train, prepared.y_train, prepared.x_test, prepared.y_test,
                      {k: v for k, v in prepared.meta.items() if k != "sha256"})
    else:
        spec = copy.deepcopy(SPEC)
        spec["training"]["lr"] = 0.01
    which = {"data": "the prepared data set differs", "config": "the run's config (its spec or seed) differs"}
    with pytest.raises(CheckpointError, match=named(files.checkpoint) + ".*" + re.escape(which[change])):
        train(inputs, root, spec, data=data)


# ---------------------------------------------------------------- partitions and prepared data


def test_a_damaged_partition_is_refused_naming_it(tmp_path):
    labels = np.repeat(np.arange(10), 30)
    parts = make_partition(labels, SPEC["partition"], 0)
    path = tmp_path / "seed0.npz"
    save_partition(path, parts, partition_stats(parts, labels, 10), SPEC["partition"])
    assert len(load_partition(path)) == 3
    flip(path, at=0.3)  # inside the index array: zip reported "Bad CRC-32 for file 'indices.npy'", no path
    with pytest.raises(ValueError, match=named(path) + ".*does not match its checksum"):
        load_partition(path)


def test_a_damaged_prepared_file_is_refused_by_every_reader_naming_it(tmp_path):
    data = tmp_path / "digits.npz"
    prepare_dataset("digits", data)
    flip(data, at=0.3)  # inside x_train: the partition job, which reads only the labels, took it silently
    with pytest.raises(ValueError, match=named(data) + ".*does not match its checksum"):
        load_prepared(data)
    with pytest.raises(ValueError, match=named(data) + ".*does not match its checksum"):
        pipeline.partition(data, SPEC["partition"], [0], [tmp_path / "p" / "seed0.npz"], lambda _: None)
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- JSON read back, and failed writes


def test_garbage_json_read_back_is_named(finished, tmp_path):
    index = tmp_path / "runs" / "seeds.json"
    index.parent.mkdir()
    index.write_text('{"runs": [{"seed": 0, "dir"')  # cut mid-write by a copy, say
    with pytest.raises(ValueError, match=named(index) + ": not valid JSON"):
        pipeline.aggregate([index], tmp_path / "runs.csv", tmp_path / "summary.csv", lambda _: None)
    root, files = copy_of(finished, tmp_path)
    files.marker.write_text("garbage")
    with pytest.raises(ValueError, match=named(files.marker) + ": not valid JSON"):
        finished_marker(files, "fp", root / "seed0", keep_model=False)


@pytest.fixture
def tiny_disk(tmp_path):
    """A real file system of 256 KiB (tmpfs), so that torch's own writer meets a real ENOSPC; skipped where this
    process may not mount one (not root, or a container without the capability)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); the simulated chain "
                    "below still runs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_checkpoint_on_a_really_full_disk_names_its_path_and_the_disk(tiny_disk):
    # torch's writer raises RuntimeError("[enforce fail at inline_container.cc:...] unexpected pos ...") while
    # handling the OSError(ENOSPC) of the file write: the message must still say which file and why
    ckpt = tiny_disk / "ckpt" / "seed0.pt"
    with pytest.raises(OSError, match=named(ckpt) + ": could not be written: disk full") as caught:
        save_checkpoint(ckpt, "fp", {"w": torch.zeros(1_000_000)})
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in tiny_disk.rglob("*") if p.is_file()]  # nothing half-written is left behind


def test_a_writer_that_wraps_the_disk_error_still_names_the_file_and_the_disk(monkeypatch, tmp_path):
    def wrapped(*args, **kwargs):  # the chain torch's writer raises on a full disk (measured on tmpfs above)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904 (as torch chains it)

    monkeypatch.setattr(torch, "save", wrapped)
    ckpt = tmp_path / "ckpt" / "seed0.pt"
    with pytest.raises(OSError, match=named(ckpt) + ": could not be written: disk full") as caught:
        save_checkpoint(ckpt, "fp", {"round": 1})
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]

    def unrelated(*args, **kwargs):
        raise RuntimeError("not a disk's error")

    monkeypatch.setattr(torch, "save", unrelated)  # anything else passes through as it was raised
    with pytest.raises(RuntimeError, match="not a disk's error"):
        save_checkpoint(ckpt, "fp", {"round": 1})


def test_a_full_disk_names_the_file_and_says_disk_full(monkeypatch, tmp_path):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    ckpt = tmp_path / "ckpt" / "seed0.pt"
    with pytest.raises(OSError, match=named(ckpt) + ".*disk full") as caught:
        save_checkpoint(ckpt, "fp", {"round": 1})
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.setattr(np, "savez", full)
    part = tmp_path / "partitions" / "seed0.npz"
    labels = np.repeat(np.arange(10), 3)
    parts = make_partition(labels, SPEC["partition"], 0)
    with pytest.raises(OSError, match=named(part) + ".*disk full"):
        save_partition(part, parts, partition_stats(parts, labels, 10), SPEC["partition"])
    # nothing half-written is left behind
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
