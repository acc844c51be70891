"""FedDyn, FedDC and MOON: they reduce to FedAvg when switched off, their hooks follow the papers'
formulas (checked against autograd on the written-out local objective), and their state survives a
checkpoint."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients, history_rows, reference_local_training, sync_run

from fedrepro.algorithms import build_algorithm
from fedrepro.algorithms.base import Client
from fedrepro.algorithms.moon import maps_each_sample_alone
from fedrepro.models import build_model
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import evaluate

MODEL = "simple_cnn"
CFG = TrainingConfig(rounds=3, local_epochs=2, batch_size=16, lr=0.05, momentum=0.5, weight_decay=1e-4,
                     eval_every=1, checkpoint_every=1)


make_run = partial(sync_run, cfg=CFG, model=MODEL)


metrics = history_rows


def net_at(data, vector):
    net = build_model(MODEL, data.shape, data.num_classes)
    FlatModel(net).load(vector)  # the engine's vector layout
    return net


def reference_sgd(run, cid, rnd, w_start, extra):
    """The client's local training written out with torch.optim.SGD on CE + extra(w), by autograd."""
    cfg = run.cfg
    return reference_local_training(run, cid, rnd, w_start, lambda params: torch.optim.SGD(
        params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay), extra, model=MODEL)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: intra-op threads only add overhead, and spin badly on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def parts(small_data):
    return dirichlet_clients(small_data.y_train.numpy())


@pytest.fixture(scope="module")
def fedavg(small_data, parts):
    run = make_run(small_data, parts)
    return metrics(run.run()), run.flat.w.clone()


@pytest.mark.parametrize(("algorithm", "off", "on"), [
    ("feddyn", {"alpha": 0.0, "max_grad_norm": 0.0}, {"alpha": 0.1}),
    ("feddc", {"alpha": 0.0, "grad_correction": False, "max_grad_norm": 0.0}, {"alpha": 0.1}),
    ("moon", {"mu": 0.0}, {"mu": 1.0}),
])
def test_switched_off_equals_fedavg_exactly(small_data, parts, fedavg, algorithm, off, on):
    run = make_run(small_data, parts, algorithm, off)
    assert metrics(run.run()) == fedavg[0]
    assert torch.equal(run.flat.w, fedavg[1])
    assert all(not v for v in run.alg.state.values() if isinstance(v, dict))  # no per-client state either
    switched_on = make_run(small_data, parts, algorithm, on, cfg=dataclasses.replace(CFG, rounds=1))
    switched_on.run()
    assert not torch.allclose(switched_on.flat.w, fedavg[1])


def three_clients(data):
    return dirichlet_clients(data.y_train.numpy(), n_clients=3, beta=5.0)


def small_noise(run, scale=1e-2, seed=0):
    return scale * torch.randn(run.flat.numel, generator=torch.Generator().manual_seed(seed))


def test_feddyn_local_training_and_server_follow_the_formulas(small_data):
    alpha = 0.1
    run = make_run(small_data, three_clients(small_data), "feddyn", {"alpha": alpha, "max_grad_norm": 0.0})
    alg, w0 = run.alg, run.flat.w.clone()  # clipping: below
    grad_prev = small_noise(run)
    alg.state["grad"][0] = grad_prev.clone()

    up0 = run.train_client(0, 1, w0)[0]
    # local objective L_k(w) - <grad_k, w> + alpha/2 ||w - w_global||^2
    ref = reference_sgd(run, 0, 1, w0, lambda w: -(grad_prev @ w) + alpha / 2 * (w - w0).square().sum())
    assert torch.allclose(w0 + up0["delta"], ref, atol=1e-5)
    assert torch.allclose(alg.state["grad"][0], grad_prev - alpha * up0["delta"], atol=1e-7)

    up2 = run.train_client(2, 1, w0)[0]
    assert torch.allclose(alg.state["grad"][2], -alpha * up2["delta"])  # first participation: from zero
    # server: two of N = 3 clients, weights p = (0.7, 0.3)
    alg.server_begin(w0, np.array([0, 2]), np.array([0.7, 0.3]))
    alg.server_receive(0, up0, 0.7)
    alg.server_receive(2, up2, 0.3)
    w1 = alg.server_end(w0)
    h = -alpha / 3 * (up0["delta"] + up2["delta"])
    assert torch.allclose(alg.state["h"], h, atol=1e-7)
    assert torch.allclose(w1, w0 + 0.7 * up0["delta"] + 0.3 * up2["delta"] - h / alpha, atol=1e-6)


