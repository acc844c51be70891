"""BatchNorm running statistics in the asynchronous engine (asyncfl/base.py's rule): they travel with client
updates and merge with the parameters' coefficients; non-training server passes leave them unchanged; server
training updates them; checkpoints of the older layout are refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.common import digits_cut
from torch import nn

import fedrepro.asyncfl.methods.feddle as feddle_module
from fedrepro.asyncfl.atlas import coefficient_grad
from fedrepro.asyncfl.base import merge_buffers
from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import build_method
from fedrepro.models.cnn import SplitModel
from fedrepro.sim.checkpoint import CheckpointError, save_checkpoint
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import DeviceData, eval_mode

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data8(digits_prepared):
    return digits_cut(digits_prepared, 200, 150, image_size=8)


@pytest.fixture(scope="module")
def ood8() -> DeviceData:
    gen = torch.Generator().manual_seed(0)
    return DeviceData(x_train=torch.randn(60, 1, 8, 8, generator=gen) * 3 + 2,
                      y_train=torch.randint(0, 3, (60,), generator=gen),
                      x_test=torch.zeros(0, 1, 8, 8), y_test=torch.zeros(0, dtype=torch.long), num_classes=3)


def bn_model(seed: int = 0) -> SplitModel:
    """A tiny BatchNorm CNN with a body/head split (Feddle-OOD fits a head on the body)."""
    torch.manual_seed(seed)
    body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 64, 16), nn.BatchNorm1d(16), nn.ReLU())
    return SplitModel(body, 16, 10)


def make_run(data, method, rounds=1, join=0.4, ood=None, sigma=0.0) -> AsyncRun:
    parts = [np.arange(i, 200, 5) for i in range(5)]
    return AsyncRun(bn_model(), method, data, parts, TrainingConfig(rounds=rounds, batch_size=16, lr=0.05,
                    join_ratio=join, eval_every=1), AsyncConfig(delay_sigma=sigma, server_samples=50), seed=0,
                    ood=ood, log=lambda m: None)


def record_arrivals(run: AsyncRun) -> list:
    """The updates ``run`` receives, recorded as they arrive."""
    arrived = []
    client_update = run.client_update

    def recording(*args):
        out = client_update(*args)
        arrived.append(out[0])
        return out

    run.client_update = recording
    return arrived


def all_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def test_merge_is_the_parameters_weighting_clipped_to_a_mixture():
    b, b1, b2 = torch.tensor([1.0, 4.0]), torch.tensor([3.0, 2.0]), torch.tensor([5.0, 0.0])
    # FedAvg (weights summing to 1): the weighted mean of the clients' statistics
    torch.testing.assert_close(merge_buffers(b, [0.25, 0.75], [b1, b2]), 0.25 * b1 + 0.75 * b2)
    # a step of total weight s < 1 (FedAsync's mix, FedBuff's server lr 0.5): (1 - s) b + s sum p_i b_i
    torch.testing.assert_close(merge_buffers(b, [0.1, 0.3], [b1, b2]), 0.6 * b + 0.1 * b1 + 0.3 * b2)
    # negative coefficients count as 0, a total above 1 as 1: always a mixture of statistics
    torch.testing.assert_close(merge_buffers(b, [-0.5, 0.4], [b1, b2]), 0.6 * b + 0.4 * b2)
    torch.testing.assert_close(merge_buffers(b, [0.9, 0.9], [b1, b2]), 0.5 * b1 + 0.5 * b2)
    torch.testing.assert_close(merge_buffers(b, [-1.0, 0.0], [b1, b2]), b)


@pytest.mark.parametrize("name", ["fedavg", "feddf"])
def test_global_statistics_are_the_weighted_mean_of_the_arrived_clients(data8, name):
    """No delay, one round: every sampled client trains from the initial model and statistics; FedAvg's (and
    FedDF's, whose distillation keeps the merged statistics) global statistics are their sample-weighted mean,
    not the last client's, and evaluation uses them."""
    run = make_run(data8, build_method(name))
    arrived = record_arrivals(run)
    run.run()
    assert len(arrived) == 2 and all(u.buffers is not None for u in arrived)
    n = torch.tensor([float(u.num_samples) for u in arrived])
    expected = sum(p * u.buffers for p, u in zip((n / n.sum()).tolist(), arrived, strict=True))
    assert not torch.allclose(arrived[0].buffers, arrived[1].buffers)
    torch.testing.assert_close(run.global_buffers, expected)
    torch.testing.assert_close(run.flat.buffers(), expected)  # the model ends with (and is evaluated on) them


