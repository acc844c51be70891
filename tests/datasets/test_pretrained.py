"""Feddle's pretrained models: the weights download (sha256 prefix in the name, mirror, quarantine), the
torchvision ResNet-18 and ViT-B/16 + LoRA really using the weights file, and frozen parameters staying out of
the flat vectors the engines train, average and count as communication.

Downloads go to the throwaway HTTP server of tests/datasets/test_data.py on 127.0.0.1. The models' weights are state
dicts saved from freshly built (random) torchvision models: no network, the same loading path as the real
files."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from support.files import FileServer
from torch import nn

from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import METHODS, build_method, hyperparameters
from fedrepro.data import weights as wmod
from fedrepro.data.download import ChecksumError
from fedrepro.models import PRETRAINED_MODELS, build_model
from fedrepro.models.cnn import SplitModel
from fedrepro.models.lora import QueryValueLoRA, add_lora, freeze_except
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import to_device_data

torch.set_num_threads(1)
tv_models = pytest.importorskip("torchvision.models")

# ---------------------------------------------------------------- weights download


def fake_weights() -> tuple[str, bytes]:
    """A small .pth whose name carries its own sha256 prefix, as torchvision names its files."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, buf)
    data = buf.getvalue()
    return f"fake-{hashlib.sha256(data).hexdigest()[:8]}", data


