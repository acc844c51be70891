"""What a finished seed keeps on disk: its run folder and a marker, not its last checkpoint (unless
`keep_checkpoints`); a rerun of its job skips it while the marker matches, and retrains it when not; the run
of an edited config moves the earlier run's folder aside instead of overwriting it."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support.common import tiny_digits_spec

from fedrepro.data.registry import prepare_dataset
from fedrepro.partition import make_partition, partition_stats, save_partition
from fedrepro.sim.checkpoint import SeedFiles, job_footprint
from fedrepro.train import set_aside, train_job

SPEC = tiny_digits_spec("scaffold")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, dict[int, Path]]:
    """digits, and one IID partition per partition seed (0 and 1)."""
    root = tmp_path_factory.mktemp("finished")
    data = root / "digits.npz"
    prepare_dataset("digits", data)
    labels = np.load(data)["y_train"]
    partitions = {seed: root / f"part{seed}.npz" for seed in (0, 1)}
    for seed, path in partitions.items():
        parts = make_partition(labels, SPEC["partition"], seed)
        save_partition(path, parts, partition_stats(parts, labels, 10), SPEC["partition"])
    return data, partitions


def train(inputs, root: Path, spec: dict = SPEC, partition: int = 0, **keep) -> list[str]:
    """Seed 0 of ``spec`` into ``root`` (run folder seed0, checkpoints ckpt); returns the job's log."""
    data, partitions = inputs
    logs: list[str] = []
    train_job(spec, data, {0: partitions[partition]}, {0: root / "seed0"}, root / "ckpt", log=logs.append, **keep)
    return logs


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def finished(inputs, tmp_path_factory) -> Path:
    """One finished run, default settings."""
    root = tmp_path_factory.mktemp("run")
    train(inputs, root)
    return root


def test_a_finished_run_keeps_its_metrics_and_a_marker_not_its_checkpoint(finished):
    files = SeedFiles.of(finished / "ckpt", 0)
    assert not files.checkpoint.exists() and not files.model.exists()
    marker = json.loads(files.marker.read_text())
    assert marker["status"] == "complete" and len(marker["fingerprint"]) == 64
    run = finished / "seed0"
    assert marker["files"] == {name: sha256(run / name) for name in ("metrics.csv", "summary.json")}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["fingerprint"] == marker["fingerprint"]
    # the footprint: the checkpoint it had while running (recorded in the marker), what it keeps now
    footprint = job_footprint(finished / "ckpt", {0: run})
    assert footprint.checkpoint_bytes == marker["checkpoint_bytes"] > 0
    assert footprint.kept_bytes == sum(p.stat().st_size for p in (files.marker, run / "metrics.csv",
                                                                  run / "summary.json"))
    # SCAFFOLD's checkpoint holds every client's control variate beside the model: what it kept is far less
    assert footprint.kept_bytes * 10 < footprint.checkpoint_bytes


def test_rerunning_a_finished_job_trains_nothing(inputs, finished, tmp_path):
    root = tmp_path / "again"
    shutil.copytree(finished, root)
    before = {p.name: sha256(p) for p in (root / "seed0").iterdir()}
    logs = train(inputs, root)
    assert any("not trained again" in m for m in logs), logs
    assert not any("round 1/2" in m for m in logs)
    assert {p.name: sha256(p) for p in (root / "seed0").iterdir()} == before
    assert sorted(p.name for p in root.iterdir()) == ["ckpt", "seed0"]  # nothing set aside


@pytest.mark.parametrize("change", ["lr", "partition", "metrics"])
def test_a_seed_whose_marker_does_not_match_trains_again(inputs, finished, tmp_path, change):
    root = tmp_path / change
    shutil.copytree(finished, root)
    spec = copy.deepcopy(SPEC)
    if change == "lr":
        spec["training"]["lr"] = 0.01
    if change == "metrics":  # an edited (or truncated) metrics file is no finished run
        (root / "seed0" / "metrics.csv").write_text("round,test_acc\n")
    old = json.loads((root / "ckpt" / "seed0.done.json").read_text())
    logs = train(inputs, root, spec, partition=1 if change == "partition" else 0)
    assert any("round 2/2" in m for m in logs) and not any("not trained again" in m for m in logs)
    new = json.loads((root / "ckpt" / "seed0.done.json").read_text())
    assert new["files"]["metrics.csv"] == sha256(root / "seed0" / "metrics.csv")
    assert (new["fingerprint"] == old["fingerprint"]) == (change == "metrics")
    # another config's finished run is set aside; the same run, retrained because its files changed, is not
    aside = [p.name for p in root.iterdir() if p.name.startswith("seed0.")]
    assert aside == ([] if change == "metrics" else [f"seed0.{old['fingerprint'][:12]}"])
    assert any("moved to" in m for m in logs) == (change != "metrics")


