"""The synchronous engine: FedAvg is local SGD + weighted averaging, runs are reproducible and resumable."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients, history_rows
from support.engine import CFG, make_run

from fedrepro import seeding
from fedrepro.models import build_model
from fedrepro.sim.batches import batches_per_epoch, epoch_batches
from fedrepro.sim.checkpoint import CheckpointError
from fedrepro.sim.flat import FlatModel

metrics = history_rows


def test_flat_model_gradients_land_in_the_flat_vector():
    torch.manual_seed(0)
    net = build_model("simple_cnn", (28, 28, 1), 10)
    flat = FlatModel(net)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    flat.zero_grad()
    F.cross_entropy(net(x), y).backward()
    reference = build_model("simple_cnn", (28, 28, 1), 10)
    reference.load_state_dict(net.state_dict())
    F.cross_entropy(reference(x), y).backward()
    expected = flat.vector_of([p.grad for p in reference.parameters()])
    assert torch.allclose(flat.g, expected, atol=1e-6) and flat.g.abs().sum() > 0
    assert torch.equal(flat.vector_of([p.detach() for p in net.parameters()]), flat.w)  # the layout round-trips
    assert next(net.parameters()).is_contiguous(memory_format=torch.channels_last)
    flat.check_bound()
    params = torch.func.functional_call(net, flat.as_params(flat.w + 1.0), (x,))
    assert not torch.allclose(params, net(x))  # as_params really evaluates another vector


def test_fedprox_with_mu_zero_equals_fedavg(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    avg = make_run(small_data, parts).run()
    prox = make_run(small_data, parts, "fedprox", {"mu": 0.0}).run()
    a, b = metrics(avg), metrics(prox)
    assert [r["round"] for r in a] == [1, 2, 3]
    for ra, rb in zip(a, b, strict=True):
        assert ra["test_acc"] == pytest.approx(rb["test_acc"], abs=1e-9)
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=1e-5)
    # and mu > 0 really changes the trajectory
    prox1 = make_run(small_data, parts, "fedprox", {"mu": 1.0}).run()
    assert metrics(prox1)[-1]["test_loss"] != pytest.approx(a[-1]["test_loss"], rel=1e-4)


@pytest.mark.parametrize("drop_last", [False, True])
def test_fedavg_with_one_client_equals_plain_sgd(small_data, drop_last):
    """One client, full participation: FedAvg must be exactly torch.optim.SGD on that client's batches
    (with drop_last: without each epoch's short last batch, as DataLoader(drop_last=True))."""
    idx = np.arange(len(small_data.y_train) - 7)
    assert len(idx) % CFG.batch_size  # there is a short batch to drop
    run = make_run(small_data, [idx], cfg=dataclasses.replace(CFG, rounds=2, drop_last=drop_last))
    run.run()
    ours = run.flat.w.clone()

    torch.manual_seed(seeding.derive_seed(0, seeding.INIT))
    net = build_model("cnn4", small_data.shape, small_data.num_classes)
    layout = FlatModel(build_model("cnn4", small_data.shape, small_data.num_classes))
    tidx = torch.as_tensor(idx)
    for rnd in (1, 2):  # a fresh optimiser per round, as every client gets
        start_w = layout.vector_of([p.detach().clone() for p in net.parameters()])
        opt = torch.optim.SGD(net.parameters(), lr=CFG.lr, momentum=CFG.momentum,
                              weight_decay=CFG.weight_decay)
        gen = torch.Generator().manual_seed(seeding.derive_seed(0, seeding.BATCHES, rnd, 0))
        for _ in range(CFG.local_epochs):
            order = tidx[torch.randperm(len(idx), generator=gen)]
            stop = len(idx) - len(idx) % CFG.batch_size if drop_last else len(idx)
            for start in range(0, stop, CFG.batch_size):
                b = order[start : start + CFG.batch_size]
                opt.zero_grad()
                F.cross_entropy(net(small_data.x_train[b]), small_data.y_train[b]).backward()
                opt.step()
        # the server's w + (w_k - w) in floats, as the engine computes it: a last-bit difference here can
        # flip a max-pool tie on the digits' flat background and grow over the next round
        end_w = layout.vector_of([p.detach() for p in net.parameters()])
        FlatModel(net).load(start_w + (end_w - start_w))
    plain = layout.vector_of([p.detach() for p in net.parameters()])
    assert torch.allclose(ours, plain, atol=1e-5, rtol=1e-4)


def test_aggregation_is_the_size_weighted_average_of_client_models(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=3)
    run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=1))
    w0 = run.flat.w.clone()
    locals_ = [run.train_client(cid, 1, w0)[0]["delta"] + w0 for cid in range(3)]
    sizes = np.array([len(p) for p in parts], dtype=np.float64)
    expected = sum(float(s) * w for s, w in zip(sizes / sizes.sum(), locals_, strict=True))
    run.run()
    assert torch.allclose(run.flat.w, expected, atol=1e-6)


