"""The round loop every federation shares (sync, hetero, async): resume from a checkpoint, then each round seed the
global RNG, let the federation play it (its clients train, its server merges), count its seconds, judge whether it
diverged and say why, evaluate when due, keep the best evaluated model and stop early where the study asks, and close
the round (checkpoint, stop signal). A federation (sim/sync.py ``FederatedRun``, hetero/engine.py ``HeteroRun``,
asyncfl/engine.py ``AsyncRun``) supplies only its parts:

- ``play_round(rnd)``: sample, train, merge; returns a ``RoundPlay`` (the round's mean training loss, its own sign
  of divergence, the quantities it computed for a diagnosis);
- ``evaluate_round(rnd, play, result)``: evaluate the round's model, append its history row, log it; its accuracy;
- ``engine_state()`` / ``restore(resumed, checkpoint)``: what a checkpoint holds of it, and putting it back;
- ``note_divergence(trace)``: the quantities a diverged round's diagnosis reads last (the global model, the state);
- ``kept_model()`` / ``hand_on(kept)``: the model `keep_best` keeps and what follows the run gets (a federation that
  hands on no single model refuses the key: fedrepro.federations);
- ``finish(result)``, and ``before_round(rnd)`` for work outside the round's seconds (Feddle's diagnostic).

Byte counts live in ``self.totals`` (the federation adds to them); the loop keeps the seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrepro import defaults, seeding
from fedrepro.sim.checkpoint import close_round, load_checkpoint, resume_progress
from fedrepro.sim.runs import RoundTrace, RunResult, diverged_loss

_DEFAULT = defaults.training()  # the study schema's (fedrepro.defaults)


@dataclass
class RoundConfig:
    """The training keys every federation reads (a study's `defaults`, workflow/schemas/study.schema.yaml, where each
    is described); each engine's config adds its own."""

    rounds: int
    local_epochs: int = _DEFAULT["local_epochs"]
    batch_size: int = _DEFAULT["batch_size"]
    lr: float = _DEFAULT["lr"]
    join_ratio: float = _DEFAULT["join_ratio"]
    eval_every: int = _DEFAULT["eval_every"]
    last_k: int = _DEFAULT["last_k"]
    checkpoint_every: int = _DEFAULT["checkpoint_every"]
    drop_last: bool = _DEFAULT["drop_last"]  # drop each epoch's short last batch (sim/batches.py)
    early_stop: int = _DEFAULT["early_stop"]  # stop once this many rounds pass without a better test accuracy


@dataclass
class RoundPlay:
    """What a federation's round hands back to the loop."""

    train_loss: float | None  # the round's mean training loss (None: no client trained or reported)
    bad: bool = False  # the federation's own sign of divergence (a non-finite global or client model, a method's)
    trace: RoundTrace = field(default_factory=RoundTrace)  # the round's quantities, for a diverged round's diagnosis


@dataclass
class Totals:
    """The run's running counts: bytes sent to and from the clients, training seconds."""

    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0


def draw_clients(seed: int, rnd: int, pool: np.ndarray, m: int) -> np.ndarray:
    """Round ``rnd``'s clients: ``m`` of ``pool`` drawn without replacement, sorted; all of it when ``m`` covers it.
    A pure function of (seed, round), so a resumed run draws the same; every federation samples with it."""
    if m >= len(pool):
        return np.sort(pool)
    return np.sort(seeding.rng_for(seed, seeding.SAMPLING, rnd).choice(pool, m, replace=False))


def stalled(history: list[dict], patience: int) -> bool:
    """Early stopping's trigger: ``patience`` (> 0) rounds have passed since the round of the best test
    accuracy so far (the first, among equals). The paper's "early stop trigger of 10 rounds" (FedGTST)."""
    if not patience or not history:
        return False
    best = max(history, key=lambda row: row["test_acc"])  # max keeps the first of equal accuracies
    return history[-1]["round"] - best["round"] >= patience