@pytest.mark.parametrize(("algorithm", "hparams"), [
    ("feddyn", {"alpha": 0.1}),
    ("feddc", {"alpha": 0.1, "grad_correction": False}),
])
def test_client_mean_tests_the_weighted_client_models_while_clients_train_from_the_server_model(
        small_data, algorithm, hparams):
    """FedDisco's code tests sum_k p_k w_k (its avg_model), not the server model w the clients train from."""
    run = make_run(small_data, three_clients(small_data), algorithm, {**hparams, "evaluate": "client_mean"})
    alg, w0 = run.alg, run.flat.w.clone()
    up0, up2 = run.train_client(0, 1, w0)[0], run.train_client(2, 1, w0)[0]
    alg.server_begin(w0, np.array([0, 2]), np.array([0.7, 0.3]))
    alg.server_receive(0, up0, 0.7)
    alg.server_receive(2, up2, 0.3)
    w1 = alg.server_end(w0)
    client_mean = w0 + 0.7 * up0["delta"] + 0.3 * up2["delta"]
    assert torch.allclose(alg.evaluated_model(w1), client_mean, atol=1e-6)
    assert not torch.allclose(w1, client_mean, atol=1e-4)  # the server's correction term is not tested

    cfg = dataclasses.replace(CFG, rounds=2)
    server = make_run(small_data, three_clients(small_data), algorithm, hparams, cfg=cfg)
    mean = make_run(small_data, three_clients(small_data), algorithm, {**hparams, "evaluate": "client_mean"},
                    cfg=cfg)
    by_server, by_mean = server.run().history, mean.run().history
    # the same training (clients start from the server model either way), another model tested
    assert [r["train_loss"] for r in by_server] == [r["train_loss"] for r in by_mean]
    assert [r["test_loss"] for r in by_server] != [r["test_loss"] for r in by_mean]
    assert torch.equal(mean.flat.w, mean.alg.state["client_mean"])  # the model left loaded is the tested one
    acc, loss, _ = evaluate(net_at(small_data, mean.alg.state["client_mean"]), small_data.x_test, small_data.y_test,
                            small_data.num_classes)
    assert by_mean[-1]["test_acc"] == pytest.approx(acc) and by_mean[-1]["test_loss"] == pytest.approx(loss)


@pytest.mark.parametrize("algorithm", ["feddyn", "feddc"])
def test_evaluated_model_choice_is_checked(algorithm):
    assert build_algorithm(algorithm).evaluate == "server"  # the papers' model by default
    with pytest.raises(ValueError, match=r"evaluate: 'average' is not one of \['server', 'client_mean'\]"):
        build_algorithm(algorithm, evaluate="average")


