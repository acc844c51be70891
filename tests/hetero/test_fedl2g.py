"""FedL2G: the first-order feedback gradient (Eq. 9) is the exact gradient through theta'(G); uploads hold only
the study batch's classes; warm-up learns G without touching client models; the server step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from support.common import dirichlet_clients
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from fedrepro import seeding
from fedrepro.hetero.engine import META, HeteroConfig, HeteroRun
from fedrepro.hetero.methods import build_method
from fedrepro.hetero.methods.fedl2g import feedback_gradient, replayed_dropout
from fedrepro.models.cnn import SplitModel
from fedrepro.models.groups import build_arch
from fedrepro.sim.flat import FlatModel

C, K = 5, 6
CFG = HeteroConfig(rounds=3, batch_size=10, lr=0.05, drop_last=True)  # HtFLlib's loader


class TinyAttention(nn.Module):
    """The 8x8 image as 8 tokens of 8 through one transformer encoder layer (scaled dot-product attention, as
    the ViTs of the HtM10 group), mean-pooled to K features."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.out = nn.Sequential(nn.Linear(8, K), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layer(x.flatten(1, 2)).mean(1))


def tiny_models() -> dict[str, SplitModel]:
    """A conv net, an MLP with BatchNorm (train-mode statistics couple the batch's samples), one with dropout
    in the body (as GoogLeNet and MobileNetV2 keep before their feature pool) and an attention body."""
    torch.manual_seed(0)
    bn_body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, K),
                            nn.Tanh())
    dropout_body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Dropout(0.5), nn.Linear(12, K),
                                 nn.Tanh(), nn.Dropout(0.2))
    return {"resnet_mini": build_arch("resnet_mini", (8, 8, 1), C, K).double(),
            "mlp_bn": SplitModel(bn_body, K, C).double(),
            "mlp_dropout": SplitModel(dropout_body, K, C).double(),
            "attention": SplitModel(TinyAttention(), K, C).double()}


def exact_feedback(model, guide, xs, ys, xq, yq, lr, space, mask_seed=0):
    """d CE(f(x_q; theta'), y_q) / d G through theta'(G) = theta - lr grad[CE + MSE] with create_graph: one
    forward pass over the study batch (dropout mask ``replayed_dropout(mask_seed)``), one over the quiz batch
    (the global generator's next mask). Attention through its math kernel: the fused ones have no second
    derivative."""
    with sdpa_kernel(SDPBackend.MATH):
        return _exact_feedback(model, guide, xs, ys, xq, yq, lr, space, mask_seed)


def _exact_feedback(model, guide, xs, ys, xq, yq, lr, space, mask_seed):
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    guide = guide.clone().requires_grad_()

    def forward(p, x):
        b = {k: v.clone() for k, v in buffers.items()}
        feats = functional_call(model.body, {**{k[5:]: v for k, v in p.items() if k.startswith("body.")},
                                             **{k[5:]: v for k, v in b.items() if k.startswith("body.")}}, (x,))
        return feats, functional_call(model.head, {k[5:]: v for k, v in p.items() if k.startswith("head.")}, (feats,))

    with replayed_dropout(mask_seed, xs.device):
        feats, logits = forward(params, xs)
    z = logits if space == "logit" else feats
    study = F.cross_entropy(logits, ys) + F.mse_loss(z, guide[ys])
    grads = torch.autograd.grad(study, list(params.values()), create_graph=True)
    theta1 = {k: v - lr * g for (k, v), g in zip(params.items(), grads, strict=True)}
    quiz = F.cross_entropy(forward(theta1, xq)[1], yq)
    return torch.autograd.grad(quiz, guide)[0]


NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("space", ["logit", "feature"])
@pytest.mark.parametrize("arch,device", [("resnet_mini", "cpu"), ("mlp_bn", "cpu"), ("mlp_dropout", "cpu"),
                                         ("attention", "cpu"),  # forward AD through scaled dot-product attention
                                         pytest.param("mlp_dropout", "cuda", marks=NO_CUDA)])  # CUDA's fused dropout
