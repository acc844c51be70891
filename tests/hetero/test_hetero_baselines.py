"""The six FedL2G baselines: each one's defining property."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients
from torch import nn

from fedrepro import seeding
from fedrepro.hetero.base import head_of
from fedrepro.hetero.engine import SERVER_TRAIN, HeteroConfig, HeteroRun, payload_bytes
from fedrepro.hetero.methods import build_method
from fedrepro.hetero.methods.fedkd import svd_compress, svd_recover

K = 16
CFG = HeteroConfig(rounds=2, batch_size=10, lr=0.05, drop_last=True)  # HtFLlib's loader


def make_run(data, parts, method, cfg=CFG, **hparams):
    return HeteroRun("tiny4", build_method(method, **hparams), data, parts, cfg, seed=0, feature_dim=K,
                     log=lambda m: None)


def record_uploads(run):
    """Wrap server_receive: the last round's uploads by client id, with their training-set sizes."""
    seen = {}
    original = run.method.server_receive

    def receive(cid, upload, n):
        seen[cid] = (upload, n)
        original(cid, upload, n)

    run.method.server_receive = receive
    return seen


@pytest.fixture(scope="module")
def parts(small_data):
    return dirichlet_clients(small_data.y_train.numpy(), n_clients=5, beta=0.5)


def test_lg_fedavg_averages_heads_by_size_and_never_bodies(small_data, parts):
    run = make_run(small_data, parts, "lg_fedavg", cfg=dataclasses.replace(CFG, rounds=1))
    head0 = {k: v.clone() for k, v in run.method.state["head"].items()}
    torch.testing.assert_close(head0["weight"], run.client_params(0, "head.")["weight"])  # client 0's head
    ups = record_uploads(run)
    run.run()
    total = sum(n for _, n in ups.values())
    for name in ("weight", "bias"):
        expected = sum(up["head"][name] * n for up, n in ups.values()) / total
        torch.testing.assert_close(run.method.state["head"][name], expected)
    # round 1's clients start from client 0's initial head [HtFLlib], then train as local training does
    local = make_run(small_data, parts, "local", cfg=dataclasses.replace(CFG, rounds=1))
    for c in range(5):
        local.flats[local.arch_of[c]].as_params(local.client_w[c], "head.")["weight"].copy_(head0["weight"])
        local.flats[local.arch_of[c]].as_params(local.client_w[c], "head.")["bias"].copy_(head0["bias"])
    local.run()
    assert all(torch.equal(run.client_w[c], local.client_w[c]) for c in range(5))
    # the next round's clients get the averaged head, their bodies stay their own
    client = run.load_client(4, 2)
    body = {k: v.clone() for k, v in client.model.body.state_dict().items()}
    run.method.receive(client, run.method.broadcast(4, 2))
    torch.testing.assert_close(client.model.head.weight, run.method.state["head"]["weight"])
    assert all(torch.equal(v, client.model.body.state_dict()[k]) for k, v in body.items())
    assert not torch.equal(run.client_w[0], run.client_w[4])  # same architecture, bodies never averaged


@pytest.mark.parametrize("method", ["lg_fedavg", "fedgh"])
def test_head_sharing_methods_refuse_heterogeneous_heads(small_data, parts, method):
    run = make_run(small_data, parts, "local")
    run.modules["mlp"].head = nn.Sequential(nn.Linear(K, 8), nn.Tanh(), nn.Linear(8, 10))  # an HtM10-like head
    with pytest.raises(ValueError, match="one head shape"):
        build_method(method).setup(run)