@pytest.mark.parametrize("grad_correction", [True, False])
def test_feddc_local_training_drift_and_server_follow_the_formulas(small_data, grad_correction):
    alpha, n = 0.1, 3
    parts = three_clients(small_data)
    hparams = {"alpha": alpha, "grad_correction": grad_correction, "max_grad_norm": 0.0}  # clipping: below
    run = make_run(small_data, parts, "feddc", hparams)
    alg, w0 = run.alg, run.flat.w.clone()
    h0, g0, g = small_noise(run, seed=1), small_noise(run, seed=2), small_noise(run, seed=3)
    alg.state["h"][0], alg.state["h_mean"] = h0.clone(), h0 / n
    alg.state["g_k"][0], alg.state["g"] = g0.clone(), g.clone()
    assert set(alg.download(0)) == ({"g"} if grad_correction else set())

    up0 = run.train_client(0, 1, w0)[0]
    corr = g - g0 if grad_correction else torch.zeros_like(g)
    ref = reference_sgd(run, 0, 1, w0, lambda w: alpha / 2 * (w + h0 - w0).square().sum() + corr @ w)
    d0 = up0["delta"]
    assert torch.allclose(w0 + d0, ref, atol=1e-5)
    assert torch.allclose(alg.state["h"][0], h0 + d0)  # the drift update
    steps = CFG.local_epochs * math.ceil(len(parts[0]) / CFG.batch_size)
    if grad_correction:
        g0_new = g0 - g - d0 / (CFG.lr * steps)
        assert torch.allclose(alg.state["g_k"][0], g0_new, atol=1e-6)
        assert torch.allclose(up0["g_diff"], g0_new - g0, atol=1e-6)
    else:
        assert set(up0) == {"delta"} and torch.equal(alg.state["g_k"][0], g0)  # g_k is never touched

    up2 = run.train_client(2, 1, w0)[0]
    d2 = up2["delta"]
    alg.server_begin(w0, np.array([0, 2]), np.array([0.7, 0.3]))
    alg.server_receive(0, up0, 0.7)
    alg.server_receive(2, up2, 0.3)
    w1 = alg.server_end(w0)
    h_mean = (h0 + d0 + d2) / n  # over all N clients; client 1 has no drift yet
    assert torch.allclose(w1, w0 + 0.7 * d0 + 0.3 * d2 + h_mean, atol=1e-6)
    if grad_correction:
        assert torch.allclose(alg.state["g"], g + (up0["g_diff"] + up2["g_diff"]) / n, atol=1e-6)


def test_feddc_clips_the_objectives_gradient_as_the_official_code(small_data, parts):
    run = make_run(small_data, parts, "feddc", {"alpha": 0.1, "max_grad_norm": 10.0})
    w0 = run.flat.w.clone()
    w, g = w0 + small_noise(run, 1.0, 1), small_noise(run, 1.0, 2)
    expected = (g + 0.1 * (w - w0)).clone().requires_grad_()
    expected.grad = expected.detach().clone()
    torch.nn.utils.clip_grad_norm_([expected], 10.0)
    run.alg.correct_grad(w, g, Client(cid=0, round=1, w_start=w0, num_samples=1))
    assert torch.allclose(g, expected.grad) and g.norm().item() == pytest.approx(10.0, rel=1e-5)


def test_feddyn_clips_as_the_official_code_before_its_weight_decay_adds_alpha_w(small_data, parts):
    """FedDyn's and FedDisco's code: clip_grad_norm_(10) on the gradient of CE - <grad_k, w> - alpha <w_glob, w>,
    then SGD's weight decay adds alpha w."""
    alpha = 0.1
    run = make_run(small_data, parts, "feddyn", {"alpha": alpha, "max_grad_norm": 10.0})
    w0 = run.flat.w.clone()
    w, g, grad_k = w0 + small_noise(run, 1.0, 1), small_noise(run, 1.0, 2), small_noise(run, 1.0, 3)
    run.alg.state["grad"][0] = grad_k
    clipped = (g - grad_k - alpha * w0).clone().requires_grad_()
    clipped.grad = clipped.detach().clone()
    torch.nn.utils.clip_grad_norm_([clipped], 10.0)
    assert (g - grad_k - alpha * w0).norm() > 10  # the clipping acts
    run.alg.correct_grad(w, g, Client(cid=0, round=1, w_start=w0, num_samples=1))
    assert torch.allclose(g, clipped.grad + alpha * w, atol=1e-6)


