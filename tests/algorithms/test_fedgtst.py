"""FedGTST, FedSR and FedIIR, and the Jacobian statistics of FedGTST's Eq. 8: each against its defining
property (finite differences, a direct computation, FedAvg when switched off), and their state survives
a checkpoint."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients, history_rows, sync_run
from torch import nn

from fedrepro import seeding
from fedrepro.algorithms import build_algorithm
from fedrepro.algorithms.base import Client
from fedrepro.algorithms.fedgtst import guide_norm, loss_and_jacobian_norm, regularised_loss
from fedrepro.algorithms.fedsr import cmi_bound
from fedrepro.algorithms.jacobian import StreamingStats, cross_client_stats
from fedrepro.models import build_model
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.sync import FederatedRun, TrainingConfig
from fedrepro.sim.tensors import DeviceData

MODEL = "lenet5"
CFG = TrainingConfig(rounds=2, local_epochs=1, batch_size=32, lr=0.05, momentum=0.5, weight_decay=1e-4,
                     eval_every=1, checkpoint_every=1)
STAT_COLUMNS = ("jac_norm", "jac_var", "guide_norm")


make_run = partial(sync_run, cfg=CFG, model=MODEL)


metrics = history_rows


@pytest.fixture(scope="module")
def parts(small_data):
    return dirichlet_clients(small_data.y_train.numpy(), n_clients=4)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()


# ----- FedGTST's regulariser
def test_regulariser_gradient_matches_finite_differences():
    """d/dw [CE + xi (||dCE/dw|| - gamma)^2] by double backprop equals central differences of the loss."""
    model = tiny_model()
    x = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    xi, gamma = 0.7, 0.05
    params = list(model.parameters())
    analytic = torch.autograd.grad(regularised_loss(model, x, y, xi, gamma), params)
    eps = 1e-6
    for p, g in zip(params, analytic, strict=True):
        flat = p.data.view(-1)
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + eps
            up = regularised_loss(model, x, y, xi, gamma).item()
            flat[i] = old - eps
            down = regularised_loss(model, x, y, xi, gamma).item()
            flat[i] = old
            assert (up - down) / (2 * eps) == pytest.approx(g.view(-1)[i].item(), rel=1e-5, abs=1e-8)
    # and the regulariser really contributes (gamma far from the norm)
    plain = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    assert any(not torch.allclose(a, b) for a, b in zip(analytic, plain, strict=True))


def test_jacobian_norm_is_the_gradient_norm():
    model = tiny_model()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
    ce, norm = loss_and_jacobian_norm(model, x, y)
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    assert norm.item() == pytest.approx(torch.cat([g.reshape(-1) for g in grads]).norm().item(), rel=1e-12)


def test_xi_zero_is_fedavg_exactly(small_data, parts):
    avg = make_run(small_data, parts)
    gtst = make_run(small_data, parts, "fedgtst", {"xi": 0.0, "jac_stats": True})
    ra, rg = avg.run(), gtst.run()
    assert metrics(ra) == metrics(rg, drop=("seconds", *STAT_COLUMNS))
    assert torch.equal(avg.flat.w, gtst.flat.w)
    assert "guide_norm" not in rg.history[0] and "jac_norm" in rg.history[0]


def test_guide_norm_is_the_largest_reported_norm(small_data, parts):
    hp, cfg = {"xi": 1e-2, "vanilla_fraction": 0.5, "gamma0": 0.5}, dataclasses.replace(CFG, rounds=1)
    run = make_run(small_data, parts, "fedgtst", hp, cfg=cfg)
    alg = run.alg
    reported = {}
    receive = alg.server_receive

    def spy(cid, upload, weight):
        reported[cid] = upload["norm"].item()
        receive(cid, upload, weight)

    alg.server_receive = spy
    w0 = run.flat.w.clone()
    result = run.run()
    assert sorted(reported) == [0, 1, 2, 3]
    assert alg.state["gamma"].item() == max(reported.values())
    assert guide_norm([torch.tensor(1.0), torch.tensor(3.0), torch.tensor(2.0)]).item() == 3.0
    # each client reports ||J_k|| at the (regularised) model it sends, or, for the vanilla subset phi
    # (2 of 4 here), the larger of that and the norm at its plain-CE twin (FedAvg's client update)
    phi = alg.vanilla_clients(1)
    assert len(phi) == 2
    twin = make_run(small_data, parts, "fedgtst", hp, cfg=cfg)
    twin.alg.server_begin(w0, np.arange(4), np.full(4, 0.25))
    fedavg = make_run(small_data, parts, cfg=cfg)
    for cid, norm in reported.items():
        w_reg = w0 + twin.train_client(cid, 1, w0)[0]["delta"]
        expected = mean_minibatch_norm(run, w_reg, cid)
        if cid in phi:
            w_vanilla = w0 + fedavg.train_client(cid, 1, w0)[0]["delta"]
            assert not torch.allclose(w_vanilla, w_reg)
            expected = max(expected, mean_minibatch_norm(run, w_vanilla, cid))
        assert norm == pytest.approx(expected, rel=1e-5)
    # one scalar per client travels up, and the guide norm down (gamma_0 is given here)
    model_bytes = run.flat.numel * 4
    assert result.history[0]["bytes_up"] == 4 * (model_bytes + 4)
    assert result.history[0]["bytes_down"] == 4 * (model_bytes + 4)
    assert result.history[0]["guide_norm"] == pytest.approx(max(reported.values()))


def mean_minibatch_norm(run, w, cid, samples=512, net=None):
    """The surrogate norm written out: the mean gradient norm of the training-size minibatches of the
    client's (fixed) first ``samples`` samples, a short last batch left out."""
    from fedrepro.algorithms.jacobian import client_sample

    idx = client_sample(run.clients[cid], samples, run.seed, cid)
    size = run.cfg.batch_size
    net = net or build_model(MODEL, run.data.shape, run.data.num_classes)
    FlatModel(net).load(w)
    norms = []
    for start in range(0, len(idx) - size + 1 if len(idx) >= size else 1, size):
        b = idx[start : start + size]
        loss = F.cross_entropy(net(run.data.x_train[b]), run.data.y_train[b])
        norms.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(net.parameters()))]).norm())
    return float(torch.stack(norms).mean())