@pytest.mark.parametrize("method", ["lg_fedavg", "fedgh"])
def test_head_sharing_methods_evaluate_every_client_with_the_global_head(small_data, parts, method):
    """HtFLlib's servers write the global head into every client's model before evaluating it: the scored
    logits are the global head's on the client's own features, sampled this round or not."""
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=2, join_ratio=0.6))
    run.run()
    global_head = run.method.state["head"]
    scored = {}
    original = run.method.predict

    def predict(client, features, logits):
        scored[client.cid] = (head_of(client.model), features, logits)
        return original(client, features, logits)

    run.method.predict = predict
    run.evaluate()
    assert sorted(scored) == list(range(5))
    for head, features, logits in scored.values():
        torch.testing.assert_close(head["weight"], global_head["weight"])
        torch.testing.assert_close(head["bias"], global_head["bias"])
        torch.testing.assert_close(logits, F.linear(features, global_head["weight"], global_head["bias"]))
    # the clients' stored heads are their own (locally trained or older), untouched by the evaluation
    own = [run.client_params(c, "head.")["weight"] for c in range(5)]
    assert not any(torch.equal(w, global_head["weight"]) for w in own)


def test_fedgh_uploads_class_prototypes_and_trains_the_global_head_on_them(small_data, parts):
    run = make_run(small_data, parts, "fedgh", cfg=dataclasses.replace(CFG, rounds=1))
    head0 = {k: v.clone() for k, v in run.method.state["head"].items()}
    torch.testing.assert_close(head0["weight"], run.client_params(0, "head.")["weight"])  # client 0's head
    ups = record_uploads(run)
    run.run()
    protos, labels = [], []
    for cid in range(5):
        up, _ = ups[cid]
        client = run.load_client(cid, 0)  # its model after this round's training
        client.model.eval()
        idx = run.train_idx[cid]
        with torch.no_grad():
            feats = client.model.body(small_data.x_train[idx])
        y = small_data.y_train[idx]
        classes = sorted(set(y.tolist()))
        assert up["classes"].tolist() == classes
        means = torch.stack([feats[y == c].mean(0) for c in classes])
        torch.testing.assert_close(up["protos"], means, rtol=1e-5, atol=1e-6)
        protos.append(up["protos"])
        labels.append(up["classes"].long())
    # one server epoch of SGD (lr 0.01, the clients' batch size, seeded shuffle) from the previous head
    head = nn.Linear(K, 10)
    head.load_state_dict(head0)
    opt = torch.optim.SGD(head.parameters(), lr=0.01)
    p, y = torch.cat(protos), torch.cat(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seeding.derive_seed(0, SERVER_TRAIN, 1)))
    for start in range(0, len(y), CFG.batch_size):
        b = order[start : start + CFG.batch_size]
        opt.zero_grad()
        F.cross_entropy(head(p[b]), y[b]).backward()
        opt.step()
    torch.testing.assert_close(run.method.state["head"]["weight"], head.weight.detach())
    torch.testing.assert_close(run.method.state["head"]["bias"], head.bias.detach())


@pytest.mark.parametrize("method", ["fml", "fedkd"])
def test_shared_auxiliary_model_is_averaged_and_private_models_are_not(small_data, parts, method):
    run = make_run(small_data, parts, method)
    alg = run.method
    assert alg.aux_arch == min(run.group, key=lambda a: run.flats[a].numel)  # the smallest member
    ups = record_uploads(run)
    before = {c: w.clone() for c, w in run.client_w.items()}
    run.run()
    if method == "fml":
        uploaded = [up["aux"] for up, _ in ups.values()]
    else:
        uploaded = [alg.vector(svd_recover(up["aux"], alg.shapes)) for up, _ in ups.values()]
    torch.testing.assert_close(alg.state["aux"], sum(uploaded) / len(uploaded))  # equal weights
    assert len({tuple(u[:5].tolist()) for u in uploaded}) == 5  # each client trained its own copy
    # private models: trained, kept per client, never replaced by an average
    assert all(not torch.equal(run.client_w[c], before[c]) for c in range(5))
    assert not torch.allclose(run.client_w[0], run.client_w[4])
    assert all(run.client_w[c].numel() == run.flats[run.arch_of[c]].numel for c in range(5))
    if method == "fedkd":  # the hidden-state map W_h is private too
        assert set(alg.state["w_h"]) == set(range(5))
        assert not torch.equal(alg.state["w_h"][0], alg.state["w_h"][1])