def test_feddc_without_gradient_correction_is_feddyn(small_data64, parts):
    """Same local gradient (alpha (w - w_glob + h_k) = alpha (w - w_glob) - grad_k) and server step. The two sum in
    other orders, so their 3 rounds of 2 epochs drift apart by rounding: in float32 by 4e-7 to 1.7e-2 depending on
    the CPU's kernels (max |w_FedDC - w_FedDyn| under this machine's AVX-512, AVX2 and SSE4.1 kernel sets:
    1.2e-4, 4.0e-7, 1.7e-2), in float64 by at most 2.8e-16 under the same three; 1e-9 leaves a margin of 10^6
    and is still far below any real difference of the methods."""
    dc = make_run(small_data64, parts, "feddc", {"alpha": 0.1, "grad_correction": False, "max_grad_norm": 0.0})
    dyn = make_run(small_data64, parts, "feddyn", {"alpha": 0.1, "max_grad_norm": 0.0})
    dc.run()
    dyn.run()
    assert dc.flat.w.dtype == torch.float64
    assert torch.allclose(dc.flat.w, dyn.flat.w, rtol=0, atol=1e-9)


def test_moon_contrastive_term_matches_a_direct_computation(small_data, parts):
    mu, temperature = 0.5, 0.5
    run = make_run(small_data, parts, "moon", {"mu": mu, "temperature": temperature})
    alg, w_glob = run.alg, run.flat.w.clone()
    w_local, w_prev = w_glob + small_noise(run, 0.05, 1), w_glob + small_noise(run, 0.05, 2)
    x, y = small_data.x_train[:8], small_data.y_train[:8]
    client = Client(cid=0, round=2, w_start=w_glob, num_samples=8)
    run.flat.load(w_local)

    def hook_term():
        with torch.no_grad():
            return ((alg.local_loss(run.model, x, y, client) - F.cross_entropy(run.model(x), y)) / mu).item()

    # first participation: prev = global, so l_con = log 2 whatever the local features
    assert hook_term() == pytest.approx(math.log(2), abs=1e-6)

    alg.state["prev"][0] = w_prev
    with torch.no_grad():
        z, zg, zp = (net_at(small_data, v).body(x) for v in (w_local, w_glob, w_prev))
        cos = torch.nn.CosineSimilarity(dim=-1)
        pos, neg = torch.exp(cos(z, zg) / temperature), torch.exp(cos(z, zp) / temperature)
        direct = (-torch.log(pos / (pos + neg))).mean().item()
    assert hook_term() == pytest.approx(direct, rel=1e-5)
    assert abs(direct - math.log(2)) > 1e-4
    run.flat.check_bound()  # evaluating other vectors left the model's own parameters bound


def test_moon_keeps_each_clients_previous_local_model(small_data, parts):
    run = make_run(small_data, parts, "moon", {"mu": 1.0}, cfg=dataclasses.replace(CFG, join_ratio=0.5))
    w0 = run.flat.w.clone()
    run.train_client(1, 1, w0)
    assert set(run.alg.state["prev"]) == {1}
    w_end = run.flat.w.clone()
    assert torch.equal(run.alg.state["prev"][1], w_end)  # a copy, not a view of the model
    run.train_client(1, 2, w0)
    with_prev = run.flat.w.clone()
    assert torch.equal(run.alg.state["prev"][1], with_prev)
    del run.alg.state["prev"][1]  # as if round 2 were its first participation: prev = global
    run.train_client(1, 2, w0)
    assert not torch.allclose(run.flat.w, with_prev)  # so round 2 did contrast with the round-1 model

    fresh = make_run(small_data, parts, "moon", {"mu": 1.0}, cfg=dataclasses.replace(CFG, join_ratio=0.5))
    fresh.run()
    sampled = set().union(*(fresh.sample_clients(r).tolist() for r in range(1, CFG.rounds + 1)))
    assert set(fresh.alg.state["prev"]) == sampled


