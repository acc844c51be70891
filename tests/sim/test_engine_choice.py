"""``engine: {mode: auto}``: sequential on a CPU without measuring; on CUDA the faster engine by a probe of a
few local steps, with as many clients side by side as fit in free memory, recorded in summary.json."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from support.common import digits_job_inputs, dirichlet_clients, history_rows
from support.side_by_side import run_with

from fedrepro.algorithms import build_algorithm
from fedrepro.sim import engine_choice
from fedrepro.sim.engine_choice import SEQUENTIAL, SIDE_BY_SIDE, EngineChoice, choose_engine, initial_choice
from fedrepro.train import train_job

GB = 10**9


# ---------------------------------------------------------------- the decision, from measurements


def test_side_by_side_slower_than_as_many_steps_one_at_a_time_is_sequential():
    choice = choose_engine(0.01, 0.5, bytes_per_client=GB // 1000, free_bytes=10 * GB, cap=32)
    assert (choice.mode, choice.clients_at_once) == (SEQUENTIAL, 1)
    assert choice.side_by_side_clients == 32 and choice.measured  # timed at the cap: memory was no limit


def test_memory_allows_only_k_clients_so_k_train_side_by_side():
    # 80% of 10 GB, less the step's 2 GB that does not grow with clients, holds six 1-GB clients
    choice = choose_engine(0.01, 0.03, bytes_per_client=GB, free_bytes=10 * GB, cap=32, fixed_bytes=2 * GB)
    assert (choice.mode, choice.clients_at_once) == (SIDE_BY_SIDE, 6)
    assert choice.summary() == {
        "mode": SIDE_BY_SIDE, "clients_at_once": 6, "reason": choice.reason, "requested": "auto", "measured": True,
        "sequential_s_per_step": 0.01, "side_by_side_s_per_step": 0.03, "side_by_side_clients": 6,
        "bytes_per_client": GB, "free_bytes": 10 * GB}


def test_the_config_caps_the_clients_side_by_side():
    choice = choose_engine(0.01, 0.05, bytes_per_client=GB // 1000, free_bytes=10 * GB, cap=8)
    assert (choice.mode, choice.clients_at_once) == (SIDE_BY_SIDE, 8)


def test_not_enough_memory_for_two_clients_is_sequential_untimed():
    choice = choose_engine(0.01, None, bytes_per_client=GB, free_bytes=2 * GB, cap=32)  # 1.6 GB: one client
    assert (choice.mode, choice.clients_at_once) == (SEQUENTIAL, 1)
    assert "side_by_side_s_per_step" not in choice.summary() and "1 client(s)" in choice.reason
    with pytest.raises(ValueError, match="must be timed"):  # two or more fit: the probe must have timed them
        choose_engine(0.01, None, bytes_per_client=GB, free_bytes=10 * GB, cap=32)


def test_auto_measures_only_on_cuda_and_only_methods_with_a_pure_local_objective():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU
    on_cpu = initial_choice("auto", 32, cpu, build_algorithm("fedavg"))
    assert (on_cpu.mode, on_cpu.measured) == (SEQUENTIAL, False) and "not measured" in on_cpu.reason
    assert initial_choice("auto", 32, cuda, build_algorithm("scaffold")) is None  # measured in round 1
    assert initial_choice("auto", 32, cuda, build_algorithm("fedsr")).mode == SEQUENTIAL  # no functional_loss
    assert initial_choice("auto", 1, cuda, build_algorithm("fedavg")).mode == SEQUENTIAL  # one at a time anyway
    assert initial_choice("vectorized", 4, cpu, build_algorithm("fedavg")).clients_at_once == 4
    with pytest.raises(ValueError, match="cannot train clients side by side"):
        initial_choice("vectorized", 4, cpu, build_algorithm("fedsr"))


# ---------------------------------------------------------------- the probe


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """The probe on the CPU: the device counts as measurable, with 1 TB free and steps that allocate nothing
    (the CUDA memory counters stand in; the steps still run)."""
    monkeypatch.setattr(engine_choice, "measurable", lambda device: True)
    monkeypatch.setattr(engine_choice, "free_bytes", lambda device: 1000 * GB)
    monkeypatch.setattr(engine_choice, "peak_bytes", lambda fn, device: (fn(), 0)[1])


@pytest.mark.parametrize("mode", [SEQUENTIAL, SIDE_BY_SIDE])
def test_the_probe_leaves_a_seeds_results_those_of_the_chosen_engine_alone(small_data, monkeypatch, cpu_as_gpu,
                                                                            mode):
    real = engine_choice.choose_engine
    forced = 0.0 if mode == SIDE_BY_SIDE else math.inf  # whatever the CPU measured
    monkeypatch.setattr(engine_choice, "choose_engine", lambda seq, sbs, *a, **kw: real(seq, forced, *a, **kw))
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=5)
    run, probed = run_with(small_data, parts, "scaffold", "auto")  # control variates, momentum: state to keep
    assert run.engine.mode == mode and run.engine.measured and run.engine.sequential_s_per_step > 0
    assert probed.engine == run.engine.summary()
    alone_run, alone = run_with(small_data, parts, "scaffold", "vectorized" if mode == SIDE_BY_SIDE else SEQUENTIAL,
                                width=run.engine.clients_at_once)
    assert history_rows(probed) == history_rows(alone)
    assert torch.equal(run.flat.w, alone_run.flat.w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA probe needs a GPU")
def test_auto_on_cuda_measures_both_engines_and_trains_as_the_sequential_one(small_data):
    data = dataclasses.replace(small_data, **{k: getattr(small_data, k).cuda()
                                               for k in ("x_train", "y_train", "x_test", "y_test")})
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=5)
    run, auto = run_with(data, parts, "scaffold", "auto")
    choice = run.engine.summary()
    assert choice["measured"] and choice["sequential_s_per_step"] > 0 and choice["free_bytes"] > 0
    assert choice["bytes_per_client"] > 0 and auto.engine == choice
    assert choice["mode"] == SEQUENTIAL or (choice["side_by_side_s_per_step"] > 0
                                            and 2 <= choice["clients_at_once"] <= run.side_by_side)
    seq_run, seq = run_with(data, parts, "scaffold", SEQUENTIAL)
    assert torch.allclose(run.flat.w, seq_run.flat.w, atol=1e-4, rtol=1e-3)  # as tests/sim/test_vectorized.py
    for a, b in zip(seq.history, auto.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)


# ---------------------------------------------------------------- what a train job records

SPEC = {
    "study": "s", "setting": "niid", "method": "fedavg", "dataset": "digits", "model": "simple_cnn",
    "partition": {"kind": "dirichlet", "clients": 4, "beta": 0.5}, "image_size": None, "channels": None,
    "algorithm": "fedavg", "hparams": {}, "weighting": {"kind": "size"},
    "training": {"rounds": 1, "local_epochs": 1, "batch_size": 64, "lr": 0.05, "last_k": 1},
}


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory):
    return digits_job_inputs(tmp_path_factory.mktemp("engine_job"), SPEC["partition"], (0, 1))


def summaries(job_inputs, out, engine=None) -> list[dict]:
    data, partitions = job_inputs
    train_job(SPEC, data, partitions, {s: out / f"seed{s}" for s in partitions}, None, device="cpu",
              log=lambda m: None, engine=engine)
    return [json.loads((out / f"seed{s}" / "summary.json").read_text()) for s in partitions]


def test_auto_on_a_cpu_records_the_unmeasured_sequential_choice_in_summary_json(job_inputs, tmp_path):
    for summary in summaries(job_inputs, tmp_path, {"mode": "auto", "side_by_side": 32}):
        assert summary["engine"] == {"mode": SEQUENTIAL, "clients_at_once": 1, "requested": "auto", "measured": False,
                                     "reason": summary["engine"]["reason"]}
        assert "not measured" in summary["engine"]["reason"]


def test_the_jobs_later_seeds_keep_the_first_seeds_measured_choice(job_inputs, tmp_path, monkeypatch):
    probed = []
    choice = EngineChoice(SIDE_BY_SIDE, 2, "measured", measured=True, sequential_s_per_step=0.5)

    def measure(run, rnd, w, sampled, cap):
        probed.append((run.seed, rnd))
        return choice

    monkeypatch.setattr(engine_choice, "measurable", lambda device: True)
    monkeypatch.setattr("fedrepro.sim.sync.measure", measure)
    assert [s["engine"] for s in summaries(job_inputs, tmp_path)] == [choice.summary()] * 2
    assert probed == [(0, 1)]