def test_identical_seeds_give_identical_metrics_and_other_seeds_do_not(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    first, again = make_run(small_data, parts).run(), make_run(small_data, parts).run()
    assert metrics(first) == metrics(again)
    other = make_run(small_data, parts, seed=1).run()
    assert metrics(other) != metrics(first)


def test_partial_participation_samples_the_join_ratio(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=10, beta=5.0)
    run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, join_ratio=0.3))
    draws = [run.sample_clients(r) for r in range(1, 20)]
    assert all(len(d) == 3 and len(set(d.tolist())) == 3 for d in draws)
    assert len({tuple(d) for d in draws}) > 5  # different clients in different rounds
    again = make_run(small_data, parts, cfg=dataclasses.replace(CFG, join_ratio=0.3))
    assert np.array_equal(again.sample_clients(7), draws[6])  # a pure function of (seed, round)


def test_interrupted_run_resumes_to_identical_metrics(small_data, tmp_path):
    parts = dirichlet_clients(small_data.y_train.numpy())
    cfg = dataclasses.replace(CFG, rounds=5, checkpoint_every=2)
    full = make_run(small_data, parts, cfg=cfg).run()

    ckpt = tmp_path / "seed0.pt"
    crashing = make_run(small_data, parts, cfg=cfg)
    original_end = crashing.alg.server_end

    def crash_in_round_4(w):
        if len(crashing.alg.__dict__.get("_calls", [])) == 3:
            raise KeyboardInterrupt("killed")
        crashing.alg.__dict__.setdefault("_calls", []).append(1)
        return original_end(w)

    crashing.alg.server_end = crash_in_round_4
    with pytest.raises(KeyboardInterrupt):
        crashing.run(ckpt, "fp")
    assert torch.load(ckpt, weights_only=False)["round"] == 2  # the last checkpoint before the kill

    logs = []
    resumed = make_run(small_data, parts, cfg=cfg)
    resumed.log = logs.append
    result = resumed.run(ckpt, "fp")
    assert any("resumed" in m and "after round 2" in m for m in logs)
    assert metrics(result) == metrics(full)


def test_checkpoint_of_another_config_or_corrupt_is_refused(small_data, tmp_path):
    parts = dirichlet_clients(small_data.y_train.numpy())
    ckpt = tmp_path / "seed0.pt"
    make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=1)).run(ckpt, "config-A")
    with pytest.raises(CheckpointError, match="another configuration"):
        make_run(small_data, parts).run(ckpt, "config-B")
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        make_run(small_data, parts).run(ckpt, "config-A")