def test_regulariser_raises_the_norms_it_reports_towards_the_guide_norm():
    """Sec. 5: aligning the local norms with the guide norm (the largest reported one) raises them. The
    regulariser's expected pull (its gradient averaged over a client's minibatches) at the round's model
    moves each client's surrogate norm towards the guide norm, up for those below it, because the guide
    norm comes from the regulariser's own minibatch estimator. Random labels make minibatch norms far
    larger than full-data norms: a guide norm from full-data gradients sits below them all and pulls every
    client's norm down."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(240, 5, generator=gen)
    y = torch.randint(0, 3, (240,), generator=gen)
    data = DeviceData(x, y, x[:40].clone(), y[:40].clone(), 3)
    parts = np.array_split(np.arange(240), 4)

    def tiny_mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

    cfg = dataclasses.replace(CFG, rounds=1, batch_size=8, momentum=0.0, weight_decay=0.0)
    run = FederatedRun(tiny_mlp(), build_algorithm("fedgtst", xi=1.0), data, parts, cfg, {"kind": "equal"}, 0,
                       log=lambda m: None)
    run.run()  # round 1 trains unregularised; its reported norms set the guide norm
    w1, gamma = run.flat.w.clone(), run.alg.state["gamma"]
    before = [mean_minibatch_norm(run, w1, cid, net=tiny_mlp()) for cid in range(4)]
    after = []
    for cid in range(4):
        # the regulariser alone (the method's loss minus CE), averaged over the client's batches
        run.flat.load(w1)
        run.flat.zero_grad()
        batches = np.array_split(parts[cid], len(parts[cid]) // cfg.batch_size)
        for b in batches:
            xb, yb = x[b], y[b]
            client = Client(cid=cid, round=2, w_start=w1, num_samples=len(parts[cid]))
            penalty = run.alg.local_loss(run.model, xb, yb, client) - F.cross_entropy(run.model(xb), yb)
            (penalty / len(batches)).backward()
        after.append(mean_minibatch_norm(run, w1 - 0.05 * run.flat.g, cid, net=tiny_mlp()))
    # each norm moves towards gamma (the largest norm the clients reported, at their trained models) ...
    for b, a in zip(before, after, strict=True):
        assert (a - b) * (gamma.item() - b) > 0, (before, after, gamma.item())
    # ... which is above most of them at the averaged model: those rise (3 of 4 here; none, with a
    # full-data guide norm: 0.28 against minibatch norms of 0.50-0.64)
    assert sum(a > b for a, b in zip(after, before, strict=True)) >= 3, (before, after, gamma.item())


@pytest.mark.parametrize(("join_ratio", "vanilla_per_round"), [(0.1, 0.2), (0.5, 1.0), (1.0, 2.0)])
def test_vanilla_set_is_a_tenth_of_all_clients_whoever_takes_part(small_data, join_ratio, vanilla_per_round):
    """Alg. 1, line 1: phi is 10% of all K clients (2 of 20), drawn among [K]; a round's vanilla runs are
    the participants in phi, on average join_ratio * |phi| of them (the paper's 10% of the participants),
    not 10% of K drawn among the participants (every participant at 10% participation)."""
    parts = np.array_split(np.arange(len(small_data.y_train)), 20)
    run = make_run(small_data, parts, "fedgtst", {"xi": 1e-3},
                   cfg=dataclasses.replace(CFG, rounds=400, join_ratio=join_ratio))
    counts = []
    for rnd in range(1, 401):
        phi = run.alg.vanilla_clients(rnd)
        assert len(phi) == 2 and phi <= set(range(20))
        counts.append(len(phi & set(run.sample_clients(rnd).tolist())))
    assert np.mean(counts) == pytest.approx(vanilla_per_round, abs=0.1 * vanilla_per_round + 0.05)
    if join_ratio == 1.0:
        assert set(counts) == {2}
    # phi changes from round to round
    assert len({frozenset(run.alg.vanilla_clients(r)) for r in range(1, 401)}) > 20


def test_without_gamma0_round_one_trains_unregularised(small_data, parts):
    gtst = make_run(small_data, parts, "fedgtst", {"xi": 1e-2})
    avg = make_run(small_data, parts, "fedgtst", {"xi": 0.0})
    rg, ra = gtst.run(), avg.run()
    assert rg.history[0]["test_loss"] == ra.history[0]["test_loss"]  # round 1 yields gamma_1
    assert rg.history[1]["test_loss"] != ra.history[1]["test_loss"]  # then the regulariser is on
    assert rg.history[0]["bytes_down"] == 4 * gtst.flat.numel * 4  # nothing to broadcast yet
    assert rg.history[1]["bytes_down"] - rg.history[0]["bytes_down"] == 4 * (gtst.flat.numel * 4 + 4)
    fixed = make_run(small_data, parts, "fedgtst", {"xi": 1e-2, "gamma0": 0.5})
    assert fixed.run().history[0]["test_loss"] != ra.history[0]["test_loss"]  # gamma_0 given: on at once


# ----- the statistics of Eq. 8
def test_cross_client_statistics_equal_the_formula_on_a_toy_example():
    grads = torch.tensor([[1.0, 0.0, 2.0], [3.0, -1.0, 0.0], [-1.0, 1.0, 1.0]])
    mean = grads.numpy().mean(axis=0)
    norm = float(np.sqrt((mean**2).sum()))
    var = float(np.mean((grads.numpy() ** 2).sum(axis=1)) - (mean**2).sum())
    assert cross_client_stats(grads) == pytest.approx((norm, var), rel=1e-6)
    stream = StreamingStats()
    for g in grads:
        stream.add(g)
    assert stream.result() == pytest.approx({"jac_norm": norm, "jac_var": var}, rel=1e-6)
    # two equal clients: no variance; opposite clients: no mean
    assert cross_client_stats(torch.tensor([[1.0, 2.0], [1.0, 2.0]]))[1] == pytest.approx(0.0, abs=1e-6)
    assert cross_client_stats(torch.tensor([[1.0, 2.0], [-1.0, -2.0]])) == pytest.approx((0.0, 5.0))


def test_logged_statistics_equal_a_direct_computation(small_data, parts):
    """Round 1's jac_norm / jac_var: the participants' full-data CE gradients at the initial model."""
    cfg = dataclasses.replace(CFG, rounds=1, join_ratio=0.5)
    run = make_run(small_data, parts, "fedsr", {"jac_stats": True}, cfg=cfg)
    sampled = run.sample_clients(1).tolist()
    net = build_model(MODEL, small_data.shape, small_data.num_classes)
    FlatModel(net).load(run.flat.w.clone())
    grads = []
    for cid in sampled:
        idx = torch.as_tensor(parts[cid])
        loss = F.cross_entropy(net(small_data.x_train[idx]), small_data.y_train[idx])
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(net.parameters()))]))
    norm, var = cross_client_stats(torch.stack(grads).double())
    row = run.run().history[0]
    assert row["jac_norm"] == pytest.approx(norm, rel=1e-4)
    assert row["jac_var"] == pytest.approx(var, rel=1e-4)


# ----- FedIIR
def test_fediir_penalty_zero_is_fedavg_exactly(small_data, parts):
    avg, iir = make_run(small_data, parts), make_run(small_data, parts, "fediir", {"penalty": 0.0})
    assert metrics(avg.run()) == metrics(iir.run())
    assert torch.equal(avg.flat.w, iir.flat.w)


def test_fediir_aligns_classifier_gradients_with_their_weighted_mean(small_data, parts):
    cfg = dataclasses.replace(CFG, rounds=1)
    run = make_run(small_data, parts, "fediir", {"penalty": 0.1}, cfg=cfg)
    w0 = run.flat.w.clone()
    weights = run.weighting(run.sample_clients(1))
    run.alg.server_begin(w0, run.sample_clients(1), weights)
    head = run.alg._span
    expected = sum(float(p) * run.alg.client_gradient(w0, cid)[head] for cid, p in enumerate(weights))
    assert torch.allclose(run.alg.state["g_bar"], 0.05 * expected, atol=1e-7)  # the EMA's first step from 0
    assert head.stop == run.flat.numel and head.stop - head.start == 84 * 10 + 10  # LeNet's head
    # the local objective is CE + penalty ||g_head - g_bar||^2 (checked against a written-out version)
    x, y = small_data.x_train[:16], small_data.y_train[:16]
    loss = run.alg.local_loss(run.model, x, y, Client(cid=0, round=1, w_start=w0, num_samples=1))
    ce = F.cross_entropy(run.model(x), y)
    g = torch.autograd.grad(ce, [run.model.head.weight, run.model.head.bias])
    written = ce + 0.1 * (torch.cat([t.reshape(-1) for t in g]) - 0.05 * expected).pow(2).sum()
    assert loss.item() == pytest.approx(written.item(), rel=1e-6)
    result = make_run(small_data, parts, "fediir", {"penalty": 0.1}, cfg=cfg).run()
    head_bytes = (head.stop - head.start) * 4
    assert result.history[0]["bytes_up"] == 4 * (run.flat.numel * 4 + head_bytes)  # the model and a gradient


def test_fediir_global_gradient_is_a_moving_average_over_rounds(small_data, parts):
    """g_bar_p = 0.95 g_bar_{p-1} + 0.05 mean_p from g_bar_0 = 0 (the FedIIR code's EMA), mean_p the
    participants' uniformly weighted classifier gradients at round p's global model (the study's weights)."""
    cfg = dataclasses.replace(CFG, rounds=2, join_ratio=0.5)
    torch.manual_seed(seeding.derive_seed(0, seeding.INIT))
    net = build_model(MODEL, small_data.shape, small_data.num_classes)
    run = FederatedRun(net, build_algorithm("fediir", penalty=0.1), small_data, parts, cfg, {"kind": "equal"}, 0,
                       log=lambda m: None)
    alg, seen = run.alg, []
    begin = alg.server_begin

    def spy(w_global, sampled, weights):
        begin(w_global, sampled, weights)
        seen.append((w_global.clone(), np.asarray(sampled).tolist(), alg.state["g_bar"].clone()))

    alg.server_begin = spy
    run.run()
    head = alg._span
    means = [sum(alg.client_gradient(w, cid, 512)[head] for cid in sampled) / len(sampled)
             for w, sampled, _ in seen]
    assert seen[0][1] != seen[1][1] and not torch.equal(seen[0][0], seen[1][0])
    g1 = 0.05 * means[0]
    g2 = 0.95 * g1 + 0.05 * means[1]
    assert torch.allclose(seen[0][2], g1, atol=1e-7)
    assert torch.allclose(seen[1][2], g2, atol=1e-7)
    assert not torch.allclose(g2, 0.05 * means[1], atol=1e-7)  # round 1 still weighs in


# ----- FedSR
def test_fedsr_without_regularisers_is_fedavg_exactly(small_data, parts):
    avg, sr = make_run(small_data, parts), make_run(small_data, parts, "fedsr", {"l2r": 0.0, "cmi": 0.0})
    assert metrics(avg.run()) == metrics(sr.run())
    assert torch.equal(avg.flat.w, sr.flat.w)


def test_fedsr_cmi_bound_is_the_gaussian_kl():
    gen = torch.Generator().manual_seed(3)
    mu, sigma = torch.randn(6, 4, generator=gen), torch.rand(6, 4, generator=gen) + 0.1
    r_mu, r_sigma = torch.randn(6, 4, generator=gen), torch.rand(6, 4, generator=gen) + 0.2
    scale = torch.tensor(1.7)
    p = torch.distributions.Normal(mu * scale, sigma * scale)
    q = torch.distributions.Normal(r_mu, r_sigma)
    expected = torch.distributions.kl_divergence(p, q).sum(1).mean()
    assert cmi_bound(mu, sigma, r_mu, r_sigma, scale).item() == pytest.approx(expected.item(), rel=1e-5)


def test_fedsr_trains_and_averages_its_reference_distributions(small_data, parts):
    run = make_run(small_data, parts, "fedsr", {"l2r": 0.01, "cmi": 0.1}, cfg=dataclasses.replace(CFG, rounds=1))
    before = run.alg.state["extra"].clone()
    result = run.run()
    after = run.alg.views(run.alg.state["extra"])
    assert not torch.equal(before, run.alg.state["extra"])
    assert torch.isfinite(run.alg.state["extra"]).all() and after["r_mu"].abs().sum() > 0
    extra_bytes = before.numel() * 4
    assert result.history[0]["bytes_up"] == 4 * (run.flat.numel * 4 + extra_bytes)
    assert result.history[0]["bytes_down"] == 4 * (run.flat.numel * 4 + extra_bytes)


# ----- every method
@pytest.mark.parametrize(("algorithm", "hparams"), [
    ("fedgtst", {"xi": 1e-3, "jac_stats": True}),
    ("fedsr", {"jac_stats": True}),
    ("fediir", {"penalty": 1e-2, "jac_stats": True}),
])
def test_state_survives_a_checkpoint(small_data, parts, tmp_path, algorithm, hparams):
    cfg = dataclasses.replace(CFG, rounds=3, checkpoint_every=1, join_ratio=0.5)
    full = make_run(small_data, parts, algorithm, hparams, cfg=cfg).run()
    ckpt = tmp_path / "seed0.pt"
    make_run(small_data, parts, algorithm, hparams, cfg=dataclasses.replace(cfg, rounds=1)).run(ckpt, "fp")
    resumed = make_run(small_data, parts, algorithm, hparams, cfg=cfg)
    assert metrics(resumed.run(ckpt, "fp")) == metrics(full)


def test_bad_hyper_parameters_are_refused():
    # by the ranges their __init__ annotations declare (fedrepro.plugins), as the config check does
    with pytest.raises(ValueError, match="xi: must be >= 0, got -1.0"):
        build_algorithm("fedgtst", xi=-1.0)
    with pytest.raises(ValueError, match=r"params: 'body' is not one of \['head', 'all'\]"):
        build_algorithm("fediir", params="body")
    with pytest.raises(ValueError, match="ema: must be >= 0 and < 1, got 1.0"):
        build_algorithm("fediir", ema=1.0)
