"""The heterogeneous-model engine: per-client architectures and states, own 75/25 splits, pooled and
per-client accuracy, measured bytes, exact resumes, divergence."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients
from torch import nn

from fedrepro import seeding
from fedrepro.hetero.engine import HeteroConfig, HeteroRun, payload_bytes, pooled, split_client
from fedrepro.hetero.methods import build_method
from fedrepro.models.groups import ARCHITECTURES, GROUPS, build_arch, group_members
from fedrepro.sim.batches import epoch_batches
from fedrepro.sim.checkpoint import CheckpointError, save_checkpoint

FD = 16  # feature dimension of the tiny test models
CFG = HeteroConfig(rounds=2, batch_size=10, lr=0.05, checkpoint_every=1, drop_last=True)  # HtFLlib's
TIMING = ("seconds", "client_seconds", "server_seconds")


def make_run(data, parts, method="local", hparams=None, cfg=CFG, seed=0, group="tiny4"):
    return HeteroRun(group, build_method(method, **(hparams or {})), data, parts, cfg, seed, feature_dim=FD,
                     log=lambda m: None)


def metrics(result):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in result.history]


def test_groups_list_the_papers_architectures_and_the_embedded_one_is_heterogeneous():
    assert GROUPS["HtFE8"] == ("cnn4", "googlenet", "mobilenet_v2", "resnet18", "resnet34", "resnet50",
                               "resnet101", "resnet152")
    assert GROUPS["HtM10"] == (*GROUPS["HtFE8"], "vit_b_16", "vit_b_32")
    assert GROUPS["HtFE9"][:4] == ("resnet4", "resnet6", "resnet8", "resnet10")
    assert all(name in ARCHITECTURES for members in GROUPS.values() for name in members)
    with pytest.raises(ValueError, match="unknown"):
        group_members(["mlp", "nope"])
    members = group_members("tiny4")
    assert len(members) >= 4
    x = torch.randn(3, 1, 28, 28)
    kinds = set()
    for name in members:
        model = build_arch(name, (28, 28, 1), 10, feature_dim=FD)
        assert model.body(x).shape == (3, FD) and model(x).shape == (3, 10)
        kinds.add(tuple(type(m).__name__ for m in model.body.modules()))
    assert len(kinds) == len(members)  # structurally distinct networks


def test_client_split_is_75_25_seeded_and_disjoint():
    tr, te = split_client(21, 0.75, seed=3, cid=2)
    assert (len(tr), len(te)) == (15, 6)  # ceil(25%) to test, as sklearn's train_test_split
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(21))
    again = split_client(21, 0.75, seed=3, cid=2)
    assert np.array_equal(tr, again[0])
    assert not np.array_equal(tr, split_client(21, 0.75, seed=3, cid=1)[0])


def test_a_fixed_split_seed_gives_every_trial_the_same_client_train_and_test_sets(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=5, beta=5.0)

    def splits(seed, split_seed=None):
        run = HeteroRun("tiny4", build_method("local"), small_data, parts, CFG, seed, feature_dim=FD,
                        log=lambda m: None, split_seed=split_seed)
        return [t.tolist() for t in run.train_idx], [t.tolist() for t in run.test_idx]

    assert splits(0, split_seed=7) == splits(1, split_seed=7) == splits(7)  # the trials share them
    assert splits(0) != splits(1)  # unset: each seed draws its own


def test_client_i_gets_architecture_i_mod_x_with_its_own_initial_weights(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=5, beta=5.0)
    run = make_run(small_data, parts)
    group = GROUPS["tiny4"]
    assert run.arch_of == [group[i % 4] for i in range(5)]
    assert len(run.modules) == 4  # one computing module per architecture, not one per client
    assert not torch.equal(run.client_w[0], run.client_w[4])  # same architecture, own seeded init
    for cid, idx in enumerate(parts):
        tr, te = run.train_idx[cid].numpy(), run.test_idx[cid].numpy()
        assert len(te) == math.ceil(0.25 * len(idx)) and set(tr) | set(te) == set(idx.tolist())


def test_local_training_is_plain_sgd_on_the_clients_own_split(small_data):
    """Method "local" shares nothing: client 0's model after two rounds is torch.optim.SGD on its own train
    split, in the engine's seeded batches (dropping the last partial batch), from its own initial model."""
    parts = dirichlet_clients(small_data.y_train.numpy())
    run = make_run(small_data, parts)
    run.run()
    torch.manual_seed(seeding.derive_seed(0, seeding.INIT, 0))
    net = build_arch("mlp", small_data.shape, small_data.num_classes, FD)
    tr, _ = split_client(len(parts[0]), 0.75, 0, 0)
    idx = torch.as_tensor(parts[0][tr])
    opt = torch.optim.SGD(net.parameters(), lr=CFG.lr)
    stop = len(idx) - len(idx) % CFG.batch_size
    for rnd in (1, 2):
        gen = torch.Generator().manual_seed(seeding.derive_seed(0, seeding.BATCHES, rnd, 0))
        order = idx[torch.randperm(len(idx), generator=gen)]
        for start in range(0, stop, CFG.batch_size):
            b = order[start : start + CFG.batch_size]
            opt.zero_grad()
            F.cross_entropy(net(small_data.x_train[b]), small_data.y_train[b]).backward()
            opt.step()
    expected = run.flats["mlp"].vector_of([p.detach() for p in net.parameters()])
    assert torch.allclose(run.client_w[0], expected, atol=1e-6)