def test_fedft_training_updates_the_merged_statistics(data8):
    run = make_run(data8, build_method("fedft"))
    arrived = record_arrivals(run)
    run.run()
    n = torch.tensor([float(u.num_samples) for u in arrived])
    merged = sum(p * u.buffers for p, u in zip((n / n.sum()).tolist(), arrived, strict=True))
    assert not torch.allclose(run.global_buffers, merged)  # server fine-tuning moved them, as training does
    torch.testing.assert_close(run.global_buffers, run.flat.buffers())


def test_a_fedbuff_flush_merges_the_clients_statistics_with_its_step_weights(data8):
    run = make_run(data8, build_method("fedbuff", server_lr=0.5, buffer_size=3))
    method, b = run.method, run.global_buffers.clone()
    w = run.w_init.clone()
    client_buffers = [torch.rand_like(b) + i for i in range(3)]
    for i, buf in enumerate(client_buffers[:2]):
        w = method.server_receive(w, _update(i, w, buf))
    torch.testing.assert_close(run.global_buffers, b)  # nothing merged before the flush
    method.server_receive(w, _update(2, w, client_buffers[2]))
    torch.testing.assert_close(run.global_buffers, 0.5 * b + 0.5 * sum(client_buffers) / 3)


def test_fedasync_mixes_the_statistics_as_the_parameters(data8):
    run = make_run(data8, build_method("fedasync", alpha=0.6, a=0.5))
    b, buf = run.global_buffers.clone(), torch.rand_like(run.global_buffers)
    run.method.server_receive(run.w_init, _update(0, run.w_init, buf, staleness=3))
    torch.testing.assert_close(run.global_buffers, 0.7 * b + 0.3 * buf)  # alpha (3 + 1)^-0.5 = 0.3


def _update(cid, w, buffers, staleness=0):
    from fedrepro.asyncfl.base import Update

    return Update(cid=cid, delta=torch.randn_like(w) * 1e-3, w_start=w, dispatch_round=1, staleness=staleness,
                  num_samples=10, buffers=buffers)


@pytest.mark.parametrize("server_data", ["in_domain", "out_of_domain"])
def test_feddle_search_leaves_the_statistics_and_merges_them_with_the_searched_coefficients(
        data8, ood8, monkeypatch, server_data):
    """The coefficient search (and Feddle-OOD's feature pass and head fit) runs in eval mode on the statistics
    merged at the starting c: no buffer changes during it, num_batches_tracked included. The step then merges
    the anchors' statistics with the coefficients of the raw updates."""
    run = make_run(data8, build_method("feddle", server_data=server_data, fallback_lambda=0.01, lr=0.01,
                                       grad_cosine=True), ood=ood8)
    feddle, w = run.method, run.w_init.clone()
    b = run.global_buffers.clone()
    client_buffers = [b + 0.1 + torch.rand_like(b), b + 0.2 * torch.rand_like(b)]
    for i, buf in enumerate(client_buffers):
        feddle.server_receive(w, _update(i, w, buf))
    factors = feddle_module.normalize_anchors(torch.stack(feddle.state["anchors"]))[1]
    seen = {}
    search = feddle_module.search_coefficients

    def searching(*args, **kwargs):
        seen["before"] = all_buffers(run.model)
        search(*args, **kwargs)
        seen["after"] = all_buffers(run.model)
        return torch.tensor([0.3, 0.5]) / factors  # raw coefficients 0.3 and 0.5

    monkeypatch.setattr(feddle_module, "search_coefficients", searching)
    tracked = {k: v for k, v in all_buffers(run.model).items() if "num_batches" in k}
    run.model.train()
    feddle.server_end(w, 1)
    assert run.model.training  # the mode it had
    for name, value in seen["before"].items():
        torch.testing.assert_close(seen["after"][name], value, msg=f"the search changed {name}")
    for name, value in tracked.items():
        torch.testing.assert_close(seen["after"][name], value, msg=f"a pass before the search changed {name}")
    # the search ran on FedBuff's merge (fallback init: 1/2 of each fresh update)
    torch.testing.assert_close(run.flat.as_buffers(sum(client_buffers) / 2),
                               {k: v for k, v in seen["before"].items() if "num_batches" not in k})
    torch.testing.assert_close(run.global_buffers, 0.2 * b + 0.3 * client_buffers[0] + 0.5 * client_buffers[1])