def test_an_edited_config_moves_the_earlier_run_aside_with_a_note(inputs, finished, tmp_path):
    root = tmp_path / "edited"
    shutil.copytree(finished, root)
    before = {p.name: sha256(p) for p in (root / "seed0").iterdir()}
    old = json.loads((root / "ckpt" / "seed0.done.json").read_text())["fingerprint"]
    spec = copy.deepcopy(SPEC)
    spec["training"]["lr"] = 0.01
    data, partitions = inputs  # the edited spec's checkpoints go under another digest: no marker there
    train_job(spec, data, {0: partitions[0]}, {0: root / "seed0"}, root / "ckpt-edited", log=lambda _: None)
    aside = root / f"seed0.{old[:12]}"
    note = json.loads((aside / "NOTE.json").read_text())
    assert {p.name: sha256(p) for p in aside.iterdir() if p.name != "NOTE.json"} == before  # byte for byte
    new = json.loads((root / "seed0" / "summary.json").read_text())
    assert new["config"]["training"]["lr"] == 0.01 and new["fingerprint"] != old
    assert note["fingerprint"] == old and note["replaced_by"] == new["fingerprint"]
    assert note["moved_from"] == str(root / "seed0") and note["moved_at"] and "overwritten" in note["why"]


def test_set_aside_never_reuses_a_folder_and_leaves_the_same_runs_fingerprint_in_place(tmp_path):
    out = tmp_path / "seed3"

    def finished_run(summary: str) -> None:
        out.mkdir()
        (out / "summary.json").write_text(summary)

    assert set_aside(out, "b" * 64) is None  # nothing there yet
    earlier = json.dumps({"fingerprint": "a" * 64})
    for summary in (earlier, earlier, '{"status": "complete"}', "{trunc"):  # the last two say no fingerprint
        finished_run(summary)
        assert set_aside(out, "b" * 64) is not None and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "seed3.aaaaaaaaaaaa", "seed3.aaaaaaaaaaaa-2", "seed3.unknown", "seed3.unknown-2"]
    assert json.loads((tmp_path / "seed3.unknown" / "NOTE.json").read_text())["fingerprint"] is None
    finished_run(json.dumps({"fingerprint": "b" * 64}))
    assert set_aside(out, "b" * 64) is None and (out / "summary.json").is_file()


def test_keep_checkpoints_keeps_the_finished_checkpoint_and_a_later_run_without_it_frees_it(inputs, tmp_path):
    train(inputs, tmp_path, keep_checkpoints=True)
    files = SeedFiles.of(tmp_path / "ckpt", 0)
    assert torch.load(files.checkpoint, weights_only=False)["round"] == 2 and files.marker.is_file()
    # the footprint counts a kept checkpoint, and the checkpoint of a seed still running (seed 1 here)
    shutil.copy(files.checkpoint, SeedFiles.of(tmp_path / "ckpt", 1).checkpoint)
    footprint = job_footprint(tmp_path / "ckpt", {0: tmp_path / "seed0", 1: tmp_path / "seed1"})
    assert footprint.checkpoint_bytes == files.checkpoint.stat().st_size < footprint.kept_bytes
    assert footprint.kept_bytes == job_footprint(tmp_path / "ckpt", {0: tmp_path / "seed0"}).kept_bytes
    logs = train(inputs, tmp_path)  # the marker matches: skipped, and the checkpoint is not kept any more
    assert any("not trained again" in m for m in logs) and not files.checkpoint.exists()


def test_keep_model_keeps_the_final_parameters_of_the_checkpoint(inputs, tmp_path):
    train(inputs, tmp_path, keep_checkpoints=True, keep_model=True)
    files = SeedFiles.of(tmp_path / "ckpt", 0)
    final, model = (torch.load(p, weights_only=False) for p in (files.checkpoint, files.model))
    assert torch.equal(model["w"], final["w"]) and model["status"] == "complete"
    assert files.model.stat().st_size * 3 < files.checkpoint.stat().st_size  # no client state
    # a model the job should keep but which is gone: the seed trains again to make it
    files.model.unlink()
    files.checkpoint.unlink()
    logs = train(inputs, tmp_path, keep_model=True)
    assert any("round 2/2" in m for m in logs) and files.model.is_file()
