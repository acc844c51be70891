"""``engine: {mode: auto}``: train the sampled clients one at a time or side by side (sim/vectorized.py)?

On a CPU always one at a time, unmeasured: vmap's grouped convolutions are slower there (sim/vectorized.py;
a FedDisco laptop run took 29 s side by side against 20 s). On CUDA the first round a job trains decides,
for a method with a pure local objective: from the round's model, after the server's ``server_begin``, a
probe times a few local steps of both engines on the round's largest sampled clients and measures one
step's peak memory at 1 and 2 clients side by side. The difference is what one more client costs; as many
clients as fit in ``HEADROOM`` of the device's free memory train at once (at most the config's
``side_by_side`` and the clients sampled per round), and side by side is kept only where one step of them
beats as many steps one at a time (``choose_engine``). The probe uploads nothing and leaves the model, its
buffers and torch's RNG streams as it found them, so a seed's results are those of the chosen engine run
alone (the two engines agree to float rounding: tests/sim/test_vectorized.py).

The headroom leaves room for what the first round does not hold yet: per-client state that grows as
clients first train (SCAFFOLD's control variates, FedDyn's gradients: clients x parameters x 4 bytes)
and the allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING

import torch

from fedrepro.algorithms.base import Algorithm
from fedrepro.sim.vectorized import local_steps_side_by_side

if TYPE_CHECKING:
    from fedrepro.sim.sync import FederatedRun

SEQUENTIAL, SIDE_BY_SIDE = "sequential", "side_by_side"
HEADROOM = 0.8  # of the device's free memory, for the clients trained side by side
PROBE_STEPS = 5  # timed local steps of each engine, after one untimed warm-up step
GB = 1e9


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """How a run trains its sampled clients, and why; ``summary()`` is summary.json's "engine"."""

    mode: str  # SEQUENTIAL or SIDE_BY_SIDE
    clients_at_once: int  # 1 one at a time
    reason: str
    requested: str = "auto"  # the config's engine.mode
    measured: bool = False
    sequential_s_per_step: float | None = None  # one client's local step
    side_by_side_s_per_step: float | None = None  # one local step of side_by_side_clients clients at once
    side_by_side_clients: int | None = None
    bytes_per_client: int | None = None  # what one more client side by side adds to a step's peak memory
    free_bytes: int | None = None  # the device's free memory before the probe

    def summary(self) -> dict:
        """The fields that apply (None ones left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def initial_choice(mode: str, cap: int, device: torch.device, algorithm: Algorithm) -> EngineChoice | None:
    """The choice that needs no measurement, for the config's ``mode`` and at most ``cap`` clients side by
    side; None: ``auto`` on CUDA, measured in the first round trained (``measure``)."""
    if mode == "sequential":
        return EngineChoice(SEQUENTIAL, 1, "requested", requested=mode)
    if mode == "vectorized":
        if not algorithm.vectorizable():
            raise ValueError(f"{algorithm.name} has no functional_loss: it cannot train clients side by side")
        return EngineChoice(SIDE_BY_SIDE, cap, "requested", requested=mode)
    if mode != "auto":
        raise ValueError(f"unknown engine mode {mode!r}; choices: auto, sequential, vectorized")
    if not algorithm.vectorizable():
        return EngineChoice(SEQUENTIAL, 1, f"{algorithm.name} has no functional_loss to train side by side")
    if not measurable(device):
        return EngineChoice(SEQUENTIAL, 1, f"{device.type}: one at a time, not measured (vmap's grouped "
                                           "convolutions are slower on CPUs)")
    if cap < 2:
        return EngineChoice(SEQUENTIAL, 1, "at most one client at once (side_by_side or clients per round)")
    return None


def measurable(device: torch.device) -> bool:
    """Whether ``auto`` times the engines on ``device`` (CUDA only)."""
    return device.type == "cuda"


def clients_that_fit(bytes_per_client: float, free_bytes: float, cap: int, fixed_bytes: float = 0.0,
                     headroom: float = HEADROOM) -> int:
    """The most clients k one side-by-side step may hold: fixed + k x per-client <= headroom x free, k <= cap."""
    room = headroom * free_bytes - fixed_bytes
    return max(0, min(cap, int(room // max(bytes_per_client, 1))))


def choose_engine(sequential_s_per_step: float, side_by_side_s_per_step: float | None, bytes_per_client: int,
                  free_bytes: int, cap: int, fixed_bytes: int = 0) -> EngineChoice:
    """``auto``'s decision from the probe's measurements: side by side with as many clients as fit
    (``clients_that_fit``) where one step of them, ``side_by_side_s_per_step`` (None: not timed, as fewer
    than 2 fit), takes less than as many steps one at a time; else sequential."""
    k = clients_that_fit(bytes_per_client, free_bytes, cap, fixed_bytes)
    measured = dict(measured=True, sequential_s_per_step=sequential_s_per_step, bytes_per_client=bytes_per_client,
                    free_bytes=free_bytes)
    memory = f"{bytes_per_client / GB:.2f} GB per client, {free_bytes / GB:.1f} GB free"
    if k < 2:
        return EngineChoice(SEQUENTIAL, 1, f"{k} client(s) side by side fit in {HEADROOM:.0%} of free memory "
                                           f"({memory})", **measured)
    if side_by_side_s_per_step is None:
        raise ValueError(f"{k} clients fit side by side: a step of them must be timed")
    timed = dict(side_by_side_s_per_step=side_by_side_s_per_step, side_by_side_clients=k)
    faster = side_by_side_s_per_step < k * sequential_s_per_step
    timings = (f"{side_by_side_s_per_step:.4g} s per step of {k} clients side by side "
               f"{'<' if faster else '>='} {k} x {sequential_s_per_step:.4g} s one at a time; {memory}")
    if faster:
        return EngineChoice(SIDE_BY_SIDE, k, timings, **measured, **timed)
    return EngineChoice(SEQUENTIAL, 1, timings, **measured, **timed)


def measure(run: FederatedRun, rnd: int, w: torch.Tensor, sampled: list[int], cap: int) -> EngineChoice:
    """``auto`` on CUDA: probe both engines in round ``rnd`` from the round's model ``w`` (after the
    server's ``server_begin``) on the largest ``sampled`` clients, at most ``cap`` (>= 2) side by side."""
    device = w.device
    free = free_bytes(device)
    # the largest clients: mostly full batches, as most local steps take
    cids = sorted(sampled, key=lambda c: len(run.clients[c]), reverse=True)
    with _left_as_found(run):
        sequential_s = _seconds_per_step(partial(_sequential_steps, run, rnd, w, cids[0]), device)
        try:
            one, two = (peak_bytes(partial(_side_by_side_steps, run, rnd, w, cids[:n], 1), device) for n in (1, 2))
            per_client, fixed = max(two - one, 1), max(2 * one - two, 0)
            k = clients_that_fit(per_client, free, cap, fixed)
            side_by_side_s = (_seconds_per_step(partial(_side_by_side_steps, run, rnd, w, cids[:k]), device)
                              if k >= 2 else None)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return EngineChoice(SEQUENTIAL, 1, "out of memory probing clients side by side", measured=True,
                                sequential_s_per_step=sequential_s, free_bytes=free)
    return choose_engine(sequential_s, side_by_side_s, per_client, free, cap, fixed)


