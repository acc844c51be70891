"""Clients trained side by side: one batched computation per local step for all sampled clients.

The sampled clients' parameter vectors are stacked ([m, P]); one step runs ``torch.func.vmap`` over the
method's pure local objective (``Algorithm.functional_loss``) with every client's own batch, drawn exactly
as the sequential engine draws it (same generators, same order), so the two engines agree to float
tolerance. Ragged clients are handled by masking: a client's last, shorter batch (kept unless
``drop_last``, sim/batches.py) is padded and masked,
and a client that has finished its local steps is frozen while the others go on. Gradient corrections and
uploads are the method's ordinary hooks, called per client on row views; one optimiser steps every lane.

Where it pays: many small models on a GPU, where one batched kernel replaces m tiny launches. On the
2-core CPUs this project is tested on, vmap's batched convolutions (grouped convolutions underneath)
are slower than m ordinary ones (benchmarks/engine.py), and benchmarks/roofline.py shows why no
per-client-weight scheme can win there: the 4-layer CNN's plain SGD step already runs at about half the
core's matrix-multiply peak, so even clients sharing one weight set at m times the batch would save only
~10%; grouped convolutions (vmap) cost 1.2-1.7x and unfold + batched matmul 1.9-3.5x the plain loop.
So ``engine: auto`` never picks it on a CPU, and on CUDA times both engines first (sim/engine_choice.py):
grouped convolutions have slow cases on GPUs too, and each lane holds a whole batch's activations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.func import grad_and_value, vmap

from fedrepro.algorithms.base import Client

if TYPE_CHECKING:
    from fedrepro.sim.sync import FederatedRun


def train_side_by_side(run: FederatedRun, cids: list[int], rnd: int,
                       w_global: torch.Tensor) -> list[tuple[dict, torch.Tensor, int]]:
    """Local training of ``cids`` from ``w_global``; per client (upload, summed batch loss, samples seen),
    as ``FederatedRun.train_client`` returns them."""
    alg = run.alg
    clients = [Client(cid=c, round=rnd, w_start=w_global, num_samples=len(run.clients[c])) for c in cids]
    w, loss_sums, seen = local_steps_side_by_side(run, clients, [list(run.client_batches(c, rnd)) for c in cids],
                                                  w_global)
    with torch.no_grad():
        uploads = [alg.upload(client, w[i]) for i, client in enumerate(clients)]
    return [(uploads[i], loss_sums[i], seen[i]) for i in range(len(cids))]


def round_schedule(schedules: list[list[torch.Tensor]], batch_size: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every local step of the lanes at once, built on the host and moved to ``device`` in one go: index batches
    [steps, lanes, batch] (a lane's short or missing batch padded with index 0), their masks (1 for a real sample)
    and which lanes still step [steps, lanes, 1] (a finished lane stays where it is)."""
    m, steps = len(schedules), max(len(s) for s in schedules)
    idx = torch.zeros(steps, m, batch_size, dtype=torch.long)
    mask = torch.zeros(steps, m, batch_size)
    for i, schedule in enumerate(schedules):
        for t, batch in enumerate(schedule):
            idx[t, i, : len(batch)] = batch.cpu()
            mask[t, i, : len(batch)] = 1.0
    live = torch.tensor([[[float(t < len(s))] for s in schedules] for t in range(steps)])
    return idx.to(device), mask.to(device), live.to(device)


def local_steps_side_by_side(run: FederatedRun, clients: list[Client], schedules: list[list[torch.Tensor]],
                             w_global: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The clients' optimiser steps, lane i over the index batches ``schedules[i]``, all from ``w_global``:
    (final parameters [m, P], summed batch loss per lane, samples seen per lane). No upload: the engine
    probe (sim/engine_choice.py) times these steps alone. Nothing inside a step reads a device value back on the
    host: the round's batches, masks and live lanes are device tensors built once (``round_schedule``), what the
    host counts (samples seen, each client's steps) it counts from the schedules, and a method with a batched
    gradient correction (``Algorithm.batched_correction``) corrects every lane in one pass."""
    cfg, alg, flat = run.cfg, run.alg, run.flat
    dev, m = w_global.device, len(clients)
    lengths = [len(s) for s in schedules]
    idx_all, mask_all, live_all = round_schedule(schedules, cfg.batch_size, dev)
    live_all = live_all.to(w_global.dtype)

    extras_per_client = [alg.loss_extras(c) for c in clients]
    extras = {k: torch.stack([e[k] for e in extras_per_client]) for k in extras_per_client[0]}

    def lane_loss(w, x, y, mask, ex):
        return alg.functional_loss(run.model, flat.as_params(w), x, y, mask, ex)

    step_fn = vmap(grad_and_value(lane_loss))
    w = w_global.expand(m, -1).clone()
    correct = alg.batched_correction(clients, w_global)
    optimizer = cfg.local_optimizer(clients[0].round)  # one for all lanes: they start and step together
    loss_sums = torch.zeros(m, device=dev, dtype=w.dtype)  # the model's dtype: float64 in the exact tests
    x_all, y_all = run.data.x_train, run.data.y_train
    for t in range(max(lengths)):
        idx, mask = idx_all[t], mask_all[t]
        g, losses = step_fn(w, x_all[idx], y_all[idx], mask, extras)
        with torch.no_grad():
            if correct is not None:
                correct(w, g, t)  # every lane: a finished lane's gradient moves nothing (live below)
            else:
                for i in range(m):
                    if t < lengths[i]:
                        alg.correct_grad(w[i], g[i], clients[i])
            optimizer.step(w, g, live_all[t])
            loss_sums += losses * mask.sum(1)
        for i in range(m):
            if t < lengths[i]:
                clients[i].steps += 1
    seen = [sum(len(batch) for batch in schedule) for schedule in schedules]
    return w, loss_sums, seen
