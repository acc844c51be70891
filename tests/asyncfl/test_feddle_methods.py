"""Feddle's atlas and coefficient search (App. E gradient, Eq. 5 normalisation, importance replacement) and the
asynchronous baselines' server rules (FedAsync's staleness weighting, CA2FL's cache)."""

from __future__ import annotations

import dataclasses
import math
import weakref
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedrepro.asyncfl.atlas import coefficient_grad, normalize_anchors, replace_slot
from fedrepro.asyncfl.base import Update
from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import build_method
from fedrepro.models import build_model
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import DeviceData

torch.set_num_threads(1)


def tiny_model():
    torch.manual_seed(0)
    model = build_model("cnn3_small", (8, 8, 1), 10)
    return model, FlatModel(model)


def update(cid: int, delta: torch.Tensor, w_start=None, staleness: int = 0) -> Update:
    return Update(cid=cid, delta=delta, w_start=torch.zeros_like(delta) if w_start is None else w_start,
                  dispatch_round=1, staleness=staleness, num_samples=10)


def test_app_e_coefficient_gradient_equals_autograd_through_the_merged_model():
    model, flat = tiny_model()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 1, 8, 8, generator=gen), torch.randint(0, 10, (12,), generator=gen)
    w = flat.w.detach().clone()
    anchors = 0.1 * torch.randn(5, flat.numel, generator=gen)
    c = torch.tensor([0.3, -0.2, 0.0, 1.1, 0.5])

    loss, grad = coefficient_grad(flat, w, anchors, c, lambda idx: F.cross_entropy(model(x[idx]), y[idx]),
                                  torch.arange(12))

    c_auto = c.clone().requires_grad_(True)
    merged = w + c_auto @ anchors
    ref = F.cross_entropy(functional_call(model, flat.as_params(merged), (x,)), y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(grad, c_auto.grad, rtol=1e-4, atol=1e-6)
    assert anchors.grad is None  # no graph through the anchors


class _Saved:
    """A tensor autograd saved for backward, held so that its release can be seen (weakref.finalize)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def peak_saved_bytes(fn) -> int:
    """The most bytes of tensors autograd holds for backward at once while ``fn()`` runs: the activations of
    the pass's batch, the memory that grows with it (saved-tensor hooks: deterministic on the CPU)."""
    bytes_held = {"now": 0, "peak": 0}

    def release(nbytes: int) -> None:
        bytes_held["now"] -= nbytes

    def pack(tensor: torch.Tensor) -> _Saved:
        saved, nbytes = _Saved(tensor), tensor.numel() * tensor.element_size()
        bytes_held["now"] += nbytes
        bytes_held["peak"] = max(bytes_held["peak"], bytes_held["now"])
        weakref.finalize(saved, release, nbytes)
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.tensor):
        fn()
    return bytes_held["peak"]


def test_the_gradient_cosines_memory_does_not_grow_with_the_set():
    """grad_cosine backpropagates chunks of the search's batch_size, never the whole subset at once (at paper
    scale 1024 images at 224x224 in one batch would hold ~26 GB of ResNet18 activations)."""
    model, flat = tiny_model()
    feddle = build_method("feddle", batch_size=16, grad_cosine=True)
    gen = torch.Generator().manual_seed(1)
    w = flat.w.detach().clone()
    anchors, c = 0.1 * torch.randn(3, flat.numel, generator=gen), torch.tensor([0.5, -0.2, 0.1])
    peaks = {}
    for n in (64, 256):
        x, y = torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)
        feddle.setup(SimpleNamespace(flat=flat, model=model, seed=0, clients_per_round=1, server_x=x, server_y=y,
                                     id_x=x, id_y=y))
        peaks[n] = peak_saved_bytes(lambda: feddle.gradient_cosine(w, anchors, c, feddle.server_ce, 1))
    assert peaks[64] > 0 and peaks[256] == peaks[64]


