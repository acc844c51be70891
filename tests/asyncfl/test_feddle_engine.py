"""The asynchronous engine (fedrepro.asyncfl): half-normal seeded delays, no re-sampling while in flight, stale
updates, the in-domain server set carved from the test set, FedBuff = FedAvg without delays, and resume."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from support.asyncfl import comparable, equal_parts, make_run, preempt_at_round_3
from support.common import digits_cut

from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun, draw_delay
from fedrepro.asyncfl.methods import build_method
from fedrepro.models import build_model
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import evaluate

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data8(digits_prepared):
    """Digits at their native 8x8, 300 train / 200 test samples: a tiny, fast, real task."""
    return digits_cut(digits_prepared, 300, 200, image_size=8)


def test_delays_are_seeded_half_normal_draws():
    draws = np.array([draw_delay(3, r, c, 5.0) for r in range(1, 201) for c in range(20)])
    assert draws.min() >= 0 and np.all(draws == np.round(draws))
    # E|x| = sigma sqrt(2/pi) for x ~ N(0, sigma^2); rounding to whole rounds keeps the mean within ~0.1
    assert abs(draws.mean() - 5.0 * math.sqrt(2 / math.pi)) < 0.25
    assert abs(np.median(draws) - 5.0 * 0.6745) < 0.6  # the half-normal's median, sigma * 0.6745
    assert draw_delay(3, 7, 2, 5.0) == draw_delay(3, 7, 2, 5.0)
    assert [draw_delay(3, r, 0, 20.0) for r in range(50)] != [draw_delay(4, r, 0, 20.0) for r in range(50)]
    assert all(draw_delay(3, r, 0, 0.0) == 0 for r in range(20))


def test_no_client_is_resampled_while_in_flight_and_staleness_is_its_delay(data8):
    run = make_run(data8, "fedavg", rounds=15, sigma=4.0, join=0.3)
    sent, arrived = {}, []
    sample = run.sample_clients

    def recording_sample(rnd, busy):
        out = sample(rnd, busy)
        sent[rnd] = (set(busy), out)
        return out

    def recording_update(cid, dispatch_round, w_start, rnd, b_start=None):
        arrived.append((cid, dispatch_round, rnd))
        return type(run).client_update(run, cid, dispatch_round, w_start, rnd, b_start)

    run.sample_clients, run.client_update = recording_sample, recording_update
    run.run()
    for rnd, (busy, out) in sent.items():
        assert not busy & set(out), f"round {rnd} re-sampled clients in flight"
        assert len(out) == min(3, 10 - len(busy))
    for cid, dispatch_round, rnd in arrived:
        assert rnd - dispatch_round == draw_delay(0, dispatch_round, cid, 4.0)
    # every client's dispatches are separated by its arrival: it is never sent a model while it trains
    for cid in range(10):
        trips = sorted((d, d + draw_delay(0, d, cid, 4.0)) for d, (_, out) in sent.items() if cid in out)
        assert all(nxt[0] > prev[1] for prev, nxt in zip(trips, trips[1:], strict=False))
    assert any(rnd > d for _, d, rnd in arrived), "no stale update in 15 rounds: the test proves nothing"


def test_in_domain_server_set_is_carved_from_the_test_set(data8):
    run = make_run(data8, "fedft")
    assert len(run.server_y) == 50 and len(run.data.y_test) == 150
    rows = {tuple(x.flatten().tolist()) for x in data8.x_test}
    server = {tuple(x.flatten().tolist()) for x in run.server_x}
    test = {tuple(x.flatten().tolist()) for x in run.data.x_test}
    assert server <= rows and test <= rows and not server & test


def test_fedbuff_equals_fedavg_without_delays_and_a_buffer_of_one_round(data8):
    # equal client sizes: FedAvg's sample-size weights are then FedBuff's plain mean
    runs = [make_run(data8, "fedavg"), make_run(data8, "fedbuff", {"buffer_size": 3, "server_lr": 1.0})]
    results = [r.run() for r in runs]
    torch.testing.assert_close(runs[0].flat.w, runs[1].flat.w, rtol=1e-5, atol=1e-6)
    assert [h["test_acc"] for h in results[0].history] == [h["test_acc"] for h in results[1].history]
    # and a buffer of two rounds is not the same run
    other = make_run(data8, "fedbuff", {"buffer_size": 6})
    other.run()
    assert not torch.allclose(other.flat.w, runs[0].flat.w)


def test_feddle_with_a_huge_fallback_lambda_is_fedbuff(data8):
    # Feddle's searched c stays at its FedBuff initialisation when lambda dominates the search
    feddle = make_run(data8, "feddle", {"fallback_lambda": 1e9, "lr": 0.1, "epochs": 2, "batch_size": 10}, rounds=3)
    fedbuff = make_run(data8, "fedbuff", {"buffer_size": 3}, rounds=3)
    feddle.run()
    fedbuff.run()
    torch.testing.assert_close(feddle.flat.w, fedbuff.flat.w, rtol=1e-4, atol=1e-5)
    free = make_run(data8, "feddle", {"fallback_lambda": 0.0, "lr": 0.1, "epochs": 2, "batch_size": 10}, rounds=3)
    free.run()
    assert not torch.allclose(free.flat.w, fedbuff.flat.w, atol=1e-4)


@pytest.mark.parametrize("method,hparams", [("feddle", {"lr": 0.01}), ("ca2fl", {"buffer_size": 2})])
def test_a_stopped_run_resumes_to_the_same_metrics(data8, tmp_path, method, hparams):
    full = make_run(data8, method, hparams, rounds=8, sigma=3.0, checkpoint_every=2).run()
    ckpt = tmp_path / "seed0.pt"

    preempt_at_round_3(lambda log: make_run(data8, method, hparams, rounds=8, sigma=3.0, checkpoint_every=2,
                                            log=log), ckpt)
    resumed = make_run(data8, method, hparams, rounds=8, sigma=3.0, checkpoint_every=2).run(ckpt, "fp")
    assert comparable(resumed) == comparable(full)


def test_center_samples_no_client_and_trains_on_server_data(data8):
    run = make_run(data8, "center", {"epochs": 20, "lr": 0.01}, rounds=2)
    run.sample_clients = lambda rnd, busy: pytest.fail("Center sampled clients")
    run.flat.load(run.w_init)
    untrained = evaluate(run.model, run.data.x_test, run.data.y_test)[0]
    result = run.run()
    assert result.history[-1]["bytes_up"] == 0 and result.history[-1]["test_acc"] > untrained + 20.0


def test_out_of_domain_methods_need_an_out_of_domain_set(data8):
    with pytest.raises(ValueError, match="ood_dataset"):
        make_run(data8, "feddle", {"server_data": "out_of_domain"})


def test_server_cost_counts_server_flops_and_the_state_the_server_keeps(data8):
    def last_row(method, hparams=None):
        run = make_run(data8, method, hparams, rounds=4, sigma=1.0)
        run.asyn = dataclasses.replace(run.asyn, measure_cost=True)
        return run, run.run().history[-1]

    model_mb = None
    rows = {}
    for method, hparams in [("fedavg", None), ("fedbuff", {"buffer_size": 100}), ("ca2fl", {"buffer_size": 100}),
                            ("fedft", None), ("feddle", None)]:
        run, rows[method] = last_row(method, hparams)
        model_mb = run.flat.numel * 4 / 1e6
        if method == "ca2fl":
            cached = len(run.method.state["cache"])
            assert cached > 0
            # the global model, every cached client update, the cache sum, the calibration sum and h^t
            assert rows[method]["cache_mb"] == pytest.approx((cached + 4) * model_mb)
        if method == "feddle":
            assert rows[method]["cache_mb"] == pytest.approx((1 + len(run.method.state["anchors"])) * model_mb)
    assert rows["fedavg"]["cache_mb"] == pytest.approx(model_mb)
    assert rows["fedbuff"]["cache_mb"] == pytest.approx(2 * model_mb)  # the model and its buffer
    # averaging is element-wise arithmetic (not counted); training on the server data is
    assert rows["fedavg"]["server_gflops"] == 0.0 and rows["fedbuff"]["server_gflops"] == 0.0
    assert rows["fedft"]["server_gflops"] > 0 and rows["feddle"]["server_gflops"] > 0
    assert "server_gflops" not in make_run(data8, "fedavg", rounds=1).run().history[-1]


def test_a_batchnorm_model_resumes_with_its_running_statistics(data8, tmp_path):
    """BatchNorm's running statistics are buffers, not parameters: the flat vector does not hold them, so the
    checkpoint must (ImageNet-pretrained ResNet18 at paper scale); a resumed run equals an uninterrupted one."""
    def bn_model():
        c = data8.shape[2]
        return torch.nn.Sequential(torch.nn.Conv2d(c, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * data8.shape[0] * data8.shape[1], 10))

    full_run = make_run(data8, "fedavg", rounds=6, sigma=2.0, checkpoint_every=2, model_fn=bn_model)
    full = full_run.run()
    assert float(full_run.model[1].num_batches_tracked) > 0
    ckpt = tmp_path / "seed0.pt"

    preempt_at_round_3(lambda log: make_run(data8, "fedavg", rounds=6, sigma=2.0, checkpoint_every=2,
                                            model_fn=bn_model, log=log), ckpt)
    again = make_run(data8, "fedavg", rounds=6, sigma=2.0, checkpoint_every=2, model_fn=bn_model)
    resumed = again.run(ckpt, "fp")
    assert comparable(resumed) == comparable(full)
    torch.testing.assert_close(again.model[1].running_mean, full_run.model[1].running_mean)


def test_cache_counts_the_frozen_parameters_the_server_holds(data8):
    """A LoRA model's server holds the frozen backbone too (the paper's Table 6: the whole ViT, 340 MB)."""
    def half_frozen():
        model = build_model("cnn3_small", data8.shape, data8.num_classes)
        for p in list(model.parameters())[:2]:
            p.requires_grad_(False)
        return model

    run = make_run(data8, "fedavg", rounds=2, model_fn=half_frozen)
    run.asyn = dataclasses.replace(run.asyn, measure_cost=True)
    frozen = sum(p.numel() for p in run.model.parameters() if not p.requires_grad)
    assert frozen > 0 and run.flat.numel > 0
    assert run.run().history[-1]["cache_mb"] == pytest.approx((run.flat.numel + frozen) * 4 / 1e6)


def with_true_update(run: AsyncRun) -> AsyncRun:
    run.asyn = dataclasses.replace(run.asyn, true_update=True)
    return run


def test_true_update_is_the_size_weighted_mean_of_every_clients_update(data8):
    # with every client sampled and no delay, FedAvg's step is sum_j |D_j|/|D| Delta_j: the paper's true update
    run = with_true_update(make_run(data8, "fedavg", rounds=3, join=1.0))
    steps, server_end = {}, run.method.server_end

    def recording_server_end(w, rnd):
        out = server_end(w, rnd)
        steps[rnd] = (out - w).cpu()
        return out

    run.method.server_end = recording_server_end
    rows = run.run().history
    for rnd in (1, 2, 3):
        torch.testing.assert_close(run.true_updates[rnd], steps[rnd], rtol=1e-5, atol=1e-7)
    assert all(0 < r["true_cos_min"] <= r["true_cos_mean"] <= r["true_cos_max"] < 1 for r in rows)


def test_true_update_leaves_the_run_unchanged(data8):
    # the diagnostic restores the global random state and the model: the run is the same without it
    plain, logged = make_run(data8, "fedavg", rounds=4), with_true_update(make_run(data8, "fedavg", rounds=4))
    plain_rows, logged_rows = plain.run().history, logged.run().history
    torch.testing.assert_close(plain.flat.w, logged.flat.w, rtol=0, atol=0)
    assert [r["test_acc"] for r in plain_rows] == [r["test_acc"] for r in logged_rows]
    assert all(-1 <= r["true_cos_min"] <= r["true_cos_mean"] <= r["true_cos_max"] <= 1 for r in logged_rows)
    # Fig. 2b: one true update per evaluation round, their cosine matrix symmetric with a unit diagonal
    rounds, cos = logged.true_update_cosines()
    assert rounds.tolist() == [1, 2, 3, 4] and np.allclose(cos, cos.T) and np.allclose(np.diag(cos), 1.0)


def test_heterogeneous_clients_point_away_from_the_true_update(data8):
    """Fig. 2a's point: clients with one or two classes each train away from the all-client mean update, IID
    clients along it."""
    def mean_cosine(parts):
        torch.manual_seed(0)
        cfg = TrainingConfig(rounds=2, local_epochs=1, batch_size=16, lr=0.05, join_ratio=1.0, eval_every=1)
        model = build_model("cnn3_small", data8.shape, data8.num_classes)
        run = with_true_update(AsyncRun(model, build_method("fedavg"), data8, parts, cfg,
                                        AsyncConfig(delay_sigma=0.0, server_samples=50), seed=0, log=lambda m: None))
        return np.mean([r["true_cos_mean"] for r in run.run().history])

    labels = data8.y_train.numpy()
    by_label = [np.sort(p) for p in np.array_split(np.argsort(labels, kind="stable"), 10)]
    iid, skewed = mean_cosine(equal_parts()), mean_cosine(by_label)
    assert iid > skewed + 0.2, (iid, skewed)


def test_true_updates_survive_a_resume(data8, tmp_path):
    full = with_true_update(make_run(data8, "fedavg", rounds=6, sigma=2.0, checkpoint_every=2))
    full.run()
    ckpt = tmp_path / "seed0.pt"

    preempt_at_round_3(lambda log: with_true_update(make_run(data8, "fedavg", rounds=6, sigma=2.0,
                                                             checkpoint_every=2, log=log)), ckpt)
    resumed = with_true_update(make_run(data8, "fedavg", rounds=6, sigma=2.0, checkpoint_every=2))
    resumed.run(ckpt, "fp")
    (r1, c1), (r2, c2) = full.true_update_cosines(), resumed.true_update_cosines()
    assert r1.tolist() == r2.tolist() == list(range(1, 7)) and np.allclose(c1, c2)


def test_early_stop_ends_an_asynchronous_run_that_stopped_improving(data8, tmp_path):
    # the shared round loop (sim/loop.py): with a learning rate too small to move the test accuracy the best stays
    # round 1's, and patience 2 ends the run of 8 after round 3; its checkpoint says the run is finished
    ckpt = tmp_path / "ckpt.pt"
    logs: list[str] = []
    result = make_run(data8, "fedasync", rounds=8, log=logs.append, early_stop=2, lr=1e-9).run(ckpt, "fp")
    assert [row["round"] for row in result.history] == [1, 2, 3]
    assert result.stopped_round == 3 and result.status == "complete"
    assert any("early stop after round 3" in m for m in logs)
    resumed = make_run(data8, "fedasync", rounds=8, early_stop=2, lr=1e-9).run(ckpt, "fp")
    assert comparable(resumed) == comparable(result) and resumed.stopped_round == 3