def test_divergence_stops_the_run_and_says_when(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    result = make_run(small_data, parts, cfg=dataclasses.replace(CFG, lr=1e6, momentum=0.0, rounds=6)).run()
    assert result.status == "diverged"
    assert result.diverged_round is not None and result.diverged_round <= 6
    assert result.history[-1]["round"] == result.diverged_round
    assert not math.isfinite(result.history[-1]["train_loss"]) or not math.isfinite(
        result.history[-1]["test_loss"]) or result.history[-1]["test_acc"] <= 20


def test_a_finite_but_exploding_loss_counts_as_divergence(small_data, monkeypatch):
    from fedrepro.sim import runs

    parts = dirichlet_clients(small_data.y_train.numpy())
    healthy = make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=2)).run()
    assert healthy.status == "complete"
    monkeypatch.setattr(runs, "DIVERGED_LOSS", 1e-3)  # every real loss is above this
    flagged = make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=2)).run()
    assert flagged.status == "diverged" and flagged.diverged_round == 1
    # nothing non-finite to name: the largest quantity instead
    assert flagged.divergence["first_non_finite"] is None and flagged.divergence["largest"]
    assert "every quantity still finite, the largest" in flagged.divergence["why"]


def test_a_diverged_run_names_its_round_loss_and_first_non_finite_quantity(small_data, tmp_path):
    parts = dirichlet_clients(small_data.y_train.numpy())
    log: list[str] = []
    run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, lr=1e6, momentum=0.0, rounds=6))
    run.log = log.append
    result = run.run(tmp_path / "ckpt.pt", "fp")
    why = result.divergence
    assert why["round"] == result.diverged_round and not math.isfinite(why["train_loss"])
    # a client's local training blew up first: its loss is the first of the round's quantities that is not finite
    assert why["first_non_finite"] == f"client {run.sample_clients(why['round'])[0]}'s training loss"
    assert f"diverged at round {why['round']}: {why['why']}" in log
    assert why["why"].startswith("train loss nan; first non-finite quantity: client ")
    # a resumed diverged run still says why
    again = make_run(small_data, parts, cfg=dataclasses.replace(CFG, lr=1e6, momentum=0.0, rounds=6))
    resumed = again.run(tmp_path / "ckpt.pt", "fp").divergence

    def without_loss(d: dict) -> dict:  # NaN != NaN
        return {k: v for k, v in d.items() if k != "train_loss"}

    assert without_loss(resumed) == without_loss(why)


def test_a_non_finite_control_variate_is_named_before_the_losses_it_spoils(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    run = make_run(small_data, parts, "scaffold", cfg=dataclasses.replace(CFG, rounds=3))
    server_end = run.alg.server_end

    def corrupt_after_round_1(w):
        w = server_end(w)
        if not run.alg.state.get("spoiled"):
            run.alg.state["c"][7] = float("nan")  # round 1 ends finite: weights and loss; the server's c does not
            run.alg.state["spoiled"] = torch.ones(1)
        return w

    run.alg.server_end = corrupt_after_round_1
    result = run.run()
    assert result.status == "diverged" and result.diverged_round == 2
    assert result.divergence["first_non_finite"] == f"client {run.sample_clients(2)[0]}'s download c"


def test_a_round_trace_names_the_first_non_finite_quantity_in_its_order_or_else_the_largest():
    from fedrepro.sim.runs import RoundTrace

    trace = RoundTrace()
    trace.note("a loss", torch.tensor(2.0))
    trace.note("an upload", {"delta": torch.tensor([1.0, 3.0]), "count": torch.tensor(4)})  # integers: not noted
    trace.note("the state", {"c_local": {3: torch.tensor([float("inf")])}, "c": torch.tensor([float("nan")])})
    found = trace.diagnose(5, float("nan"))
    assert (found.round, found.first_non_finite, found.largest) == (5, "the state c_local[3]", "an upload delta")
    trace = RoundTrace()
    trace.note("w", torch.tensor([-7.0, 2.0]))
    trace.note("c", torch.tensor([3e11]))
    found = trace.diagnose(2, 4e12)
    assert (found.first_non_finite, found.largest, found.largest_magnitude) == (None, "c", pytest.approx(3e11))
    assert "every quantity still finite, the largest c (max |x| 3e+11)" in found.text()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_all_finite_finds_one_bad_entry_anywhere_in_a_vector(bad):
    from fedrepro.sim.runs import all_finite

    v = torch.randn(1001)
    assert all_finite(v) and all_finite(torch.empty(0))
    for at in (0, 500, 1000):
        w = v.clone()
        w[at] = bad
        assert not all_finite(w)
    assert all_finite(torch.full((3,), 3e38))  # huge but finite is the loss check's business, not this one's


def test_bytes_are_counted_per_client_and_round(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=2))
    result = run.run()
    model_bytes = run.flat.numel * 4
    assert result.history[0]["bytes_up"] == len(parts) * model_bytes
    assert result.history[1]["bytes_down"] == 2 * len(parts) * model_bytes