def free_bytes(device: torch.device) -> int:
    """The CUDA device's free memory, counting what PyTorch's allocator caches unused as free."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The peak CUDA memory ``fn()`` allocates beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


@contextmanager
def _left_as_found(run: FederatedRun) -> Iterator[None]:
    """The probe trains the run's model in place and might draw from torch's RNG: restore the parameters,
    buffers and RNG streams (CPU and CUDA) after it."""
    w, buffers = run.flat.w.detach().clone(), run.flat.buffers()
    with torch.random.fork_rng():
        try:
            yield
        finally:
            run.flat.load(w)
            run.flat.load_buffers(buffers)


def _seconds_per_step(take_steps: Callable[[int], int], device: torch.device) -> float:
    """Seconds per local step of ``take_steps(n)`` (n steps at most; returns how many it took): one untimed
    warm-up step (kernel selection, first allocations), then PROBE_STEPS timed."""
    take_steps(1)
    _synchronize(device)
    start = time.perf_counter()
    taken = take_steps(PROBE_STEPS)
    _synchronize(device)
    return (time.perf_counter() - start) / max(taken, 1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: time them finished
        torch.cuda.synchronize(device)


def _sequential_steps(run: FederatedRun, rnd: int, w: torch.Tensor, cid: int, steps: int) -> int:
    """The first ``steps`` local steps of client ``cid`` one at a time; how many it took."""
    client = run.client(cid, rnd, w)
    run.flat.load(w)
    run.local_sgd(client, run.data.x_train, run.data.y_train, islice(run.client_batches(cid, rnd), steps))
    return client.steps


def _side_by_side_steps(run: FederatedRun, rnd: int, w: torch.Tensor, cids: list[int], steps: int) -> int:
    """The first ``steps`` local steps of ``cids`` side by side; how many steps it took."""
    schedules = [list(islice(run.client_batches(c, rnd), steps)) for c in cids]
    local_steps_side_by_side(run, [run.client(c, rnd, w) for c in cids], schedules, w)
    return max(map(len, schedules))