def test_moon_computes_a_samples_frozen_features_once_per_local_training(small_data, parts):
    """The global and previous vectors stay fixed while a client trains: with a per-sample body each sample's
    z_glob and z_prev are computed in its first epoch only, and the training is the one that recomputes them."""
    run = make_run(small_data, parts, "moon", {"mu": 1.0}, cfg=dataclasses.replace(CFG, local_epochs=3))
    alg, w0 = run.alg, run.flat.w.clone()
    forwarded = []
    compute = alg.features
    alg.features = lambda model, vector, x: forwarded.append(len(x)) or compute(model, vector, x)
    alg.state["prev"][1] = w0 + small_noise(run, 0.05, 1)
    run.train_client(1, 2, w0)
    cached = run.flat.w.clone()
    assert sum(forwarded) == 2 * len(run.clients[1])  # z_glob and z_prev of each sample, once
    assert alg.body_per_sample
    assert len(alg.frozen.tables["glob"][0]) == len(run.clients[1])  # a row per sample of the client's, no more

    forwarded.clear()
    alg.state["prev"][1] = w0 + small_noise(run, 0.05, 2)  # the same client and round again, a new prev:
    run.train_client(1, 2, w0)  # nothing of the last training is reused
    assert sum(forwarded) == 2 * len(run.clients[1])
    again = run.flat.w.clone()

    alg.body_per_sample = False  # as for a body with BatchNorm or dropout: recomputed in every batch
    forwarded.clear()
    alg.state["prev"][1] = w0 + small_noise(run, 0.05, 1)
    run.train_client(1, 2, w0)
    assert sum(forwarded) == 3 * 2 * len(run.clients[1])
    assert torch.allclose(run.flat.w, cached, atol=1e-6)
    assert not torch.allclose(again, cached, atol=1e-4)


def test_per_sample_bodies_are_told_apart_from_batch_mixing_ones():
    conv = [torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU()]
    assert maps_each_sample_alone(torch.nn.Sequential(*conv, torch.nn.GroupNorm(2, 4)))
    assert not maps_each_sample_alone(torch.nn.Sequential(*conv, torch.nn.BatchNorm2d(4)))
    assert not maps_each_sample_alone(torch.nn.Sequential(*conv, torch.nn.Dropout2d(0.1)))
    assert maps_each_sample_alone(build_model("simple_cnn", (28, 28, 1), 10).body)
    assert maps_each_sample_alone(build_model("resnet18_gn", (32, 32, 3), 10).body)  # GroupNorm: per sample


@pytest.mark.parametrize(("algorithm", "hparams", "state_key"), [
    ("feddyn", {"alpha": 0.1}, "grad"),
    ("feddyn", {"alpha": 0.1, "evaluate": "client_mean"}, "grad"),
    ("feddc", {"alpha": 0.1}, "g_k"),
    ("moon", {"mu": 1.0}, "prev"),
])
def test_resumes_from_a_checkpoint_to_identical_metrics(small_data, parts, tmp_path, algorithm, hparams,
                                                        state_key):
    cfg = dataclasses.replace(CFG, rounds=4, join_ratio=0.5)
    full = make_run(small_data, parts, algorithm, hparams, cfg=cfg)
    expected = metrics(full.run())

    ckpt = tmp_path / "seed0.pt"
    make_run(small_data, parts, algorithm, hparams, cfg=dataclasses.replace(cfg, rounds=2)).run(ckpt, "fp")
    assert torch.load(ckpt, weights_only=False)["state"][state_key]  # per-client state is in the checkpoint
    resumed = make_run(small_data, parts, algorithm, hparams, cfg=cfg)  # a fresh process, in effect
    logs = []
    resumed.log = logs.append
    assert metrics(resumed.run(ckpt, "fp")) == expected
    assert any("after round 2" in m for m in logs)
    assert torch.equal(resumed.flat.w, full.flat.w)