def test_good_weights_are_accepted(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    name, data = fake_weights()
    server.files[f"{name}.pth"] = data
    dest = tmp_path / f"{name}.pth"
    assert wmod.fetch_verified(name, dest, server.url + f"{name}.pth") == dest
    assert dest.read_bytes() == data
    assert torch.equal(torch.load(dest, weights_only=True)["w"], torch.arange(6.0).reshape(2, 3))
    wmod.fetch_verified(name, dest, server.url + f"{name}.pth")  # a verified copy is kept, not fetched again
    assert server.requests == [f"{name}.pth"]


def test_corrupt_weights_are_refused_naming_the_file(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    name, data = fake_weights()
    server.files[f"{name}.pth"] = data[:-1] + bytes([data[-1] ^ 1])  # one flipped bit, same length
    dest = tmp_path / f"{name}.pth"
    with pytest.raises(ChecksumError, match=rf"{name}\.pth.*{name.split('-')[1]}.*quarantined"):
        wmod.fetch_verified(name, dest, server.url + f"{name}.pth")
    assert not dest.exists() and dest.with_name(dest.name + ".corrupt").exists()
    server.files[f"{name}.pth"] = data  # the next call downloads again
    wmod.fetch_verified(name, dest, server.url + f"{name}.pth")
    assert dest.read_bytes() == data


def test_damaged_local_copy_is_replaced(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    name, data = fake_weights()
    server.files[f"{name}.pth"] = data
    dest = tmp_path / f"{name}.pth"
    dest.write_bytes(b"half a file")
    wmod.fetch_verified(name, dest, server.url + f"{name}.pth")
    assert dest.read_bytes() == data and server.requests == [f"{name}.pth"]


def test_mirror_replaces_the_official_host(tmp_path: Path, server: FileServer,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    name, data = fake_weights()
    monkeypatch.setitem(wmod.WEIGHTS, name, "a test file")
    monkeypatch.setattr(wmod, "OFFICIAL_BASE", "http://127.0.0.1:9/unreachable/")  # must not be asked
    server.files[f"lab/{name}.pth"] = data
    path = wmod.download_weights(name, tmp_path / f"{name}.pth", mirror=server.url + "lab")
    assert path.read_bytes() == data and server.requests == [f"lab/{name}.pth"]


def test_unknown_or_unverifiable_weights_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown weights 'resnet50'.*resnet18-f37072fd"):
        wmod.download_weights("resnet50", tmp_path / "x.pth")
    with pytest.raises(ValueError, match="'plain' carries no sha256 prefix"):
        wmod.sha256_prefix("plain")


def test_weights_are_torchvisions_official_files() -> None:
    """Our names are the files torchvision's IMAGENET1K_V1 weights download, read from its source."""
    spec = importlib.util.find_spec("torchvision")
    assert spec is not None and spec.origin is not None
    urls = set()
    for module in ("resnet", "vision_transformer"):
        tree = ast.parse((Path(spec.origin).parent / "models" / f"{module}.py").read_text())
        urls |= {n.value.value for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "url"
                 and isinstance(n.value, ast.Constant)}
    assert {wmod.OFFICIAL_BASE + f"{name}.pth" for name in wmod.WEIGHTS} <= urls
    assert set(wmod.MODEL_WEIGHTS) == PRETRAINED_MODELS and set(wmod.MODEL_WEIGHTS.values()) == set(wmod.WEIGHTS)


# ---------------------------------------------------------------- the models load and use the weights


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, nn.Module]]:
    """State dicts of freshly built torchvision models, saved as the weights files would be."""
    out = {}
    for name, build in (("resnet18_imagenet", tv_models.resnet18), ("vit_b16_lora", tv_models.vit_b_16)):
        torch.manual_seed(11)
        ref = build().eval()
        if name == "resnet18_imagenet":  # non-trivial running statistics, so loading them is visible
            for m in ref.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
        path = tmp_path_factory.mktemp("weights") / f"{name}.pth"
        torch.save(ref.state_dict(), path)
        out[name] = (path, ref)
    return out


def test_resnet18_loads_and_uses_the_weights(saved: dict) -> None:
    path, ref = saved["resnet18_imagenet"]
    model = build_model("resnet18_imagenet", (32, 32, 3), 7, weights=path).eval()
    x = torch.randn(2, 3, 32, 32)
    ref.fc = nn.Identity()
    with torch.no_grad():
        expected = ref(F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False))
        feats = model.body(x)
        assert torch.allclose(feats, expected, atol=1e-5)
        assert torch.allclose(model(x), model.head(feats))
        random = build_model("resnet18_imagenet", (32, 32, 3), 7).eval()
        assert not torch.allclose(random.body(x), expected, atol=1e-2)  # the file, not the init, decides
    assert (model.head.in_features, model.head.out_features) == (512, 7)
    assert all(p.requires_grad for p in model.parameters())  # full fine-tuning
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 20  # the paper's model keeps BN
    model.train()
    model(x).logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_vit_lora_starts_as_the_pretrained_model_and_trains_only_lora_and_head(saved: dict) -> None:
    path, ref = saved["vit_b16_lora"]
    model = build_model("vit_b16_lora", (32, 32, 3), 7, weights=path).eval()
    x = torch.randn(2, 3, 32, 32)
    ref.heads = nn.Identity()
    with torch.no_grad():
        expected = ref(F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False))
        assert torch.allclose(model.body(x), expected, atol=1e-4)  # B = 0: LoRA is the identity at start
    loras = [m for m in model.modules() if isinstance(m, QueryValueLoRA)]
    assert len(loras) == 12 and all(m.scale == 2.0 for m in loras)  # rank 4, alpha 8
    assert all(not m.b_q.any() and not m.b_v.any() and m.a_q.abs().sum() > 0 for m in loras)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters()
                         if n.startswith("head.") or n.rsplit(".", 1)[-1] in ("a_q", "b_q", "a_v", "b_v")}
    assert sum(p.numel() for n, p in model.named_parameters() if n in trainable) == 12 * 4 * 4 * 768 + 768 * 7 + 7
    model.train()
    model(x).logsumexp(1).sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    assert all(m.b_q.grad.abs().sum() > 0 and m.b_v.grad.abs().sum() > 0 for m in loras)
    with torch.no_grad():  # LoRA is wired into the attention: a non-zero B changes the features
        loras[0].b_v.fill_(0.01)
        model.eval()
        assert not torch.allclose(model.body(x), expected, atol=1e-3)


def test_grey_input_and_bad_weights(saved: dict, tmp_path: Path) -> None:
    path, ref = saved["resnet18_imagenet"]
    model = build_model("resnet18_imagenet", (28, 28, 1), 3, weights=path, input_size=64).eval()
    x = torch.rand(2, 1, 28, 28)
    ref.fc = nn.Identity()
    with torch.no_grad():  # grey replicated to the three channels ImageNet weights expect
        rgb = F.interpolate(x.expand(-1, 3, -1, -1), size=(64, 64), mode="bilinear", align_corners=False)
        assert torch.allclose(model.body(x), ref(rgb), atol=1e-5)
    with pytest.raises(ValueError, match=rf"pretrained weights {saved['vit_b16_lora'][0]} do not fit"):
        build_model("resnet18_imagenet", (32, 32, 3), 10, weights=saved["vit_b16_lora"][0])
    with pytest.raises(FileNotFoundError, match="missing.pth do not exist"):
        build_model("resnet18_imagenet", (32, 32, 3), 10, weights=tmp_path / "missing.pth")
    with pytest.raises(ValueError, match="model cnn3 loads no pretrained weights"):
        build_model("cnn3", (32, 32, 3), 10, weights=path)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        build_model("vit_b16_lora", (32, 32, 4), 10)
    vit_path, vit_ref = saved["vit_b16_lora"]
    small = build_model("vit_b16_lora", (32, 32, 3), 5, weights=vit_path, input_size=32)
    vit = small.body[1]  # other input sizes: the position embeddings interpolated to 2x2 patches + class token
    assert vit.encoder.pos_embedding.shape == (1, 5, 768) and torch.equal(vit.class_token, vit_ref.class_token)
    assert torch.equal(vit.encoder.ln.weight, vit_ref.encoder.ln.weight)