def test_normalisation_gives_every_anchor_the_median_norm_and_keeps_directions():
    anchors = torch.randn(5, 40) * torch.tensor([0.1, 1.0, 3.0, 10.0, 0.5])[:, None]
    normed, factors = normalize_anchors(anchors)
    median = anchors.norm(dim=1).median()
    torch.testing.assert_close(normed.norm(dim=1), median.expand(5))
    torch.testing.assert_close(F.cosine_similarity(normed, anchors, dim=1), torch.ones(5))
    torch.testing.assert_close(normed, anchors * factors[:, None])


def test_a_full_atlas_replaces_the_anchor_with_the_smallest_abs_coefficient():
    model, flat = tiny_model()
    feddle = build_method("feddle", atlas_size=3)
    feddle.setup(SimpleNamespace(flat=flat, model=model, clients_per_round=5, seed=0))
    w = flat.w.detach().clone()
    deltas = [torch.full_like(w, float(i)) for i in range(5)]
    for i in range(3):
        feddle.server_receive(w, update(i, deltas[i]))
    assert len(feddle.state["anchors"]) == 3
    feddle.state["scores"] = [0.7, 0.05, 0.3]  # |c| of a search
    feddle.state["fresh"] = [False] * 3
    feddle.server_receive(w, update(3, deltas[3]))
    assert [a[0].item() for a in feddle.state["anchors"]] == [0.0, 3.0, 2.0]
    # the new anchor is not yet searched: the next arrival replaces the smallest searched one, not it
    feddle.server_receive(w, update(4, deltas[4]))
    assert [a[0].item() for a in feddle.state["anchors"]] == [0.0, 3.0, 4.0]
    # FIFO without the importance score
    assert replace_slot([0.7, 0.05, 0.3], [4, 2, 9], 3, importance=False) == 1
    assert replace_slot([0.7, 0.05, 0.3], [4, 2, 9], 3, importance=True) == 1
    assert replace_slot([0.01, 0.05, 0.3], [4, 2, 9], 3, importance=False) == 1
    assert replace_slot([0.01, 0.05, 0.3], [4, 2, 9], 3, importance=True) == 0
    assert replace_slot([0.1], [0], 3, importance=True) is None


def test_default_atlas_size_is_twice_the_clients_per_round():
    model, flat = tiny_model()
    feddle = build_method("feddle")
    feddle.setup(SimpleNamespace(flat=flat, model=model, clients_per_round=4, seed=0))
    assert feddle.capacity == 8


def test_fedasync_mixes_by_its_staleness_formula():
    fedasync = build_method("fedasync", alpha=0.6, a=0.5)
    w = torch.tensor([1.0, 2.0, 3.0])
    w_start, delta = torch.tensor([0.0, 1.0, 1.0]), torch.tensor([2.0, 2.0, -1.0])
    out = fedasync.server_receive(w, update(0, delta, w_start, staleness=3))
    mix = 0.6 * (3 + 1) ** -0.5  # alpha * (staleness + 1)^(-a) = 0.3
    torch.testing.assert_close(out, (1 - mix) * w + mix * (w_start + delta))
    fresh = fedasync.server_receive(w, update(0, delta, w_start, staleness=0))
    torch.testing.assert_close(fresh, 0.4 * w + 0.6 * (w_start + delta))


def test_fedasync_update_form_applies_each_update_to_the_current_model_and_agrees_with_mix_when_fresh():
    """The reading of Feddle's Eq. 4 and footnote 2 (updates merged into the current model), against a few-line
    re-implementation: w <- w + alpha (s + 1)^(-a) Delta for each arrival in turn."""
    arrivals = [(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([2.0, 2.0, -1.0]), 3),
                (torch.tensor([5.0, 5.0, 5.0]), torch.tensor([-1.0, 0.5, 0.0]), 0),
                (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 4.0]), 8)]
    fedasync = build_method("fedasync", alpha=0.6, a=0.5, form="update")
    w = expected = torch.tensor([1.0, 2.0, 3.0])
    for w_start, delta, staleness in arrivals:
        w = fedasync.server_receive(w, update(0, delta, w_start, staleness))
        expected = expected + 0.6 * (staleness + 1) ** -0.5 * delta
    torch.testing.assert_close(w, expected)
    mix = build_method("fedasync", alpha=0.6, a=0.5, form="mix")
    here = torch.tensor([1.0, -2.0, 0.5])  # a fresh update starts from the current model: both forms agree
    fresh = update(0, torch.tensor([0.3, 0.1, -0.2]), here.clone(), staleness=0)
    torch.testing.assert_close(mix.server_receive(here, fresh), fedasync.server_receive(here, fresh))