def test_fedkd_svd_keeps_the_fewest_singular_values_above_the_energy():
    gen = torch.Generator().manual_seed(0)
    low_rank = torch.randn(40, 3, generator=gen) @ torch.randn(3, 30, generator=gen) + 1e-3 * torch.randn(40, 30,
                                                                                                       generator=gen)
    conv = torch.randn(8, 4, 3, 3, generator=gen)
    bias = torch.randn(40, generator=gen)
    params = {"w": low_rank, "conv": conv, "b": bias}
    msg = svd_compress(params, 0.95)
    s = msg["w"]["s"]
    full = torch.linalg.svdvals(low_rank)
    r = len(s)
    assert r <= 3
    energy = full.square().cumsum(0) / full.square().sum()
    assert energy[r - 1] > 0.95 and (r == 1 or energy[r - 2] <= 0.95)
    assert payload_bytes(msg["w"]) == r * (40 + 30 + 1) * 4 < low_rank.numel() * 4
    assert torch.equal(msg["b"], bias)  # 1-d: dense
    back = svd_recover(msg, {k: t.shape for k, t in params.items()})
    assert back["conv"].shape == conv.shape
    assert (back["w"] - low_rank).norm() <= (0.05 ** 0.5) * low_rank.norm()
    # random full-rank matrices at a high energy: factors would be larger, so they travel dense
    dense = svd_compress({"w": torch.randn(10, 10, generator=gen)}, 0.999)
    assert isinstance(dense["w"], torch.Tensor)


@pytest.mark.parametrize("method", ["fed_distill", "fedproto"])
def test_global_prototype_is_the_equal_weight_class_mean_of_client_prototypes(small_data, parts, method):
    """HtFLlib's proto_aggregation by default: every client that sent class c counts once, whatever its size."""
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=1))
    ups = record_uploads(run)
    run.run()
    assert all("counts" not in up for up, _ in ups.values())  # nothing to weight by: no counts travel
    present = torch.zeros(10, dtype=torch.bool)
    for c in range(10):
        rows = [up["rows"][up["classes"].tolist().index(c)] for up, _ in ups.values() if c in up["classes"].tolist()]
        if rows:
            present[c] = True
            torch.testing.assert_close(run.method.state["global"][c], sum(rows) / len(rows))
    assert torch.equal(run.method.state["present"], present)
    # FedProto's Eq. 6 on request: weighted by the clients' class counts, which they then upload
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=1), aggregation="samples")
    ups = record_uploads(run)
    run.run()
    dim = 10 if method == "fed_distill" else K
    num = torch.zeros(10, dim)
    den = torch.zeros(10)
    for up, _ in ups.values():
        cls = up["classes"].long()
        num[cls] += up["rows"] * up["counts"].float().unsqueeze(1)
        den[cls] += up["counts"].float()
    assert torch.equal(run.method.state["present"], den > 0)
    torch.testing.assert_close(run.method.state["global"][den > 0], num[den > 0] / den[den > 0].unsqueeze(1))


@pytest.mark.parametrize("method", ["fed_distill", "fedproto"])
def test_uploaded_prototypes_are_the_class_means_of_training_outputs(small_data, parts, method):
    """With lr = 0 the model is fixed, so the per-class average of the outputs produced while training is
    the class mean of the model's outputs over the trained batches."""
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=1, lr=0.0, local_epochs=2),
                   aggregation="samples")  # the counts travel only where the server weights by them
    ups = record_uploads(run)
    run.run()
    for cid in (0, 3):
        up, _ = ups[cid]
        client = run.load_client(cid, 1)
        gen = torch.Generator().manual_seed(seeding.derive_seed(0, seeding.BATCHES, 1, cid))
        idx = torch.cat(list(run.local_batches(run.train_idx[cid], gen)))
        with torch.no_grad():
            feats = client.model.body(small_data.x_train[idx])
            z = client.model.head(feats) if method == "fed_distill" else feats
        y = small_data.y_train[idx]
        classes = up["classes"].long()
        assert classes.tolist() == sorted(set(y.tolist()))
        assert up["counts"].tolist() == [int((y == c).sum()) for c in classes]
        torch.testing.assert_close(up["rows"], torch.stack([z[y == c].mean(0) for c in classes]),
                                   rtol=1e-5, atol=1e-5)