class RoundLoop:
    """The shared loop; see the module's docstring for what a federation overrides."""

    cfg: RoundConfig  # and keep_best where the federation hands a model on
    seed: int
    log: Callable[[str], None]

    # ----- what a federation supplies
    def new_result(self) -> RunResult:
        return RunResult()

    def before_round(self, rnd: int) -> None:
        """Work before round ``rnd`` that is no part of its seconds (default: none)."""

    def play_round(self, rnd: int) -> RoundPlay:
        raise NotImplementedError

    def note_divergence(self, trace: RoundTrace) -> None:
        """Add the quantities a diverged round computed last (default: none)."""

    def evaluate_round(self, rnd: int, play: RoundPlay, result: RunResult) -> float:
        raise NotImplementedError

    def engine_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, resumed: dict[str, Any], checkpoint: Path) -> None:
        raise NotImplementedError

    def kept_model(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} keeps no best model")

    def hand_on(self, kept: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no best model")

    def finish(self, result: RunResult) -> None:
        """After the last round (or on resuming a finished run): leave the reported model in place."""

    # ----- the loop
    def run(self, checkpoint: Path | None = None, fingerprint: str = "") -> RunResult:
        cfg = self.cfg
        early_stop, keep_best = cfg.early_stop, getattr(cfg, "keep_best", False)
        result = self.result = self.new_result()
        self.totals = Totals()
        self.best: dict[str, Any] | None = None  # keep_best: the best evaluated model so far, on the CPU
        start_round = 1
        resumed = load_checkpoint(checkpoint, fingerprint, self.log) if checkpoint else None
        if resumed is not None:
            self.restore(resumed, checkpoint)
            start_round, up, down, seconds = resume_progress(resumed, result)
            self.totals = Totals(up, down, seconds)
            self.best = resumed.get("best")
            self.log(f"resumed from {checkpoint} after round {resumed['round']}")
            if result.status == "diverged":
                return result
            result.stopped_round = resumed.get("stopped_round")
            if result.stopped_round is not None:  # finished by early stopping: nothing left to train
                start_round = cfg.rounds + 1

        for rnd in range(start_round, cfg.rounds + 1):
            self.before_round(rnd)
            t0 = time.perf_counter()
            # anything that draws from torch's global RNG in this round draws the same after a resume
            torch.manual_seed(seeding.derive_seed(self.seed, seeding.SERVER, rnd))
            play = self.play_round(rnd)
            self.totals.seconds += time.perf_counter() - t0
            divergence = None
            if diverged_loss(play.train_loss) or play.bad:
                self.note_divergence(play.trace)
                divergence = play.trace.diagnose(rnd, play.train_loss)
            if divergence is not None or rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
                acc = self.evaluate_round(rnd, play, result)
                if keep_best and divergence is None and (self.best is None or acc > self.best["acc"]):
                    self.best = dict(round=rnd, acc=acc, **self.kept_model())
            if divergence is None and rnd < cfg.rounds and stalled(result.history, early_stop):
                result.stopped_round = rnd
                self.log(f"early stop after round {rnd}: no better test accuracy in {early_stop} rounds")
            if close_round(rnd, cfg.rounds, divergence, result, checkpoint, fingerprint, cfg.checkpoint_every,
                           partial(self.snapshot, rnd, result, keep_best), self.log,
                           finished=result.stopped_round is not None):
                break
        self.finish(result)
        if self.best is not None:  # keep_best: what follows gets the best evaluated model (its metrics stay the last's)
            self.hand_on(self.best)
            self.log(f"kept the model of round {self.best['round']} (test accuracy {self.best['acc']:.2f}) for what "
                     "follows")
        return result

    def snapshot(self, rnd: int, result: RunResult, keep_best: bool) -> dict[str, Any]:
        """What a checkpoint after round ``rnd`` holds: the loop's progress, then the federation's state."""
        totals = self.totals
        return dict(round=rnd, history=result.history, status=result.status, diverged_round=result.diverged_round,
                    stopped_round=result.stopped_round, bytes_up=totals.bytes_up, bytes_down=totals.bytes_down,
                    seconds=totals.seconds, **self.engine_state(), **({"best": self.best} if keep_best else {}))
