"""The paper-scale cost estimate counts SGD steps and FLOPs the way the engine spends them."""

from __future__ import annotations

import pytest
import torch

from fedrepro.cost import ServerPass, estimate, run_steps, server_cost, server_passes, step_flops
from fedrepro.sim.tensors import inference_batch


def spec(**training):
    base = {"rounds": 10, "local_epochs": 2, "batch_size": 64, "join_ratio": 0.5, "straggler_steps": None,
            "drop_last": False}
    return {"dataset": "cifar10", "partition": {"kind": "dirichlet", "clients": 10, "beta": 0.5},
            "training": {**base, **training}}


def test_steps_are_rounds_times_sampled_clients_times_local_steps():
    assert run_steps(spec()) == 10 * 5 * 2 * 79  # 5000 samples per client in batches of 64 -> 79 steps/epoch
    assert run_steps(spec(straggler_steps=[50, 500])) == 10 * 5 * 275
    assert run_steps(spec(drop_last=True)) == 10 * 5 * 2 * 78  # the short 79th batch dropped (FedDisco's code)
    subset = {**spec(), "partition": {"kind": "dirichlet", "clients": 10, "beta": 0.5, "samples": 6400}}
    assert run_steps(subset) == 10 * 5 * 2 * 10  # only the 6400 partitioned samples: 640 a client, 10 batches


def test_step_flops_count_forward_and_backward_and_scale_with_batch():
    one, many = step_flops("simple_cnn", (32, 32, 3), 10, 1), step_flops("simple_cnn", (32, 32, 3), 10, 64)
    assert many == pytest.approx(64 * one, rel=0.01)
    forward_macs = 6 * 3 * 25 * 28 * 28 + 16 * 6 * 25 * 10 * 10 + 400 * 120 + 120 * 84 + 84 * 10
    # backward ~2x forward, less for the first layer (no gradient w.r.t. the input)
    assert 2.0 * 2 * forward_macs < one < 3.0 * 2 * forward_macs
    assert step_flops("simple_cnn", (32, 32, 3), 10, 1, backward=False) == 2 * forward_macs  # the forward alone


def test_a_model_group_costs_the_mean_step_of_its_clients_architectures():
    """FedL2G: client i trains member i mod X, so 5 clients of tiny4 are 2 MLP steps + 1 of each other."""
    from fedrepro.cost import _flops
    from fedrepro.models.groups import build_arch

    each = {m: _flops(build_arch(m, (16, 16, 1), 10), (16, 16, 1), 10, text=False)
            for m in ("mlp", "lenet", "cnn4", "resnet_mini")}
    assert step_flops("tiny4", (16, 16, 1), 10, 10, group_of=5) == pytest.approx(
        (2 * each["mlp"] + each["lenet"] + each["cnn4"] + each["resnet_mini"]) / 5)
    # pooled train + test, and each client training on 75% of its samples
    hetero = {**spec(), "federation": "hetero",
              "partition": {"kind": "dirichlet", "clients": 10, "beta": 0.1, "pool_test": True}}
    assert run_steps(hetero) == 10 * 5 * 2 * 71  # 60000 * 0.75 / 10 = 4500 samples -> 71 steps of 64


def async_spec(algorithm: str, **hparams) -> dict:
    """A run of config/studies/feddle.yaml's paper scale: 200 rounds, 10 of 500 clients a round, 1000 in-domain
    server samples, and out of domain the whole ImageNet subset (250k images)."""
    return {**spec(rounds=200, local_epochs=2, batch_size=32, join_ratio=0.02), "federation": "async",
            "partition": {"kind": "dirichlet", "clients": 500, "beta": 0.1}, "model": "cnn3",
            "algorithm": algorithm, "hparams": hparams,
            "async": {"server_samples": 1000, "ood_dataset": "imagenet_subset", "ood_samples": None}}