def test_the_gradient_cosine_in_chunks_equals_one_batch(data8, ood8):
    """grad_cosine accumulates its gradients over chunks of batch_size: in eval mode (server_end's), BatchNorm
    normalises every chunk with the running statistics, so the result is the one-batch gradient and cosine."""
    run = make_run(data8, build_method("feddle", server_data="out_of_domain", grad_cosine=True), ood=ood8)
    feddle, w = run.method, run.w_init.clone()
    anchors = 0.1 * torch.randn(3, len(w), generator=torch.Generator().manual_seed(1))
    c, idx = torch.tensor([0.5, -0.2, 0.1]), torch.arange(len(run.server_y))
    cosines = {}
    with eval_mode(run.model):
        loss, grad = coefficient_grad(run.flat, w, anchors, c, feddle.server_ce, idx)
        loss_chunked, grad_chunked = coefficient_grad(run.flat, w, anchors, c, feddle.server_ce, idx, chunk=7)
        for batch_size in (7, len(idx)):  # 60 OOD and 50 in-domain samples: in 9 and 8 chunks, or in one
            feddle.batch_size = batch_size
            cosines[batch_size] = feddle.gradient_cosine(w, anchors, c, feddle.server_ce, 1)
    torch.testing.assert_close(loss_chunked, loss)
    # float32 sums in another order differ by a few ulps of the largest term, so the absolute tolerance scales
    # with the gradient: its 3rd entry is ~1e-3 of the 1st, and a CPU with other kernels moved it by 1.4e-7.
    torch.testing.assert_close(grad_chunked, grad, rtol=1e-5, atol=1e-6 * grad.norm().item())
    assert cosines[7] == pytest.approx(cosines[len(idx)], abs=1e-6) and abs(cosines[7]) < 0.99


def test_checkpoint_of_the_older_layout_is_refused(data8, tmp_path):
    ckpt = tmp_path / "seed0.pt"
    run = make_run(data8, build_method("fedavg"), rounds=2)
    save_checkpoint(ckpt, "fp", dict(round=1, w=run.w_init, state={}, buffers={}, inflight=[], snapshots={},
                                     history=[], status="complete", diverged_round=None, bytes_up=0, bytes_down=0,
                                     seconds=0.0))
    with pytest.raises(CheckpointError, match="older asynchronous engine"):
        run.run(ckpt, "fp")


@pytest.mark.parametrize("name", ["fedbuff", "ca2fl", "feddle", "hfcl"])
def test_a_batchnorm_run_with_statistics_in_the_methods_state_resumes_to_the_same_metrics(data8, tmp_path, name):
    """Buffered statistics (FedBuff's, CA2FL's sums; Feddle's anchors') and each dispatch round's survive a
    checkpoint: a stopped run resumes to the uninterrupted one's metrics and global statistics."""
    from support.asyncfl import comparable, preempt_at_round_3

    hparams = {"buffer_size": 3} if name in ("fedbuff", "ca2fl") else {}

    def build(log=lambda m: None):
        run = make_run(data8, build_method(name, **hparams), rounds=6, sigma=2.0)
        run.cfg = dataclasses.replace(run.cfg, checkpoint_every=2)
        run.log = log
        return run

    full_run = build()
    full = full_run.run()
    assert full.status == "complete"
    ckpt = tmp_path / "seed0.pt"
    preempt_at_round_3(build, ckpt)
    again = build()
    assert comparable(again.run(ckpt, "fp")) == comparable(full)
    torch.testing.assert_close(again.global_buffers, full_run.global_buffers)
