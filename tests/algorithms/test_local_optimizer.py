"""The clients' optimisers on flat vectors (SGD, Adam), the per-round learning-rate schedule and early stopping:
each equals what torch.optim and a written-out loop do."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.common import dirichlet_clients, reference_local_training, sync_run

from fedrepro.sim.loop import stalled
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.vector_optim import VectorOptimizer

CFG = TrainingConfig(rounds=3, local_epochs=1, batch_size=16, lr=0.01, weight_decay=1e-3, eval_every=1,
                     checkpoint_every=1)


def gradient_sequence(n=6, size=50):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(size, generator=gen) for _ in range(n)]


@pytest.mark.parametrize(("name", "torch_optimizer", "settings"), [
    ("sgd", torch.optim.SGD, {"momentum": 0.9, "weight_decay": 1e-2}),
    ("sgd", torch.optim.SGD, {"momentum": 0.0, "weight_decay": 0.0}),
    ("adam", torch.optim.Adam, {"weight_decay": 1e-2}),
])
def test_vector_optimizer_steps_as_torch_optim(name, torch_optimizer, settings):
    w0 = torch.linspace(-1, 1, 50)
    p = torch.nn.Parameter(w0.clone())
    reference = torch_optimizer([p], lr=0.05, **settings)
    w = w0.clone()
    ours = VectorOptimizer(name, 0.05, **settings)
    for g in gradient_sequence():
        p.grad = g.clone()
        reference.step()
        ours.step(w, g.clone())
    assert torch.allclose(w, p.detach(), atol=1e-6)
    assert not torch.allclose(w, w0)


def test_side_by_side_lanes_that_finished_stay_put():
    w = torch.ones(3, 4)
    opt = VectorOptimizer("adam", 0.1)
    opt.step(w, torch.ones(3, 4), live=torch.tensor([[1.0], [0.0], [1.0]]))
    assert torch.equal(w[1], torch.ones(4)) and torch.allclose(w[0], torch.full((4,), 0.9))


def test_adam_with_momentum_or_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"momentum 0.9 is an SGD setting"):
        VectorOptimizer("adam", 0.01, momentum=0.9)
    with pytest.raises(ValueError, match=r"optimizer 'rmsprop' is not one of \['sgd', 'adam'\]"):
        VectorOptimizer("rmsprop", 0.01)


def test_step_decay_multiplies_the_rate_every_lr_decay_every_rounds():
    cfg = dataclasses.replace(CFG, lr=0.01, lr_decay=0.1, lr_decay_every=50)
    assert [cfg.lr_at(r) for r in (1, 50)] == [0.01, 0.01]
    assert cfg.lr_at(51) == pytest.approx(1e-3) and cfg.lr_at(100) == pytest.approx(1e-3)
    assert cfg.lr_at(101) == pytest.approx(1e-4)
    assert dataclasses.replace(CFG, lr_decay=0.1).lr_at(500) == CFG.lr  # no lr_decay_every: constant


@pytest.fixture(scope="module")
def parts(small_data):
    return dirichlet_clients(small_data.y_train.numpy(), n_clients=3, beta=5.0)


@pytest.mark.parametrize(("optimizer", "torch_optimizer", "momentum"), [
    ("adam", torch.optim.Adam, {}),
    ("sgd", torch.optim.SGD, {"momentum": 0.9}),
])
def test_local_training_uses_the_configured_optimizer_at_the_rounds_decayed_rate(
        small_data, parts, optimizer, torch_optimizer, momentum):
    cfg = dataclasses.replace(CFG, optimizer=optimizer, lr_decay=0.1, lr_decay_every=2, **momentum)
    run = sync_run(small_data, parts, cfg=cfg)
    w0 = run.flat.w.clone()
    for rnd, lr in ((1, 0.01), (3, 0.001)):  # round 3 is after one decay
        delta = run.train_client(1, rnd, w0)[0]["delta"]
        expected = reference_local_training(run, 1, rnd, w0, lambda params, lr=lr: torch_optimizer(
            params, lr=lr, weight_decay=cfg.weight_decay, **momentum))
        assert torch.allclose(w0 + delta, expected, atol=1e-5)


def test_stalled_counts_rounds_since_the_first_best_accuracy():
    history = [{"round": r, "test_acc": a} for r, a in ((2, 50.0), (4, 60.0), (6, 60.0), (8, 59.0))]
    assert stalled(history, 4) and not stalled(history, 5)  # best first reached at round 4
    assert not stalled(history, 0) and not stalled([], 3)


def test_early_stop_ends_a_run_that_stopped_improving_and_its_checkpoint_stays_finished(small_data, parts, tmp_path):
    # a learning rate too small to move the test accuracy: the best stays round 1's, so round 3 stops the run
    cfg = dataclasses.replace(CFG, rounds=10, lr=1e-9, early_stop=2)
    ckpt = tmp_path / "ckpt.pt"
    run = sync_run(small_data, parts, cfg=cfg)
    logs = []
    run.log = logs.append
    result = run.run(ckpt, "fp")
    assert [row["round"] for row in result.history] == [1, 2, 3]
    assert result.stopped_round == 3 and result.status == "complete"
    assert any("early stop after round 3" in m for m in logs)
    again = sync_run(small_data, parts, cfg=cfg)
    resumed = again.run(ckpt, "fp")  # the finished checkpoint: nothing is trained again
    assert resumed.history == result.history and resumed.stopped_round == 3
    assert torch.equal(again.flat.w, run.flat.w)


def test_keep_best_hands_on_the_model_of_the_best_round_and_a_resume_keeps_it(small_data, parts, tmp_path,
                                                                              monkeypatch):
    from fedrepro.sim import sync
    from fedrepro.sim.checkpoint import kept_parameters, read_checkpoint

    # The test accuracy of each round is scripted, best at round 3 and lower after: which round a real curve peaks
    # at depends on the CPU's rounding (a run that peaks at its last round on one kernel set falls back on
    # another), and the test is of which model is handed on, not of the curve. Everything else is the real run.
    script = {1: 20.0, 2: 45.0, 3: 70.0, 4: 50.0, 5: 60.0, 6: 30.0, 7: 65.0, 8: 55.0}
    next_round: dict[int, int] = {}  # id(model) -> the round its next evaluation is of
    real_evaluate = sync.evaluate

    def scripted(model, *args, **kwargs):
        _, loss, per_class = real_evaluate(model, *args, **kwargs)
        rnd = next_round[id(model)]
        next_round[id(model)] += 1
        return script[rnd], loss, per_class

    def run_from(start: int, run):
        next_round[id(run.model)] = start
        return run

    monkeypatch.setattr(sync, "evaluate", scripted)
    cfg = dataclasses.replace(CFG, rounds=8, lr=0.3, keep_best=True)
    whole = run_from(1, sync_run(small_data, parts, cfg=cfg))
    result = whole.run(tmp_path / "whole.pt", "fp")
    assert [row["test_acc"] for row in result.history] == list(script.values())
    assert whole.best["round"] == 3 and whole.best["acc"] == 70.0
    # the kept model is the one the same run had after its best round
    upto = run_from(1, sync_run(small_data, parts, cfg=dataclasses.replace(cfg, rounds=3, keep_best=False)))
    upto.run()
    assert torch.equal(whole.flat.w, upto.flat.w)
    assert torch.equal(kept_parameters(read_checkpoint(tmp_path / "whole.pt")), upto.flat.w)
    # interrupted after round 5 (a checkpoint every round) and resumed: the same model kept
    first = run_from(1, sync_run(small_data, parts, cfg=dataclasses.replace(cfg, rounds=5)))
    first.run(tmp_path / "split.pt", "fp")
    resumed = run_from(6, sync_run(small_data, parts, cfg=cfg))
    resumed.run(tmp_path / "split.pt", "fp")
    assert resumed.best["round"] == 3 and torch.equal(resumed.flat.w, whole.flat.w)
    # without keep_best the last model is handed on, as before
    last = run_from(1, sync_run(small_data, parts, cfg=dataclasses.replace(cfg, keep_best=False)))
    last.run(tmp_path / "last.pt", "fp")
    assert not torch.equal(last.flat.w, whole.flat.w)
    final = read_checkpoint(tmp_path / "last.pt")
    assert torch.equal(kept_parameters(final), final["w"])