# ---------------------------------------------------------------- frozen parameters in the engine


class TinyAttention(nn.Module):
    """8x8 grey digits as 8 tokens of 8 pixels, one self-attention layer, mean-pooled: a LoRA test bed."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x[:, 0])
        return self.attention(tokens, tokens, tokens, need_weights=False)[0].mean(1)


def lora_model(num_classes: int) -> SplitModel:
    torch.manual_seed(3)
    model = SplitModel(TinyAttention(), 16, num_classes)
    add_lora(model, rank=2, alpha=4.0)
    freeze_except(model, (QueryValueLoRA,), also=model.head)
    return model


def test_flat_vector_holds_only_trainable_parameters() -> None:
    model = lora_model(10)
    flat = FlatModel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert flat.numel == sum(p.numel() for p in trainable) == 4 * (2 * 16) + 16 * 10 + 10
    assert set(flat.as_params(flat.w)) == {n for n, p in model.named_parameters() if p.requires_grad}
    x = torch.randn(3, 1, 8, 8)
    F.cross_entropy(model(x), torch.tensor([0, 1, 2])).backward()
    assert flat.g.abs().sum() > 0 and all(p.grad is None for p in model.parameters() if not p.requires_grad)
    flat.check_bound()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatModel(model)


def test_fedavg_round_changes_only_lora_and_head(digits_prepared) -> None:
    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    data = dataclasses.replace(data, x_train=data.x_train[:200], y_train=data.y_train[:200],
                               x_test=data.x_test[:100], y_test=data.y_test[:100])
    model = lora_model(data.num_classes)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    parts = [np.arange(i, 200, 4) for i in range(4)]
    cfg = TrainingConfig(rounds=2, local_epochs=1, batch_size=16, lr=0.1, weight_decay=0.01, join_ratio=1.0,
                         eval_every=1)  # weight decay would move any frozen weight the vector held
    run = AsyncRun(model, build_method("fedavg"), data, parts, cfg, AsyncConfig(delay_sigma=0.0, server_samples=20),
                   seed=0, log=lambda m: None)
    result = run.run()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in frozen.items())  # bit-identical backbone
    assert all(not torch.equal(params[n], v) for n, v in before.items())  # every LoRA factor and the head moved
    trainable_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    last = result.history[-1]
    assert last["bytes_up"] == last["bytes_down"] == 2 * 4 * trainable_bytes  # 2 rounds x 4 clients, no delay


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_async_method_leaves_a_frozen_backbone_untouched(digits_prepared, method: str) -> None:
    """Server-side training (Center, Fed+FT, HFCL, FedDF, Feddle's search and head) goes through the same flat
    vector: with delays, weight decay and in-domain server data, no method moves a frozen weight."""
    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    data = dataclasses.replace(data, x_train=data.x_train[:200], y_train=data.y_train[:200],
                               x_test=data.x_test[:100], y_test=data.y_test[:100])
    model = lora_model(data.num_classes)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    hparams = {"server_data": "in_domain"} if "server_data" in hyperparameters(method) else {}
    cfg = TrainingConfig(rounds=3, local_epochs=1, batch_size=16, lr=0.1, weight_decay=0.01, join_ratio=0.5,
                         eval_every=1)
    run = AsyncRun(model, build_method(method, **hparams), data, [np.arange(i, 200, 4) for i in range(4)], cfg,
                   AsyncConfig(delay_sigma=1.0, server_samples=20), seed=0, log=lambda m: None)
    result = run.run()
    assert result.status == "complete" and len(result.history) == 3
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in frozen.items())


def test_table6_cache_holds_the_whole_vit_not_only_its_lora_factors(digits_prepared) -> None:
    """The paper's Table 6 caches 3.4e2 MB for FedAvg on ViT-B/16 + LoRA: the server keeps the whole model.
    Ours counts the frozen backbone beside the trained vector (LoRA factors and head: under 1 MB)."""
    data = to_device_data(digits_prepared, torch.device("cpu"), image_size=8)
    model = build_model("vit_b16_lora", data.shape, data.num_classes)
    cfg = TrainingConfig(rounds=1, join_ratio=0.5)
    run = AsyncRun(model, build_method("fedavg"), data, [np.arange(i, 200, 4) for i in range(4)], cfg,
                   AsyncConfig(delay_sigma=0.0, server_samples=20, measure_cost=True), seed=0, log=lambda m: None)
    whole = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) / 1e6
    assert run.flat.numel * 4 / 1e6 < 1.0 < 300.0 < whole
    assert run.cache_mb(run.w_init) == pytest.approx(whole)


# ---------------------------------------------------------------- the train jobs pass the weights on


@pytest.mark.parametrize("federation", ["async", "sync"])
def test_train_job_builds_the_model_with_the_specs_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           federation: str) -> None:
    """The workflow puts the weights file into the run spec (workflow/rules/common.smk: train_spec); the job
    hands it to build_model. A recording stand-in builds the small CNN, so the job stays seconds long."""
    import copy

    from fedrepro import models
    from fedrepro.asyncfl import job
    from fedrepro.config import resolve_config
    from fedrepro.data.registry import prepare_dataset
    from fedrepro.partition import make_partition, partition_stats, save_partition
    from fedrepro.pipeline import train
    from fedrepro.study import run_spec

    seen: list[object] = []

    def recording(name, shape, num_classes, weights=None, **kwargs):
        seen.append((name, weights))
        return models.build_model("cnn3_small", shape, num_classes, **kwargs)

    module = job if federation == "async" else importlib.import_module("fedrepro.train")
    monkeypatch.setattr(module, "build_model", recording)
    study = {
        "federation": federation, "seeds": [0],
        "defaults": {"rounds": 1, "batch_size": 64, "lr": 0.05, "join_ratio": 0.5, "eval_every": 1},
        "settings": {"s": {"dataset": "digits", "image_size": 8, "model": "vit_b16_lora",
                           "partition": {"kind": "iid", "clients": 4}}},
        "methods": {"fedavg": {"algorithm": "fedavg"}},
        "grid": [{"settings": ["s"], "methods": ["fedavg"]}],
    }
    if federation == "async":
        study["async"] = {"server_samples": 20}
    study = resolve_config({"studies": {"t": copy.deepcopy(study)}})["studies"]["t"]
    prepare_dataset("digits", tmp_path / "digits.npz")
    labels = np.load(tmp_path / "digits.npz")["y_train"]
    partition = study["settings"]["s"]["partition"]
    parts = make_partition(labels, partition, 0)
    save_partition(tmp_path / "seed0.npz", parts, partition_stats(parts, labels, 10), partition)
    spec = {**run_spec(study, "s", "fedavg"), "weights": "resources/weights/vit_b_16-c867db91.pth"}
    train(spec, tmp_path / "digits.npz", [tmp_path / "seed0.npz"], [0], tmp_path / "runs" / "seeds.json",
          tmp_path / "ckpt", "cpu", 1, log=lambda m: None)
    assert seen == [("vit_b16_lora", "resources/weights/vit_b_16-c867db91.pth")]


def test_download_weights_rule_uses_the_configured_mirror(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    """The rule asks the `mirrors:` entry of the weights name; bytes that do not match the sha256 prefix in
    torchvision's name fail the job, quarantined, with the file named in the rule's log."""
    import subprocess
    import sys

    import yaml
    from support.common import REPO

    name = "resnet18-f37072fd"
    server.files[f"lab/{name}.pth"] = fake_weights()[1]
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"mirrors": {name: server.url + "lab"}, "weights_dir": "weights"}))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                           "--directory", str(tmp_path), f"weights/{name}.pth",
                           "--configfile", str(REPO / "config" / "config.yaml"), str(config)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert server.requests == [f"lab/{name}.pth"]
    log = (tmp_path / "weights" / "logs" / f"{name}.log").read_text()
    assert f"sha256 mismatch for {name}.pth" in log and "expected a sha256 starting f37072fd" in log
    assert (tmp_path / "weights" / f"{name}.pth.corrupt").exists()
    assert not (tmp_path / "weights" / f"{name}.pth").exists()
