"""Real signals: a train job killed mid-run (SIGKILL) or preempted (SIGTERM) resumes from its checkpoint
and ends with exactly the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from support.common import digits_job_inputs

from fedrepro.train import train_job

SPEC = {
    "study": "s", "setting": "niid", "method": "fedavg", "dataset": "digits", "model": "simple_cnn",
    "partition": {"kind": "dirichlet", "clients": 5, "beta": 0.5}, "image_size": None, "channels": None,
    "algorithm": "fedavg", "hparams": {}, "weighting": {"kind": "size"},
    "training": {"rounds": 30, "local_epochs": 1, "batch_size": 32, "lr": 0.05, "momentum": 0.5, "weight_decay": 0.0,
                 "join_ratio": 0.6, "eval_every": 1, "last_k": 3, "checkpoint_every": 3, "straggler_steps": None},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    data, parts = digits_job_inputs(tmp_path_factory.mktemp("resume"), SPEC["partition"], (0,))
    return data, parts[0]


def run_here(inputs, out: Path, log=lambda m: None):
    data, part = inputs
    train_job(SPEC, data, {0: part}, {0: out / "seed0"}, out / "ckpt", log=log)
    return pd.read_csv(out / "seed0" / "metrics.csv").drop(columns="seconds")


def start_in_subprocess(inputs, out: Path) -> subprocess.Popen:
    data, part = inputs
    code = textwrap.dedent(f"""
        import json, pathlib
        from fedrepro.train import train_job
        train_job(json.loads({json.dumps(json.dumps(SPEC))}), pathlib.Path({str(data)!r}),
                  {{0: pathlib.Path({str(part)!r})}}, {{0: pathlib.Path({str(out / 'seed0')!r})}},
                  pathlib.Path({str(out / 'ckpt')!r}))
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_checkpoint(proc: subprocess.Popen, path: Path, at_least: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            rnd = torch.load(path, weights_only=False)["round"]
            if rnd >= at_least:
                return rnd
        assert proc.poll() is None, f"finished before it could be interrupted:\n{proc.stdout.read()}"
        time.sleep(0.05)
    raise TimeoutError(path)


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_equals_uninterrupted(inputs, tmp_path):
    reference = run_here(inputs, tmp_path / "reference")
    proc = start_in_subprocess(inputs, tmp_path / "killed")
    wait_for_checkpoint(proc, tmp_path / "killed" / "ckpt" / "seed0.pt", at_least=6)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (tmp_path / "killed" / "seed0" / "summary.json").exists()
    logs = []
    resumed = run_here(inputs, tmp_path / "killed", log=logs.append)
    assert any("resumed" in m for m in logs) and not any("after round 30" in m for m in logs)
    pd.testing.assert_frame_equal(resumed, reference)


@pytest.mark.slow
def test_sigterm_checkpoints_the_current_round_exits_nonzero_and_resumes(inputs, tmp_path):
    data, part = inputs
    ref = tmp_path / "reference"
    uninterrupted = train_job(SPEC, data, {0: part}, {0: ref / "seed0"}, ref / "ckpt")
    assert uninterrupted[0].earlier_seconds == 0.0
    reference = pd.read_csv(ref / "seed0" / "metrics.csv").drop(columns="seconds")
    proc = start_in_subprocess(inputs, tmp_path / "preempted")
    wait_for_checkpoint(proc, tmp_path / "preempted" / "ckpt" / "seed0.pt", at_least=3)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    found = re.search(r"Preempted: stopped by a signal after round (\d+); checkpoint", output)
    assert found, output
    stopped = int(found[1])
    ckpt = torch.load(tmp_path / "preempted" / "ckpt" / "seed0.pt", weights_only=False)
    assert ckpt["round"] == stopped < 30  # saved at the round it stopped, not only at the interval
    out = tmp_path / "preempted"
    result = train_job(SPEC, data, {0: part}, {0: out / "seed0"}, out / "ckpt")
    pd.testing.assert_frame_equal(pd.read_csv(out / "seed0" / "metrics.csv").drop(columns="seconds"), reference)
    # the job's seconds count the preempted attempt's training too (seeds.json's job_seconds)
    assert result[0].earlier_seconds == pytest.approx(ckpt["seconds"]) and ckpt["seconds"] > 0


def test_job_seconds_count_seeds_finished_by_an_earlier_attempt(inputs, tmp_path):
    """A job rerun after its seeds finished (a stop between seeds, say) reports the whole job's seconds, not
    only the last process's: each finished seed's training seconds are added (pipeline.train, seeds.json)."""
    from fedrepro.pipeline import train

    data, part = inputs
    index = tmp_path / "runs" / "seeds.json"
    args = dict(spec=SPEC, data=data, partitions=[part], seeds=[0], index=index, checkpoint_dir=tmp_path / "ckpt",
                device="cpu", threads=1, log=lambda m: None)
    train(**args, started=time.perf_counter())
    first = json.loads(index.read_text())["job_seconds"]
    trained = json.loads((tmp_path / "runs" / "seed0" / "summary.json").read_text())["seconds"]
    assert first >= trained > 0
    started = time.perf_counter()
    train(**args, started=started)  # the seed's marker matches: nothing trains
    wall = time.perf_counter() - started
    assert json.loads(index.read_text())["job_seconds"] == pytest.approx(trained + wall, abs=0.05)
