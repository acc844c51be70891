"""The paper-scale cost estimate counts SGD steps and FLOPs the way the engine spends them."""

from __future__ import annotations

import pytest

from fedrepro.cost import run_steps, step_flops


def spec(**training):
    base = {"rounds": 10, "local_epochs": 2, "batch_size": 64, "join_ratio": 0.5, "straggler_steps": None,
            "drop_last": False}
    return {"dataset": "cifar10", "partition": {"kind": "dirichlet", "clients": 10, "beta": 0.5},
            "training": {**base, **training}}


def test_steps_are_rounds_times_sampled_clients_times_local_steps():
    assert run_steps(spec()) == 10 * 5 * 2 * 79  # 5000 samples per client in batches of 64 -> 79 steps/epoch
    assert run_steps(spec(straggler_steps=[50, 500])) == 10 * 5 * 275
    assert run_steps(spec(drop_last=True)) == 10 * 5 * 2 * 78  # the short 79th batch dropped (FedDisco's code)


def test_step_flops_count_forward_and_backward_and_scale_with_batch():
    one, many = step_flops("simple_cnn", (32, 32, 3), 10, 1), step_flops("simple_cnn", (32, 32, 3), 10, 64)
    assert many == pytest.approx(64 * one, rel=0.01)
    forward_macs = 6 * 3 * 25 * 28 * 28 + 16 * 6 * 25 * 10 * 10 + 400 * 120 + 120 * 84 + 84 * 10
    # backward ~2x forward, less for the first layer (no gradient w.r.t. the input)
    assert 2.0 * 2 * forward_macs < one < 3.0 * 2 * forward_macs


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