def test_first_order_feedback_equals_the_exact_gradient_through_theta_prime(arch, device, space):
    model = tiny_models()[arch].to(device)
    gen = torch.Generator().manual_seed(1)
    guide = torch.randn(C, C if space == "logit" else K, generator=gen, dtype=torch.float64).to(device)
    xs = torch.randn(8, 1, 8, 8, generator=gen, dtype=torch.float64).to(device)
    ys = torch.tensor([0, 1, 1, 3, 3, 3, 0, 1], device=device)
    xq = torch.randn(5, 1, 8, 8, generator=gen, dtype=torch.float64).to(device)
    yq = torch.tensor([0, 2, 4, 1, 3], device=device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    stats = {k: v.clone() for k, v in buffers.items()}
    torch.manual_seed(3)  # the quiz pass's dropout mask: the same draw in both
    ours = feedback_gradient(model, params, buffers, guide, xs, ys, xq, yq, 0.05, space, mask_seed=11)
    torch.manual_seed(3)
    exact = exact_feedback(model, guide, xs, ys, xq, yq, 0.05, space, mask_seed=11)
    assert exact.abs().max() > 1e-6  # a real signal, not two zeros
    if arch == "mlp_dropout":  # the mask matters: another study-batch mask gives another gradient
        torch.manual_seed(3)
        other = feedback_gradient(model, params, buffers, guide, xs, ys, xq, yq, 0.05, space, mask_seed=12)
        assert not torch.allclose(other, exact)
    torch.testing.assert_close(ours, exact, rtol=1e-9, atol=1e-12)
    # only rows of classes in the study batch are non-zero (class 2 and 4 are only in the quiz batch)
    assert (ours.abs().sum(1) > 0).nonzero().squeeze(1).tolist() == [0, 1, 3]
    # the pseudo step changed neither the parameters nor the BatchNorm statistics
    assert all(torch.equal(stats[k], v) for k, v in buffers.items())
    # float32, as runs compute it: the same up to float32 rounding
    m32 = model.float()
    torch.manual_seed(3)
    ours32 = feedback_gradient(m32, {k: v.detach() for k, v in m32.named_parameters()},
                               {k: v.detach() for k, v in m32.named_buffers()}, guide.float(), xs.float(), ys,
                               xq.float(), yq, 0.05, space, mask_seed=11)
    torch.testing.assert_close(ours32.double(), exact, rtol=1e-3, atol=1e-6)


def peak_cpu_bytes(fn, *args) -> int:
    """The most CPU memory held at once by tensors allocated while ``fn(*args)`` runs: the profiler's allocation
    and free events, in order (deterministic, unlike the process's resident size)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("space", ["logit", "feature"])
def test_feedback_memory_grows_with_the_parameters_not_with_tensors_times_the_flat_vector(space):
    """Client models' parameters are views of one flat vector (FlatModel, as the hetero engine binds them); the
    JVP must not give each parameter tensor a tangent of the whole vector (ResNet18: 62 tensors, 2.8 GB)."""
    gen = torch.Generator().manual_seed(1)
    xs, xq = torch.randn(8, 1, 8, 8, generator=gen), torch.randn(5, 1, 8, 8, generator=gen)
    ys, yq = torch.tensor([0, 1, 1, 3, 3, 3, 0, 1]), torch.tensor([0, 2, 4, 1, 3])
    guide = torch.randn(C, C if space == "logit" else K, generator=gen)
    peaks, param_bytes = [], []
    for hidden_layers in (2, 16):  # 8 and 36 parameter tensors
        torch.manual_seed(0)
        body = nn.Sequential(nn.Flatten(), *[m for _ in range(hidden_layers) for m in (nn.Linear(64, 64), nn.Tanh())],
                             nn.Linear(64, K))
        model = SplitModel(body, K, C)
        flat = FlatModel(model)
        params = {k: v.detach() for k, v in model.named_parameters()}
        peaks.append(peak_cpu_bytes(feedback_gradient, model, params, {}, guide, xs, ys, xq, yq, 0.05, space))
        param_bytes.append(flat.w.numel() * flat.w.element_size())
    # five parameter-sized sets (g_s, theta', g_q, the JVP's primal and tangent): the peak grows 5x as fast as the
    # parameters; with a whole-vector tangent per tensor it held 12x the parameters for 8 tensors, 39x for 36
    assert peaks[1] - peaks[0] < 7 * (param_bytes[1] - param_bytes[0])


def make_run(data, parts, method="fedl2g_l", cfg=CFG, **hparams):
    return HeteroRun("tiny4", build_method(method, **hparams), data, parts, cfg, seed=0, feature_dim=K,
                     log=lambda m: None)


@pytest.mark.parametrize("method", ["fedl2g_l", "fedl2g_f"])
def test_uploads_hold_exactly_the_study_batch_classes(small_data, method):
    parts = dirichlet_clients(small_data.y_train.numpy(), beta=0.3)
    run = make_run(small_data, parts, method, warmup_rounds=0)
    alg = run.method
    uploads = {}
    original = alg.server_receive
    alg.server_receive = lambda cid, up, n: (uploads.__setitem__(cid, up), original(cid, up, n))
    run.run()  # the last round's uploads remain
    dim = 10 if method == "fedl2g_l" else K
    exact = 0
    for cid, up in uploads.items():
        train = run.train_idx[cid]
        q = alg.quiz_count(run.load_client(cid, 0))
        study = train[q:]
        gen = torch.Generator().manual_seed(seeding.derive_seed(0, META, CFG.rounds, cid))
        batch = study[torch.randperm(len(study), generator=gen)[: CFG.batch_size]]
        batch_classes = set(small_data.y_train[batch].tolist())
        assert set(up["classes"].tolist()) <= batch_classes  # only rows of the study batch's classes travel
        client = run.load_client(cid, 0)
        with torch.no_grad():
            feats = client.model.body(small_data.x_train[batch])
        if method == "fedl2g_l" or bool((feats.abs().sum(1) > 0).all()):
            # and all of them, unless ReLU features died (FedL2G-f pulls them towards N(0, 1) targets)
            assert up["classes"].tolist() == sorted(batch_classes)
            exact += 1
        assert up["rows"].shape == (len(up["classes"]), dim) and (up["rows"].abs().sum(1) > 0).all()
        assert up["classes"].dtype == torch.int32
        # the quiz set is never trained on: local SGD runs over the study set only
        assert set(alg.local_indices(run.load_client(cid, 0)).tolist()) == set(study.tolist())
        assert not set(train[:q].tolist()) & set(study.tolist())
    assert exact >= len(uploads) // 2


@pytest.mark.parametrize("method", ["fedl2g_l", "fedl2g_f"])
def test_warm_up_learns_the_guiding_vectors_and_leaves_client_models_unchanged(small_data, method):
    """Algorithm 1: for t <= T' a client skips local training (step 2) but still runs the pseudo step and
    sends feedback, so G is learned while no client parameter changes."""
    parts = dirichlet_clients(small_data.y_train.numpy())
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=2), warmup_rounds=2)
    before = {cid: w.clone() for cid, w in run.client_w.items()}
    guide0 = run.method.state["guide"].clone()
    result = run.run()
    assert all(torch.equal(run.client_w[cid], before[cid]) for cid in before)
    assert not torch.allclose(run.method.state["guide"], guide0)
    assert [r["warmup"] for r in result.history] == [1.0, 1.0]
    assert all(r["train_loss"] is None and r["round_bytes_up"] > 0 for r in result.history)
    # one round after the warm-up, clients train
    run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=3), warmup_rounds=2)
    result = run.run()
    assert all(not torch.equal(run.client_w[cid], before[cid]) for cid in before)
    assert result.history[-1]["warmup"] == 0.0 and result.history[-1]["train_loss"] > 0


def test_server_averages_each_class_over_its_senders_then_steps_with_eta_s(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    alg = make_run(small_data, parts, "fedl2g_l").method
    assert (alg.server_lr, build_method("fedl2g_f").server_lr) == (0.1, 100.0)
    g0 = alg.state["guide"].clone()
    alg.server_begin(1, None)
    alg.server_receive(0, {"classes": torch.tensor([1, 3], dtype=torch.int32), "rows": torch.ones(2, 10)}, 50)
    alg.server_receive(1, {"classes": torch.tensor([3], dtype=torch.int32), "rows": 3 * torch.ones(1, 10)}, 5)
    alg.server_end(1)
    step = g0 - alg.state["guide"]
    torch.testing.assert_close(step[1], 0.1 * torch.ones(10))
    torch.testing.assert_close(step[3], 0.1 * 2 * torch.ones(10))  # mean of 1 and 3, not size-weighted
    assert step[[0, 2, 4, 5, 6, 7, 8, 9]].abs().max() == 0  # classes nobody sent stay
    # the aggregated gradient's norm is clipped at 100 [code]
    alg.server_begin(2, None)
    alg.server_receive(0, {"classes": torch.tensor([0], dtype=torch.int32), "rows": 1e4 * torch.ones(1, 10)}, 5)
    g1 = alg.state["guide"].clone()
    alg.server_end(2)
    assert (g1 - alg.state["guide"]).norm().item() == pytest.approx(0.1 * 100, rel=1e-4)


def test_bytes_match_the_guiding_vectors_and_uploaded_rows(small_data):
    parts = dirichlet_clients(small_data.y_train.numpy())
    for method, dim in (("fedl2g_l", 10), ("fedl2g_f", K)):
        run = make_run(small_data, parts, method, cfg=dataclasses.replace(CFG, rounds=1))
        rows: list[int] = []
        original = run.method.server_receive
        run.method.server_receive = (
            lambda cid, up, n, o=original, rows=rows: (rows.append(len(up["classes"])), o(cid, up, n)))
        row = run.run().history[0]
        assert row["round_bytes_down"] == 4 * 10 * dim * 4  # G to each of 4 clients, float32
        assert row["round_bytes_up"] == sum(rows) * (dim * 4 + 4)  # float32 rows + int32 class ids