def test_fedavg_discard_averages_this_rounds_updates_only():
    """Feddle's Eq. 3 reading of FedAvg under delays, against a few-line re-implementation: the sample-weighted
    mean of the updates with staleness 0; a round with none leaves the model as it was."""
    method = build_method("fedavg_discard")
    w = torch.tensor([1.0, 1.0])
    ups = [Update(cid=0, delta=torch.tensor([2.0, 0.0]), w_start=w, dispatch_round=5, staleness=0, num_samples=30),
           Update(cid=1, delta=torch.tensor([9.0, 9.0]), w_start=w, dispatch_round=2, staleness=3, num_samples=10),
           Update(cid=2, delta=torch.tensor([0.0, 4.0]), w_start=w, dispatch_round=5, staleness=0, num_samples=10)]
    for u in ups:
        w = method.server_receive(w, u)
    w = method.server_end(w, 5)
    torch.testing.assert_close(w, torch.tensor([1.0, 1.0]) + (30 * ups[0].delta + 10 * ups[2].delta) / 40)
    assert method.round_metrics() == {"discarded": 1.0}
    stale_only = method.server_end(method.server_receive(w, ups[1]), 6)
    torch.testing.assert_close(stale_only, w)
    averaging = build_method("fedavg")  # the other reading: every arrival averaged, however stale
    for u in ups:
        averaging.server_receive(w, u)
    torch.testing.assert_close(averaging.server_end(w, 7), w + (30 * ups[0].delta + 10 * ups[1].delta
                                                               + 10 * ups[2].delta) / 50)


def test_fedbuff_steps_by_the_mean_of_each_full_buffer_across_rounds():
    """FedBuff (Nguyen et al.'s Algorithm 1), against a few-line re-implementation: updates accumulate across
    rounds; every buffer_size-th arrival steps w by server_lr times their mean and empties the buffer."""
    deltas = [torch.tensor([float(i), -float(i) / 2]) for i in range(1, 8)]
    fedbuff = build_method("fedbuff", server_lr=0.5, buffer_size=3)
    w = expected = torch.tensor([0.0, 1.0])
    buffered: list[torch.Tensor] = []
    for rnd, delta in enumerate(deltas):
        w = fedbuff.server_receive(w, update(rnd, delta, staleness=rnd % 3))
        w = fedbuff.server_end(w, rnd)  # a round ends after each arrival: the buffer outlives it
        buffered.append(delta)
        if len(buffered) == 3:
            expected = expected + 0.5 * torch.stack(buffered).mean(0)
            buffered = []
        torch.testing.assert_close(w, expected)
    assert fedbuff.state["count"] == 1  # the seventh waits in the buffer


