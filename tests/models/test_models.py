"""Model zoo: shapes, gradients, no BatchNorm, parameter counts, determinism."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedrepro.models import MODELS, PRETRAINED_MODELS, TEXT_MODELS, build_model
from fedrepro.models.cnn import papers_order

SHAPES = [(28, 28, 1), (32, 32, 3)]
# the zoo's own models; Feddle's pretrained torchvision models (BatchNorm, frozen parts, 224x224 inside) are
# tested in tests/datasets/test_pretrained.py
ZOO = sorted(set(MODELS) - TEXT_MODELS - PRETRAINED_MODELS)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ZOO)
def test_forward_backward(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, num_classes=7)
    h, w, c = shape
    x = torch.randn(3, c, h, w)
    feats = model.body(x)
    assert feats.shape == (3, model.feature_dim)
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (model.feature_dim, 7)
    out = model(x)
    assert out.shape == (3, 7)
    assert torch.allclose(out, model.head(feats))
    out.logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert any(p.grad.abs().sum() > 0 for p in model.body.parameters())


@pytest.mark.parametrize("name", ZOO)
def test_no_batchnorm_no_dropout(name: str) -> None:
    model = build_model(name, (32, 32, 3), 10)
    banned = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    assert not any(isinstance(m, banned) for m in model.modules())
    assert not list(model.buffers()), "running statistics would be averaged wrongly across clients"


def test_simple_cnn_parameter_counts() -> None:
    # conv 3*6*25+6, conv 6*16*25+16, fc 400*120+120, 120*84+84, head 84*10+10
    assert n_params(build_model("simple_cnn", (32, 32, 3), 10)) == 456 + 2416 + 48120 + 10164 + 850 == 62006
    # FMNIST variant: 1 channel, flatten 16*4*4 = 256
    assert n_params(build_model("simple_cnn", (28, 28, 1), 10)) == 156 + 2416 + 30840 + 10164 + 850
    assert build_model("simple_cnn", (32, 32, 3), 10).feature_dim == 84


def test_lenet5_pads_small_inputs() -> None:
    # Padding 2 on 28x28 gives LeNet's 16*5*5 = 400 flatten, as for 32x32.
    small, big = build_model("lenet5", (28, 28, 1), 10), build_model("lenet5", (32, 32, 3), 10)
    assert small.body[7].in_features == big.body[7].in_features == 400


def test_cnn4_dims() -> None:
    m = build_model("cnn4", (32, 32, 3), 10)
    assert m.feature_dim == 512 and m.body[7].in_features == 1600
    assert build_model("cnn4", (28, 28, 1), 10).body[7].in_features == 1024


POOL_FIRST = ["simple_cnn", "lenet5", "cnn4", "cnn3", "cnn3_small"]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("name", POOL_FIRST)
def test_pool_before_relu_is_exact(name: str, channels_last: bool) -> None:
    """Pooling before the ReLU (for speed) gives the papers' conv-ReLU-pool outputs and gradients bit for bit."""
    torch.manual_seed(3)
    model = build_model(name, (28, 28, 1), 10)
    reference = papers_order(model.body)
    assert [type(m) for m in reference] != [type(m) for m in model.body], "no pool-then-ReLU pair to swap"
    x = torch.randn(32, 1, 28, 28) - 0.3  # many windows wholly negative: the ReLU's zeros, ties in the pool
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (32,))
    grads = []
    for body in (model.body, reference):
        model.zero_grad()
        out = model.head(body(x))
        nn.functional.cross_entropy(out, y).backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (out_a, grads_a), (out_b, grads_b) = grads
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def test_resnet18_gn() -> None:
    m = build_model("resnet18_gn", (32, 32, 3), 10)
    assert m.feature_dim == 512
    assert abs(n_params(m) - 11.17e6) < 0.05e6
    gns = [g for g in m.modules() if isinstance(g, nn.GroupNorm)]
    assert len(gns) == 1 + 16 + 3 and all(g.num_groups == 2 for g in gns)
    m4 = build_model("resnet18_gn", (32, 32, 3), 10, num_groups=4)
    assert all(g.num_groups == 4 for g in m4.modules() if isinstance(g, nn.GroupNorm))


def test_deterministic_given_seed() -> None:
    for name in ZOO:
        torch.manual_seed(7)
        a = build_model(name, (28, 28, 1), 10)
        torch.manual_seed(7)
        b = build_model(name, (28, 28, 1), 10)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_unknown_model_lists_names() -> None:
    with pytest.raises(ValueError, match="cnn4, lenet5, resnet18_gn, resnet18_imagenet, simple_cnn"):
        build_model("vgg", (32, 32, 3), 10)


def test_no_torchvision() -> None:
    """Importing the models (and building the homogeneous ones) does not import torchvision (seconds of
    start-up per train job); only FedL2G's paper-scale groups import it, when built. A fresh interpreter:
    other tests in this process build those groups."""
    import subprocess
    import sys

    code = ("import sys; from fedrepro.models import build_model; from fedrepro.models import groups; "
            "build_model('cnn4', (28, 28, 1), 10); groups.build_arch('resnet_mini', (16, 16, 1), 10); "
            "sys.exit('torchvision' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