def test_stragglers_run_the_drawn_number_of_local_iterations(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    cfg = dataclasses.replace(CFG, straggler_steps=[3, 9], batch_size=8)
    run = make_run(small_data, parts, cfg=cfg)
    steps = {}
    for rnd in (1, 2):
        for cid in range(len(parts)):
            gen = torch.Generator().manual_seed(0)
            steps[rnd, cid] = sum(1 for _ in run.local_batches(run.clients[cid], gen, rnd, cid))
    assert all(3 <= s <= 9 for s in steps.values())
    assert len(set(steps.values())) > 1  # heterogeneous across clients and rounds
    expected = seeding.rng_for(0, seeding.STRAGGLERS, 2, 1).integers(3, 10)
    assert steps[2, 1] == expected
    # more iterations than one pass: it cycles through reshuffled passes
    small = [np.arange(5)]
    run = make_run(small_data, small, cfg=dataclasses.replace(cfg, straggler_steps=[7, 7], batch_size=2))
    batches = list(run.local_batches(run.clients[0], torch.Generator().manual_seed(0), 1, 0))
    assert len(batches) == 7 and sum(len(b) for b in batches[:3]) == 5


def test_drop_last_takes_floor_n_over_b_full_batches_and_a_lone_short_one():
    assert [batches_per_epoch(n, 16, True) for n in (33, 32, 10, 16, 1)] == [2, 2, 1, 1, 1]
    assert [batches_per_epoch(n, 16, False) for n in (33, 32, 10, 16, 1)] == [3, 2, 1, 1, 1]
    order = torch.arange(33)
    assert [len(b) for b in epoch_batches(order, 16, drop_last=True)] == [16, 16]
    assert [len(b) for b in epoch_batches(order, 16, drop_last=False)] == [16, 16, 1]
    # a client with fewer samples than one batch keeps its one short batch (a DataLoader would give none)
    assert [b.tolist() for b in epoch_batches(order[:10], 16, drop_last=True)] == [list(range(10))]


def test_the_engine_drops_each_epochs_short_batch_with_drop_last(small_data):
    parts = [np.arange(37), np.arange(100, 110)]  # 37 = 2 x 16 + 5; 10 < one batch
    cfg = dataclasses.replace(CFG, rounds=1, local_epochs=3)
    for drop_last, sizes in ((True, [16, 16] * 3), (False, [16, 16, 5] * 3)):
        run = make_run(small_data, parts, cfg=dataclasses.replace(cfg, drop_last=drop_last))
        batches = list(run.local_batches(run.clients[0], torch.Generator().manual_seed(0), 1, 0))
        assert [len(b) for b in batches] == sizes
        # each epoch is a fresh shuffle, and with drop_last its dropped samples differ between epochs
        epochs = [set(torch.cat(batches[e * len(sizes) // 3 : (e + 1) * len(sizes) // 3]).tolist())
                  for e in range(3)]
        assert len({frozenset(e) for e in epochs}) == (3 if drop_last else 1)
        _, _, seen = run.train_client(1, 1, run.flat.w.clone())
        assert seen == 3 * 10  # the small client takes one short step per epoch either way
    upload, _, seen = run.train_client(0, 1, run.flat.w.clone())
    assert seen == 3 * 37


def test_client_accuracy_variance_follows_client_class_distributions():
    from fedrepro.sim.sync import client_accuracy

    counts = np.array([[10, 0, 0], [0, 5, 5], [2, 2, 0]])
    out = client_accuracy(counts, [90.0, 50.0, 10.0])
    per_client = np.array([90.0, 30.0, 70.0])
    assert out["client_acc_mean"] == pytest.approx(per_client.mean())
    assert out["client_acc_var"] == pytest.approx(per_client.var())
    # a class missing from the test set is left out and the client's distribution renormalised
    assert client_accuracy(counts, [90.0, None, 10.0])["client_acc_mean"] == pytest.approx((90 + 10 + 90) / 3)


def test_atomic_writes_honour_the_umask(tmp_path):
    import os

    from fedrepro.io import atomic_write_text

    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "x.txt", "hello")
    finally:
        os.umask(old)
    assert path.read_text() == "hello" and (path.stat().st_mode & 0o777) == 0o644
    assert not list(tmp_path.glob(".x.txt.*"))  # no temp file left behind


def test_test_samples_evaluates_a_fixed_stratified_subset(tmp_path) -> None:
    from fedrepro.data.registry import prepare_dataset
    from fedrepro.train import job_data

    path = tmp_path / "digits.npz"
    prepare_dataset("digits", path)
    spec = {"partition": {"kind": "iid", "clients": 2}, "image_size": None, "channels": None}
    _, full, _ = job_data(spec, path, "cpu", 1)
    _, sub, data = job_data({**spec, "test_samples": 100}, path, "cpu", 1)
    _, again, _ = job_data({**spec, "test_samples": 100}, path, "cpu", 1)
    assert len(sub.y_test) == len(data.y_test) == 100 and np.array_equal(sub.y_test, again.y_test)
    shares = np.bincount(full.y_test, minlength=10) / len(full.y_test)
    assert np.abs(np.bincount(sub.y_test, minlength=10) / 100 - shares).max() <= 0.01 + 1e-9
    assert len(full.x_train) == len(sub.x_train)  # training data untouched


def test_evaluation_in_batches_of_any_size_gives_one_passs_numbers(small_data):
    """evaluate's batch (inference_batch: a speed choice, 256 on a CPU) changes no accuracy and no loss."""
    from fedrepro.sim.tensors import evaluate, inference_batch

    torch.manual_seed(0)
    model = build_model("simple_cnn", small_data.shape, small_data.num_classes)
    x, y = torch.cat([small_data.x_train, small_data.x_test]), torch.cat([small_data.y_train, small_data.y_test])
    whole = evaluate(model, x, y, small_data.num_classes, batch_size=len(y))
    assert inference_batch(x.device) < len(y)  # the default below does go through several batches
    for batch_size in (None, 7, 64):
        acc, loss, per_class = evaluate(model, x, y, small_data.num_classes, batch_size=batch_size)
        assert acc == whole[0] and per_class == whole[2]
        assert loss == pytest.approx(whole[1], rel=1e-5)


def test_in_inference_batches_is_one_pass_in_pieces_of_the_inference_batch(small_data):
    """A teacher's logits or a frozen body's features (FedDF, Feddle-OOD, FedGH, fine-tuning) computed in
    batches of inference_batch: the rows of one whole pass, in order, with no batch larger than that."""
    from fedrepro.sim.tensors import in_inference_batches, inference_batch

    torch.manual_seed(0)
    model = build_model("simple_cnn", small_data.shape, small_data.num_classes).eval()
    x = torch.cat([small_data.x_train, small_data.x_test])
    sizes = []

    def body(xb: torch.Tensor) -> torch.Tensor:
        sizes.append(len(xb))
        return model.body(xb)

    with torch.no_grad():
        pieces, whole = in_inference_batches(body, x), model.body(x)
    size = inference_batch(x.device)
    assert len(x) > size and sizes == [min(size, len(x) - s) for s in range(0, len(x), size)]
    torch.testing.assert_close(pieces, whole, rtol=1e-5, atol=1e-5)