def test_guiding_terms_pull_only_towards_classes_with_a_global_prototype(small_data, parts):
    for method in ("fed_distill", "fedproto"):
        run = make_run(small_data, parts, method)
        alg = run.method
        client = run.load_client(0, 1)
        dim = alg.dim
        full = torch.randn(10, dim)
        mask = torch.zeros(10, dtype=torch.bool)
        alg.receive(client, {})
        idx = run.train_idx[0][:10]
        x, y = small_data.x_train[idx], small_data.y_train[idx]
        client.flat.zero_grad()
        alg.local_loss(client, x, y)[0].backward()  # no global prototypes at all: plain CE
        g_plain = client.flat.g.clone()
        client.extras["target"] = (full, mask)  # prototypes, but none for these classes: no pull
        client.flat.zero_grad()
        alg.local_loss(client, x, y)[0].backward()
        g_none = client.flat.g.clone()
        torch.testing.assert_close(g_none, g_plain)
        mask[y[0]] = True  # one class guided: the gradient changes
        client.flat.zero_grad()
        alg.local_loss(client, x, y)[0].backward()
        assert not torch.allclose(client.flat.g, g_none)


def test_fedproto_classifies_by_the_nearest_global_prototype(small_data, parts):
    run = make_run(small_data, parts, "fedproto", cfg=dataclasses.replace(CFG, rounds=1))
    alg = run.method
    client = run.load_client(0, 0)
    feats = torch.randn(6, K)
    logits = torch.randn(6, 10)
    assert torch.equal(alg.predict(client, feats, logits), logits.argmax(1))  # no prototypes yet: the head
    protos = torch.randn(10, K)
    present = torch.ones(10, dtype=torch.bool)
    present[3] = False
    alg.state.update({"global": protos, "present": present})
    feats = protos[[3, 5, 7, 5, 0, 9]] + 1e-3
    pred = alg.predict(client, feats, logits)
    assert pred[1:].tolist() == [5, 7, 5, 0, 9] and pred[0].item() != 3  # class 3 has no prototype
    head = build_method("fedproto", inference="head")
    head.state = alg.state
    assert torch.equal(head.predict(client, feats, logits), logits.argmax(1))


def test_bytes_per_round_follow_each_method_s_payload(small_data, parts):
    """Communication is measured: per-round bytes follow from each method's payload."""
    rows = {}
    for method in ("lg_fedavg", "fedgh", "fml", "fedkd", "fed_distill", "fedproto"):
        run = make_run(small_data, parts, method)
        rows[method] = (run.run().history[-1], run)
    head = (K * 10 + 10) * 4
    assert rows["lg_fedavg"][0]["round_bytes_up"] == rows["lg_fedavg"][0]["round_bytes_down"] == 5 * head
    assert rows["fedgh"][0]["round_bytes_down"] == 5 * head
    aux = rows["fml"][1].method.aux_flat.numel * 4
    assert rows["fml"][0]["round_bytes_up"] == rows["fml"][0]["round_bytes_down"] == 5 * aux
    assert rows["fedkd"][0]["round_bytes_up"] <= 5 * aux
    assert rows["fed_distill"][0]["round_bytes_down"] == 5 * 10 * (10 * 4 + 4)  # every class has a prototype
    assert rows["fedproto"][0]["round_bytes_down"] == 5 * 10 * (K * 4 + 4)