def test_ca2fl_caches_each_clients_latest_update_and_calibrates_with_the_cache():
    ca2fl = build_method("ca2fl", server_lr=1.0, buffer_size=3)
    ca2fl.setup(SimpleNamespace(flat=None, model=None, num_clients=4, seed=0))
    w = torch.zeros(2)
    d = {k: torch.tensor(v) for k, v in {"a1": [1.0, 0.0], "b": [0.0, 2.0], "a2": [3.0, 3.0],
                                         "c": [1.0, 1.0], "a3": [-1.0, 0.0], "b2": [0.0, 1.0]}.items()}
    w = ca2fl.server_receive(w, update(1, d["a1"]))
    w = ca2fl.server_receive(w, update(2, d["b"]))
    w = ca2fl.server_receive(w, update(1, d["a2"]))  # buffer full: h^t = 0 (empty cache at the period's start)
    # v = 0 + ((a1 - 0) + (b - 0) + (a2 - a1)) / 3
    torch.testing.assert_close(w, (d["b"] + d["a2"]) / 3)
    assert set(ca2fl.state["cache"]) == {1, 2}
    torch.testing.assert_close(ca2fl.state["cache"][1], d["a2"])
    torch.testing.assert_close(ca2fl.state["cache"][2], d["b"])
    w_before = w.clone()
    w = ca2fl.server_receive(w, update(3, d["c"]))
    w = ca2fl.server_receive(w, update(1, d["a3"]))
    w = ca2fl.server_receive(w, update(2, d["b2"]))
    h = (d["a2"] + d["b"]) / 4  # cache mean over all 4 clients at the second period's start
    calib = (d["c"] + (d["a3"] - d["a2"]) + (d["b2"] - d["b"])) / 3
    torch.testing.assert_close(w, w_before + h + calib)
    torch.testing.assert_close(ca2fl.state["cache"][1], d["a3"])
    torch.testing.assert_close(ca2fl.state["cache"][3], d["c"])
    torch.testing.assert_close(ca2fl.state["cache_sum"], sum(ca2fl.state["cache"].values()))


@pytest.fixture
def digits_with_ood(digits_prepared) -> tuple[DeviceData, DeviceData]:
    """200 train / 150 test digits at 8x8, and 60 noise images with 3 other labels as out-of-domain server data."""
    from fedrepro.sim.tensors import to_device_data

    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    data = dataclasses.replace(data, x_train=data.x_train[:200], y_train=data.y_train[:200],
                               x_test=data.x_test[:150], y_test=data.y_test[:150])
    gen = torch.Generator().manual_seed(0)
    ood = DeviceData(x_train=torch.randn(60, 1, 8, 8, generator=gen), y_train=torch.randint(0, 3, (60,), generator=gen),
                     x_test=torch.zeros(0, 1, 8, 8), y_test=torch.zeros(0, dtype=torch.long), num_classes=3)
    return data, ood


def test_feddle_ood_searches_with_a_fresh_head_for_other_labels(digits_with_ood):
    data, ood = digits_with_ood
    torch.manual_seed(0)
    model = build_model("cnn3_small", data.shape, 10)
    parts = [torch.arange(i, 200, 5).numpy() for i in range(5)]
    run = AsyncRun(model, build_method("feddle", server_data="out_of_domain", fallback_lambda=0.01, lr=0.01),
                   data, parts, TrainingConfig(rounds=2, batch_size=16, lr=0.05, join_ratio=0.4),
                   AsyncConfig(delay_sigma=0.0, server_samples=50), seed=0, ood=ood, log=lambda m: None)
    assert run.server_classes == 3 and len(run.server_y) == 60
    result = run.run()
    row = result.history[-1]
    assert row["atlas"] == 4.0 and all(math.isfinite(row[k]) for k in ("coef_mean", "coef_min", "coef_max"))
    assert model.head.out_features == 10  # the client model keeps its own head


@pytest.mark.parametrize("name", ["fedft", "hfcl", "feddf", "center"])
def test_server_data_methods_run(name, digits_prepared):
    from fedrepro.sim.tensors import to_device_data

    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    data = dataclasses.replace(data, x_train=data.x_train[:200], y_train=data.y_train[:200],
                               x_test=data.x_test[:150], y_test=data.y_test[:150])
    torch.manual_seed(0)
    model = build_model("cnn3_small", data.shape, 10)
    parts = [torch.arange(i, 200, 5).numpy() for i in range(5)]
    run = AsyncRun(model, build_method(name), data, parts, TrainingConfig(rounds=3, batch_size=16, lr=0.05,
                   join_ratio=0.4), AsyncConfig(delay_sigma=1.0, server_samples=50), seed=0, log=lambda m: None)
    w0 = run.w_init.clone()
    run.run()
    assert torch.isfinite(run.flat.w).all() and not torch.equal(run.flat.w, w0)