def test_server_passes_count_the_servers_data_every_round():
    feddle_ood = async_spec("feddle", server_data="out_of_domain", epochs=10, batch_size=64, grad_cosine=True)
    gpu = inference_batch(torch.device("cuda"))  # forward-only passes: a GPU's inference batch
    # the search's 10 epochs, the OOD head's feature pass (forward), the cosine over 1024 OOD + 1000 ID samples
    assert server_passes(feddle_ood) == [ServerPass(200 * 10 * 250_000, 64, True),
                                         ServerPass(200 * 250_000, gpu, False),
                                         ServerPass(200 * (1024 + 1000), 64, True)]
    assert server_passes(async_spec("feddle", epochs=10, batch_size=64)) == [ServerPass(200 * 10 * 1000, 64, True)]
    # FedDF: each of the 10 arrived client models labels the set (forward), then one epoch of distillation
    assert server_passes(async_spec("feddf", server_data="out_of_domain")) == [
        ServerPass(200 * 10 * 250_000, gpu, False), ServerPass(200 * 250_000, 64, True)]
    subset = async_spec("feddf", server_data="out_of_domain")
    subset["async"]["ood_samples"] = 5000  # a seeded subset of the OOD set
    assert [p.samples for p in server_passes(subset)] == [200 * 10 * 5000, 200 * 5000]
    assert server_passes(async_spec("fedavg")) == [] and server_passes(spec()) == []
    # Feddle-OOD's server backpropagates ~1000x the samples its clients' steps take (100 each, 2 epochs)
    assert server_passes(feddle_ood)[0].samples > 900 * run_steps(feddle_ood) * 32
    # Center trains on the server's set once, in round 1, and never samples a client
    center = async_spec("center", epochs=50, batch_size=64)
    assert server_passes(center) == [ServerPass(50 * 1000, 64, True)] and run_steps(center) == 0
    assert run_steps(async_spec("fedft")) == 200 * 10 * 2 * 4  # its clients: 120 samples -> 4 batches of 32
    # HFCL's server client: the clients' epochs and batch unless it sets its own
    assert server_passes(async_spec("hfcl")) == [ServerPass(200 * 2 * 1000, 32, True)]


def test_server_cost_is_flops_per_sample_with_a_step_floor_per_batch():
    passes, sample_flops = [ServerPass(6400, 64, True), ServerPass(5120, 512, False)], {True: 3e9, False: 1e9}
    flops, gpu_s = server_cost(passes, sample_flops, gpu_tflops=1.0, step_floor_ms=100.0)
    assert flops == 6400 * 3e9 + 5120 * 1e9
    assert gpu_s == pytest.approx(100 * 0.192 + 10 * 0.512)  # 100 batches of 192 GFLOP, 10 of 512, at 1 TFLOP/s
    assert server_cost(passes, sample_flops, 1.0, step_floor_ms=1000.0)[1] == pytest.approx(110 * 1.0)


def test_estimate_shows_the_servers_passes_apart_from_the_clients_steps():
    methods = {"fedavg": {}, "feddle": {"epochs": 10, "batch_size": 64},
               "feddle-ood": {"server_data": "out_of_domain", "epochs": 10, "batch_size": 64}}
    run = async_spec("fedavg")
    study = {"name": "feddle", "federation": "async", "seeds": [0, 1], "grid": [{"settings": ["s"],
             "methods": list(methods)}], "async": run["async"],
             "defaults": {**run["training"], **dict.fromkeys(("lr", "momentum", "weight_decay", "eval_every",
                                                              "last_k", "checkpoint_every"))},
             "settings": {"s": {"dataset": "cifar10", "model": "cnn3", "partition": run["partition"]}},
             "methods": {m: {"algorithm": m.removesuffix("-ood"), "hparams": h, "weighting": None}
                         for m, h in methods.items()}}
    (row,) = estimate({"studies": {"feddle": study}}, gpu_tflops=60.0, step_floor_ms=1.5, cpu_spf=1e-12)
    assert row["steps"] == 3 * 2 * run_steps(run)  # the clients' steps, as before
    by_method = row["server_gpu_hours_by_method"]
    assert set(by_method) == {"feddle", "feddle-ood"} and by_method["feddle-ood"] > 200 * by_method["feddle"]
    assert row["server_gpu_hours"] == pytest.approx(sum(by_method.values()))
    ood = async_spec("feddle", server_data="out_of_domain", epochs=10, batch_size=64)
    ood_flops = sum(p.samples * step_flops("cnn3", (32, 32, 3), 10, 1, backward=p.backward)
                    for p in server_passes(ood))
    id_flops = 200 * 10 * 1000 * step_flops("cnn3", (32, 32, 3), 10, 1)
    client_step = step_flops("cnn3", (32, 32, 3), 10, 32)
    assert row["server_steps"] == pytest.approx(2 * (ood_flops + id_flops) / client_step)
