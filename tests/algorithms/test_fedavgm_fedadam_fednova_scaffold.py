"""FedAvgM, FedAdam, FedNova and SCAFFOLD: each against its defining property, checked by hand from client deltas."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import numpy as np
import pytest
import torch
from support.common import dirichlet_clients, history_rows, sync_run

from fedrepro.algorithms import build_algorithm
from fedrepro.algorithms.base import Client
from fedrepro.algorithms.fednova import a_norm
from fedrepro.sim.sync import TrainingConfig

CFG = TrainingConfig(rounds=2, local_epochs=1, batch_size=16, lr=0.05, momentum=0.5, weight_decay=1e-4,
                     eval_every=1, checkpoint_every=1)


make_run = partial(sync_run, cfg=CFG, model="simple_cnn")


metrics = history_rows


def size_weights(parts):
    sizes = np.array([len(p) for p in parts], dtype=np.float64)
    return sizes / sizes.sum()


def local_deltas(data, parts, rnd, w, cfg=CFG):
    """Every client's plain local update from ``w`` (FedAvg's client side, the same batches)."""
    helper = make_run(data, parts, cfg=cfg)
    return [helper.train_client(cid, rnd, w)[0]["delta"] for cid in range(len(parts))]


def steps(part, cfg=CFG):
    return cfg.local_epochs * math.ceil(len(part) / cfg.batch_size)


@pytest.fixture(scope="module")
def parts(small_data):
    return dirichlet_clients(small_data.y_train.numpy(), n_clients=3)


# ----- FedAvgM
def test_fedavgm_with_beta_zero_is_fedavg(small_data, parts):
    avg, avgm = make_run(small_data, parts), make_run(small_data, parts, "fedavgm", {"beta": 0.0})
    assert metrics(avg.run()) == metrics(avgm.run())
    assert torch.equal(avg.flat.w, avgm.flat.w)


def test_fedavgm_applies_server_momentum(small_data, parts):
    beta, lr_s = 0.5, 0.7
    run = make_run(small_data, parts, "fedavgm", {"beta": beta, "server_lr": lr_s})
    w0 = run.flat.w.clone()
    p = size_weights(parts)

    def average(rnd, w):
        return sum(float(pk) * d for pk, d in zip(p, local_deltas(small_data, parts, rnd, w), strict=True))

    v1 = average(1, w0)
    w1 = w0 + lr_s * v1
    v2 = beta * v1 + average(2, w1)
    w2 = w1 + lr_s * v2
    run.run()
    assert torch.allclose(run.alg.state["v"], v2, atol=1e-6)
    assert torch.allclose(run.flat.w, w2, atol=1e-6)


# ----- FedAdam
def test_fedadam_applies_adam_to_the_mean_update_on_the_server(small_data, parts):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    run = make_run(small_data, parts, "fedadam", {"eta": eta, "beta1": b1, "beta2": b2, "tau": tau})
    w0 = run.flat.w.clone()
    p = size_weights(parts)

    def average(rnd, w):
        return sum(float(pk) * d for pk, d in zip(p, local_deltas(small_data, parts, rnd, w), strict=True))

    m, v, w = torch.zeros_like(w0), torch.zeros_like(w0), w0
    for rnd in (1, 2):  # Reddi et al.'s Algorithm 2, written out
        delta = average(rnd, w)
        m = b1 * m + (1 - b1) * delta
        v = b2 * v + (1 - b2) * delta**2
        w = w + eta * m / (v.sqrt() + tau)
    run.run()
    assert torch.allclose(run.alg.state["m"], m, atol=1e-7) and torch.allclose(run.alg.state["v"], v, atol=1e-9)
    assert torch.allclose(run.flat.w, w, atol=1e-5)


def test_fedadams_first_step_moves_every_coordinate_by_about_eta_times_one_minus_beta1(small_data, parts):
    # m = (1 - b1) d, v = (1 - b2) d^2: each step is eta (1 - b1) / sqrt(1 - b2) * sign(d) where |d| >> tau
    eta, b1, b2 = 0.01, 0.9, 0.99
    run = make_run(small_data, parts, "fedadam", {"eta": eta, "beta1": b1, "beta2": b2, "tau": 1e-12},
                   cfg=dataclasses.replace(CFG, rounds=1))
    w0 = run.flat.w.clone()
    run.run()
    step = (run.flat.w - w0).abs()
    expected = eta * (1 - b1) / (1 - b2) ** 0.5
    # every coordinate that moved, up to float32's rounding of w0 + step (and a few where d^2 underflows)
    moved = step[step > 0]
    assert ((moved - expected).abs() <= 1e-2 * expected).float().mean() > 0.99
    assert moved.max() <= expected * 1.01


# ----- FedNova
def test_fednova_a_norm_is_the_l1_norm_of_the_momentum_weights():
    for tau, rho in [(1, 0.9), (7, 0.5), (40, 0.9), (13, 0.0)]:
        # gradient t (1-based) enters every later step through the buffer: sum_j rho^j, j < tau - t + 1
        brute = sum(sum(rho**j for j in range(tau - t + 1)) for t in range(1, tau + 1))
        assert a_norm(tau, rho) == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_fednova_with_equal_steps_is_fedavg(small_data, momentum):
    """Equal step counts: ||a_k||_1 cancels, with momentum too, so the normaliser FedDisco's code uses
    (n_k // B, momentum ignored) and ours give the same update (NIID-2's equal clients)."""
    iid = np.array_split(np.random.default_rng(0).permutation(len(small_data.y_train)), 4)
    cfg = dataclasses.replace(CFG, momentum=momentum)
    avg, nova = make_run(small_data, iid, cfg=cfg), make_run(small_data, iid, "fednova", cfg=cfg)
    for ra, rn in zip(metrics(avg.run()), metrics(nova.run()), strict=True):
        assert ra["test_acc"] == pytest.approx(rn["test_acc"], abs=1e-9)
        assert ra["test_loss"] == pytest.approx(rn["test_loss"], rel=1e-5)
    assert torch.allclose(avg.flat.w, nova.flat.w, atol=1e-6)


def test_fednova_with_unequal_steps_normalises_by_hand_formula(small_data, parts):
    cfg = dataclasses.replace(CFG, rounds=1)
    taus = [steps(part) for part in parts]
    assert len(set(taus)) > 1
    run = make_run(small_data, parts, "fednova", cfg=cfg)
    w0 = run.flat.w.clone()
    p, rho = size_weights(parts), cfg.momentum
    norms = [(t - rho * (1 - rho**t) / (1 - rho)) / (1 - rho) for t in taus]
    tau_eff = sum(pk * a for pk, a in zip(p, norms, strict=True))
    deltas = local_deltas(small_data, parts, 1, w0, cfg)
    expected = w0 + tau_eff * sum(float(pk / a) * d for pk, a, d in zip(p, norms, deltas, strict=True))
    result = run.run()
    assert torch.allclose(run.flat.w, expected, atol=1e-6)
    fedavg = w0 + sum(float(pk) * d for pk, d in zip(p, deltas, strict=True))
    assert (run.flat.w - fedavg).abs().max() > 1e-4  # really not FedAvg
    assert result.history[0]["bytes_up"] == len(parts) * (run.flat.numel + 1) * 4  # + one float for ||a||


# ----- SCAFFOLD
def test_scaffold_first_round_is_fedavg_and_second_is_not(small_data, parts):
    avg, scaf = make_run(small_data, parts), make_run(small_data, parts, "scaffold")
    ra, rs = metrics(avg.run()), metrics(scaf.run())
    assert ra[0]["test_acc"] == rs[0]["test_acc"] and ra[0]["test_loss"] == rs[0]["test_loss"]
    assert ra[1]["test_loss"] != rs[1]["test_loss"]
    one = dataclasses.replace(CFG, rounds=1)
    avg1, scaf1 = make_run(small_data, parts, cfg=one), make_run(small_data, parts, "scaffold", cfg=one)
    avg1.run(), scaf1.run()
    assert torch.equal(avg1.flat.w, scaf1.flat.w)


def test_scaffold_control_variates_follow_option_two(small_data):
    """4 clients, 2 sampled: c_k = (w0 - w_k)/(K lr) from zero variates, c = (1/N) sum_S delta c_k;
    then in round 2 c_k+ = c_k - c + (w1 - w_end)/(K lr) with the non-zero variates of round 1."""
    parts4 = dirichlet_clients(small_data.y_train.numpy(), n_clients=4, beta=5.0)
    cfg = dataclasses.replace(CFG, rounds=1, join_ratio=0.5)
    run = make_run(small_data, parts4, "scaffold", cfg=cfg)
    sampled = run.sample_clients(1).tolist()
    w0 = run.flat.w.clone()
    deltas = local_deltas(small_data, parts4, 1, w0, cfg)
    ck = {cid: -deltas[cid] / (steps(parts4[cid]) * cfg.lr) for cid in sampled}
    result = run.run()
    state = run.alg.state
    assert sorted(state["c_local"]) == sampled
    for cid in sampled:
        assert torch.allclose(state["c_local"][cid], ck[cid], atol=1e-6)
    assert torch.allclose(state["c"], sum(ck.values()) / 4, atol=1e-6)  # |S|/N times the mean
    model_bytes = run.flat.numel * 4
    assert result.history[0]["bytes_up"] == 2 * 2 * model_bytes  # delta_w and delta_c
    assert result.history[0]["bytes_down"] == 2 * 2 * model_bytes  # the model and c

    cid, w1 = sampled[0], run.flat.w.clone()
    c_old, ck_old = state["c"].clone(), state["c_local"][cid].clone()
    upload, _, _ = run.train_client(cid, 2, w1)
    expected = ck_old - c_old - upload["delta"] / (steps(parts4[cid]) * cfg.lr)
    assert torch.allclose(state["c_local"][cid], expected, atol=1e-6)
    assert torch.allclose(upload["delta_c"], expected - ck_old, atol=1e-6)


def test_scaffold_from_one_common_random_start_is_a_zero_start_only_with_full_participation(small_data):
    """FedDisco's code starts c and every c_k at the same random weights R: with every client sampled
    that is a zero start (up to rounding); with partial participation R leaks into the corrections until
    every client has been sampled once."""
    parts4 = dirichlet_clients(small_data.y_train.numpy(), n_clients=4, beta=5.0)

    def final_model(join_ratio, start=None):
        run = make_run(small_data, parts4, "scaffold", cfg=dataclasses.replace(CFG, rounds=3, join_ratio=join_ratio))
        if start is not None:
            run.alg.state["c"] = start.clone()
            run.alg.state["c_local"] = {cid: start.clone() for cid in range(4)}
        run.run()
        return run.flat.w

    start = 0.1 * torch.randn(make_run(small_data, parts4).flat.numel, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(final_model(1.0, start), final_model(1.0), atol=1e-5)
    assert not torch.allclose(final_model(0.5, start), final_model(0.5), atol=1e-3)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_correction_moves_each_step_by_lr_times_c_minus_ck(momentum):
    """Whatever the local momentum, the correction alone shifts w by -lr (c - c_k) at every step."""
    alg = build_algorithm("scaffold")
    alg.training = dataclasses.replace(CFG, momentum=momentum)
    alg.state = {"c": torch.tensor([1.0, -2.0]), "c_local": {0: torch.tensor([0.5, 0.5])}}
    client, buf = Client(cid=0, round=1, w_start=torch.zeros(2), num_samples=1), None
    for _ in range(6):  # the engine's momentum step with a zero loss gradient
        g = torch.zeros(2)
        alg.correct_grad(torch.zeros(2), g, client)
        buf = g.clone() if buf is None else buf.mul_(momentum).add_(g)
        assert torch.allclose(buf, torch.tensor([0.5, -2.5]))
        client.steps += 1


# ----- every method
@pytest.mark.parametrize("algorithm", ["fedavgm", "fedadam", "fednova", "scaffold"])
def test_state_survives_a_checkpoint(small_data, parts, tmp_path, algorithm):
    cfg = dataclasses.replace(CFG, rounds=3, checkpoint_every=1)
    full = make_run(small_data, parts, algorithm, cfg=cfg).run()

    ckpt = tmp_path / "seed0.pt"
    make_run(small_data, parts, algorithm, cfg=dataclasses.replace(cfg, rounds=1)).run(ckpt, "fp")
    assert torch.load(ckpt, weights_only=False)["round"] == 1
    resumed = make_run(small_data, parts, algorithm, cfg=cfg)
    assert metrics(resumed.run(ckpt, "fp")) == metrics(full)