def test_gradient_cosine_is_one_in_domain_and_a_cosine_out_of_domain(digits_with_ood):
    data, ood = digits_with_ood
    rows = {}
    for kind in ("in_domain", "out_of_domain"):
        torch.manual_seed(0)
        model = build_model("cnn3_small", data.shape, 10)
        parts = [torch.arange(i, 200, 5).numpy() for i in range(5)]
        run = AsyncRun(model, build_method("feddle", server_data=kind, grad_cosine=True, lr=0.01), data, parts,
                       TrainingConfig(rounds=2, batch_size=16, lr=0.05, join_ratio=0.4),
                       AsyncConfig(delay_sigma=0.0, server_samples=50), seed=0, ood=ood, log=lambda m: None)
        rows[kind] = run.run().history[-1]["coef_grad_cos"]
    # in-domain, the search's loss is the in-domain cross-entropy itself (on a reshuffled subset of the same set)
    assert rows["in_domain"] == pytest.approx(1.0, abs=1e-5)
    assert -1.0 <= rows["out_of_domain"] < 0.999


def test_feddf_teacher_is_the_softmax_of_the_averaged_logits():
    """FedDF (Lin et al. 2020, Algorithm 1) distils from softmax(mean_i f_i / T), not mean_i softmax(f_i / T)."""
    model, flat = tiny_model()
    feddf = build_method("feddf", temperature=2.0)
    feddf.setup(SimpleNamespace(flat=flat, model=model, seed=0))
    gen = torch.Generator().manual_seed(3)
    teachers = [torch.randn(flat.numel, generator=gen) * 0.3 for _ in range(2)]
    x = torch.randn(6, 1, 8, 8, generator=gen)
    logits = [functional_call(model, flat.as_params(v), (x,)) for v in teachers]
    target = feddf.ensemble_probs(x, teachers)
    torch.testing.assert_close(target, F.softmax((logits[0] + logits[1]) / 2 / 2.0, dim=1))
    mean_of_softmax = (F.softmax(logits[0] / 2.0, dim=1) + F.softmax(logits[1] / 2.0, dim=1)) / 2
    assert (target - mean_of_softmax).abs().max() > 1e-3  # the two ensembles differ here: the test tells them apart


def test_hfcl_server_trains_with_the_clients_optimiser(digits_prepared, monkeypatch):
    """HFCL's server is one more client: the clients' SGD with their momentum and weight decay (torch.optim.SGD's
    update, a fresh momentum buffer), their epochs and batch size, on the in-domain server data."""
    import copy

    import fedrepro.asyncfl.base as base
    from fedrepro.asyncfl.server_train import batches
    from fedrepro.sim.tensors import to_device_data

    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    data = dataclasses.replace(data, x_train=data.x_train[:200], y_train=data.y_train[:200],
                               x_test=data.x_test[:150], y_test=data.y_test[:150])
    torch.manual_seed(0)
    model = build_model("cnn3_small", data.shape, 10)
    cfg = TrainingConfig(rounds=1, local_epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=0.01,
                         join_ratio=0.4)
    run = AsyncRun(model, build_method("hfcl"), data, [torch.arange(i, 200, 5).numpy() for i in range(5)], cfg,
                   AsyncConfig(delay_sigma=0.0, server_samples=50), seed=0, log=lambda m: None)
    hfcl, w = run.method, run.w_init.clone()
    reference = copy.deepcopy(model)
    FlatModel(reference).load(w)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    for idx in batches(50, 16, 2, hfcl.server_generator(1), w.device):
        opt.zero_grad()
        F.cross_entropy(reference(run.server_x[idx]), run.server_y[idx]).backward()
        opt.step()
    expected = FlatModel(reference).vector_of().detach() - w

    merged = {}
    weighted_mean = base.weighted_mean

    def recording_mean(vectors, weights):
        merged.update(deltas=vectors, weights=weights)
        return weighted_mean(vectors, weights)

    monkeypatch.setattr(base, "weighted_mean", recording_mean)
    hfcl.server_receive(w, update(0, torch.zeros_like(w), w))
    hfcl.server_end(w, 1)
    assert merged["weights"] == [10, 50]  # the server's update weighs its 50 samples
    torch.testing.assert_close(merged["deltas"][1], expected, atol=1e-5, rtol=1e-4)
