"""Clients trained side by side (torch.func.vmap) give the sequential engine's results, for every method."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.common import dirichlet_clients
from support.side_by_side import CFG, run_with

from fedrepro.algorithms import ALGORITHMS

# Per step the two engines' gradients differ in their last bits (vmap's batched kernels sum in another order) and SGD
# amplifies that over steps, by how much depending on the CPU's kernel set; so the engines are compared in float64,
# where that drift stays tiny: max |w_vec - w_seq| over the eight methods below, 2 rounds, under this machine's
# AVX-512, AVX2 and SSE4.1 kernel sets (Makefile, KERNELS): 5.6e-17 in float64 (6.5e-7 in float32). TOLERANCE
# leaves a margin of 10^6 over it; a real difference (a wrong batch, a missed correction) is ~1e-3 or more.


TOLERANCE = {"atol": 1e-10, "rtol": 0}


FEDDISCO_METHODS = ["fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "fednova", "moon", "feddc"]


def test_every_feddisco_method_can_train_side_by_side():
    assert all(ALGORITHMS[name].vectorizable() for name in FEDDISCO_METHODS)


@pytest.mark.parametrize("algorithm", FEDDISCO_METHODS)
def test_side_by_side_equals_one_at_a_time(small_data64, algorithm):
    parts = dirichlet_clients(small_data64.y_train.numpy(), n_clients=5)  # ragged client sizes
    assert len({len(p) for p in parts}) > 1
    seq_run, seq = run_with(small_data64, parts, algorithm, "sequential")
    vec_run, vec = run_with(small_data64, parts, algorithm, "vectorized", width=3)  # groups of 3 and 1
    assert vec_run.vectorized and not seq_run.vectorized
    assert torch.allclose(vec_run.flat.w, seq_run.flat.w, **TOLERANCE)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-9)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
        assert a["bytes_up"] == b["bytes_up"] and a["bytes_down"] == b["bytes_down"]


def test_side_by_side_with_stragglers_and_disco_weights(small_data64):
    parts = dirichlet_clients(small_data64.y_train.numpy(), n_clients=4)
    cfg = dataclasses.replace(CFG, straggler_steps=[2, 7])
    disco = {"kind": "disco", "a": 0.5, "b": 0.1}
    seq_run, _ = run_with(small_data64, parts, "fednova", "sequential", cfg, disco)
    vec_run, _ = run_with(small_data64, parts, "fednova", "vectorized", cfg, disco)
    assert torch.allclose(vec_run.flat.w, seq_run.flat.w, **TOLERANCE)


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_side_by_side_drops_the_same_short_batches(small_data64, algorithm):
    parts = dirichlet_clients(small_data64.y_train.numpy(), n_clients=5)
    parts.append(parts[0][:7])  # fewer samples than one batch: one short step per epoch even so
    cfg = dataclasses.replace(CFG, drop_last=True)
    seq_run, seq = run_with(small_data64, parts, algorithm, "sequential", cfg)
    vec_run, vec = run_with(small_data64, parts, algorithm, "vectorized", cfg, width=4)
    assert torch.allclose(vec_run.flat.w, seq_run.flat.w, **TOLERANCE)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
    _, keep = run_with(small_data64, parts, algorithm, "sequential", dataclasses.replace(cfg, drop_last=False))
    assert keep.history[0]["train_loss"] != seq.history[0]["train_loss"]  # drop_last did change the batches


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "feddyn"])
def test_a_side_by_side_step_reads_nothing_back_from_the_device(small_data64, algorithm, monkeypatch):
    """Issue #51, item 1: the round's batches, masks and live lanes are built once, what the host counts it counts
    from the schedules, and the methods' corrections run batched; so no step calls .item(), int() or float() on a
    tensor (each a device-to-host wait on a GPU)."""
    from fedrepro.sim import vectorized

    parts = dirichlet_clients(small_data64.y_train.numpy(), n_clients=5)
    run, _ = run_with(small_data64, parts, algorithm, "vectorized", cfg=dataclasses.replace(CFG, rounds=1), width=3)
    w0 = run.flat.w.detach().clone()
    cids = [0, 1, 2]
    clients = [vectorized.Client(cid=c, round=2, w_start=w0, num_samples=len(run.clients[c])) for c in cids]
    schedules = [list(run.client_batches(c, 2)) for c in cids]  # drawn before: their generators are the host's
    reads = []

    def recording(name, real):
        def read(t, *args, **kwargs):
            reads.append(name)
            return real(t, *args, **kwargs)
        return read

    for name in ("item", "tolist", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, recording(name, getattr(torch.Tensor, name)))
    w, _, seen = vectorized.local_steps_side_by_side(run, clients, schedules, w0)
    monkeypatch.undo()
    assert reads == [] and w.shape == (3, w0.numel())
    assert seen == [sum(len(b) for b in s) for s in schedules]
    assert [c.steps for c in clients] == [len(s) for s in schedules]