def test_local_batches_are_the_shared_epoch_definition(small_data):
    """The heterogeneous engine's epochs are sim/batches.py's: floor(n / B) batches with drop_last (HtFLlib's
    DataLoader), ceil(n / B) without, one short batch for a client smaller than a batch either way."""
    parts = dirichlet_clients(small_data.y_train.numpy())
    for drop_last in (True, False):
        run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, local_epochs=2, drop_last=drop_last))
        for idx in (torch.arange(23), torch.arange(7)):
            sizes = [len(b) for b in run.local_batches(idx, torch.Generator().manual_seed(0))]
            per_epoch = [len(b) for b in epoch_batches(idx, CFG.batch_size, drop_last)]
            assert sizes == per_epoch * 2
    assert [len(b) for b in epoch_batches(torch.arange(23), 10, True)] == [10, 10]


def test_clients_not_sampled_keep_their_model(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    run = make_run(small_data, parts, cfg=dataclasses.replace(CFG, rounds=1, join_ratio=0.5))
    before = {cid: w.clone() for cid, w in run.client_w.items()}
    run.run()
    sampled = set(run.sample_clients(1).tolist())
    assert len(sampled) == 2
    for cid in range(4):
        assert torch.equal(run.client_w[cid], before[cid]) != (cid in sampled)


def test_accuracy_is_reported_pooled_and_averaged_per_client(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy(), beta=0.3)
    run = make_run(small_data, parts)
    row = run.run().history[-1]
    correct, per_client = [], []
    for cid in range(4):
        client = run.load_client(cid, 0)
        client.model.eval()
        idx = run.test_idx[cid]
        with torch.no_grad():
            right = (client.model(small_data.x_train[idx]).argmax(1) == small_data.y_train[idx]).sum().item()
        correct.append(right)
        per_client.append(100.0 * right / len(idx))
    total = sum(len(run.test_idx[c]) for c in range(4))
    assert row["test_acc"] == pytest.approx(100.0 * sum(correct) / total)
    assert row["client_acc_mean"] == pytest.approx(np.mean(per_client))
    assert row["client_acc_var"] == pytest.approx(np.var(per_client))


def test_bytes_are_measured_per_round_and_cumulated(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    local = make_run(small_data, parts).run()
    assert all(r["bytes_up"] == r["bytes_down"] == 0 for r in local.history)
    lg = make_run(small_data, parts, "lg_fedavg").run()
    head = (FD * 10 + 10) * 4  # float32 Linear(K, C)
    first, second = lg.history
    # round 1 already sends the server's head (client 0's initial one, as HtFLlib's LG-FedAvg)
    assert first["round_bytes_up"] == first["round_bytes_down"] == 4 * head
    assert second["round_bytes_down"] == 4 * head
    assert second["bytes_up"] == second["bytes_down"] == 8 * head
    assert all(r["client_seconds"] > 0 and r["server_seconds"] >= 0 for r in lg.history)
    nested = {"a": torch.zeros(3), "b": {"u": torch.zeros(2, 2, dtype=torch.float64)},
              "c": [torch.zeros(1, dtype=torch.int32)]}
    assert payload_bytes(nested) == 12 + 32 + 4


def test_identical_seeds_give_identical_metrics_and_other_seeds_do_not(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    a, b = make_run(small_data, parts, "fedproto").run(), make_run(small_data, parts, "fedproto").run()
    assert metrics(a) == metrics(b)
    assert metrics(make_run(small_data, parts, "fedproto", seed=1).run()) != metrics(a)


def test_offloaded_client_states_give_the_same_run(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    on = make_run(small_data, parts, "fml").run()
    off_run = make_run(small_data, parts, "fml", cfg=dataclasses.replace(CFG, offload=True))
    assert off_run.client_w[0].device.type == "cpu"
    assert metrics(off_run.run()) == metrics(on)


@pytest.mark.parametrize("method,hparams", [("fedl2g_f", {"warmup_rounds": 2}), ("fedkd", {}), ("fedgh", {})])
def test_interrupted_run_resumes_to_identical_metrics(small_data, tmp_path, method, hparams):
    parts = dirichlet_clients(small_data.y_train.numpy())
    cfg = dataclasses.replace(CFG, rounds=5, checkpoint_every=2)
    full = make_run(small_data, parts, method, hparams, cfg=cfg).run()

    ckpt = tmp_path / "seed0.pt"
    crashing = make_run(small_data, parts, method, hparams, cfg=cfg)
    original_end, calls = crashing.method.server_end, []

    def crash_in_round_4(rnd):
        if rnd == 4:
            raise KeyboardInterrupt("killed")
        calls.append(rnd)
        return original_end(rnd)

    crashing.method.server_end = crash_in_round_4
    with pytest.raises(KeyboardInterrupt):
        crashing.run(ckpt, "fp")
    assert torch.load(ckpt, weights_only=False)["round"] == 2
    logs = []
    resumed = make_run(small_data, parts, method, hparams, cfg=cfg)
    resumed.log = logs.append
    result = resumed.run(ckpt, "fp")
    assert any("after round 2" in m for m in logs)
    assert metrics(result) == metrics(full)


def test_checkpoint_of_the_homogeneous_engine_is_refused(small_data, tmp_path):
    ckpt = tmp_path / "seed0.pt"
    save_checkpoint(ckpt, "fp", {"round": 1, "w": torch.zeros(3)})
    with pytest.raises(CheckpointError, match="heterogeneous"):
        make_run(small_data, dirichlet_clients(small_data.y_train.numpy())).run(ckpt, "fp")


def test_divergence_stops_the_run_and_says_when(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    result = make_run(small_data, parts, cfg=dataclasses.replace(CFG, lr=1e5, rounds=6)).run()
    assert result.status == "diverged"
    assert result.history[-1]["round"] == result.diverged_round <= 6


def test_a_finite_but_exploding_loss_counts_as_divergence_as_in_the_other_engines(small_data, monkeypatch):
    from fedrepro.sim import runs

    parts = dirichlet_clients(small_data.y_train.numpy())
    assert make_run(small_data, parts).run().status == "complete"
    monkeypatch.setattr(runs, "DIVERGED_LOSS", 1e-3)  # every real loss is above this
    flagged = make_run(small_data, parts).run()
    assert flagged.status == "diverged" and flagged.diverged_round == 1


def test_pooled_data_holds_train_and_test_samples(small_data):
    pool = pooled(small_data)
    assert len(pool.y_train) == len(small_data.y_train) + len(small_data.y_test) and len(pool.y_test) == 0


@pytest.mark.parametrize("arch", sorted({a for g, members in GROUPS.items() if g != "tiny4" for a in members}))
def test_every_paper_scale_architecture_runs_on_32x32_and_ends_in_512_features(arch):
    """FedL2G's groups (HtFE2/3/4/8/9, HtM10): each member builds, runs forward and backward on a small
    32x32 colour batch, and ends in the 512-d feature every method exchanges or aligns."""
    torch.manual_seed(0)
    model = build_arch(arch, (32, 32, 3), 100)  # the paper's feature_dim default: 512
    x = torch.randn(2, 3, 32, 32)
    features = model.body(x)
    assert features.shape == (2, 512)
    logits = model.head(features)
    assert logits.shape == (2, 100)
    F.cross_entropy(logits, torch.tensor([3, 7])).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads[:3])  # the gradient reaches the first layers


@pytest.mark.parametrize("arch", ["googlenet", "mobilenet_v2"])
def test_googlenet_and_mobilenet_bodies_keep_their_dropout_before_the_pool_to_512(arch):
    """HtFLlib's BaseHeadSplit replaces only the classifier Linear: torchvision's GoogLeNet and HtFLlib's own
    MobileNetV2 keep Dropout(0.2) after the global average pool, in the body; the head is one Linear."""
    torch.manual_seed(0)
    model = build_arch(arch, (32, 32, 3), 10)
    dropouts = [m for m in model.body.modules() if isinstance(m, nn.Dropout)]
    assert [m.p for m in dropouts] == [0.2]
    stem = model.body.classifier if arch == "mobilenet_v2" else model.body
    names = [type(m).__name__ for m in stem.children()]
    assert names[-2:] == ["Dropout", "PoolTo"]  # dropout on the pooled features, then the pool to K
    assert isinstance(model.head, nn.Linear)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.body(x), model.body(x))
        model.train()
        assert not torch.equal(model.body(x), model.body(x))  # train mode drops units


def test_early_stop_ends_a_hetero_run_that_stopped_improving(small_data, tmp_path):
    # the shared round loop (sim/loop.py) stops every federation alike: a learning rate too small to move any
    # client's test accuracy keeps the best at round 1, so with patience 2 round 3 ends the run of 8
    parts = dirichlet_clients(small_data.y_train.numpy())
    cfg = dataclasses.replace(CFG, rounds=8, lr=1e-9, early_stop=2)
    ckpt = tmp_path / "ckpt.pt"
    logs: list[str] = []
    run = HeteroRun("tiny4", build_method("local"), small_data, parts, cfg, 0, feature_dim=FD, log=logs.append)
    result = run.run(ckpt, "fp")
    assert [row["round"] for row in result.history] == [1, 2, 3]
    assert result.stopped_round == 3 and result.status == "complete"
    assert any("early stop after round 3" in m for m in logs)
    resumed = make_run(small_data, parts, cfg=cfg).run(ckpt, "fp")  # finished: nothing is trained again
    assert metrics(resumed) == metrics(result) and resumed.stopped_round == 3
