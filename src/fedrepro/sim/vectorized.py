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


def local_steps_side_by_side(run: FederatedRun, clients: list[Client], schedules: list[list[torch.Tensor]],
                             w_global: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The clients' optimiser steps, lane i over the index batches ``schedules[i]``, all from ``w_global``:
    (final parameters [m, P], summed batch loss per lane, samples seen per lane). No upload: the engine
    probe (sim/engine_choice.py) times these steps alone."""
    cfg, alg, flat = run.cfg, run.alg, run.flat
    dev, m, bsz = w_global.device, len(clients), cfg.batch_size
    lengths = torch.tensor([len(s) for s in schedules], device=dev)

    extras_per_client = [alg.loss_extras(c) for c in clients]
    extras = {k: torch.stack([e[k] for e in extras_per_client]) for k in extras_per_client[0]}

    def lane_loss(w, x, y, mask, ex):
        return alg.functional_loss(run.model, flat.as_params(w), x, y, mask, ex)

    step_fn = vmap(grad_and_value(lane_loss))
    w = w_global.expand(m, -1).clone()
    optimizer = cfg.local_optimizer(clients[0].round)  # one for all lanes: they start and step together
    loss_sums = torch.zeros(m, device=dev, dtype=w.dtype)  # the model's dtype: float64 in the exact tests
    seen = [0] * m
    x_all, y_all = run.data.x_train, run.data.y_train
    for t in range(int(lengths.max())):
        idx = torch.zeros(m, bsz, dtype=torch.long, device=dev)
        mask = torch.zeros(m, bsz, device=dev)
        active = []
        for i, schedule in enumerate(schedules):
            if t < len(schedule):
                batch = schedule[t]
                idx[i, : len(batch)] = batch
                mask[i, : len(batch)] = 1.0
                active.append(i)
        g, losses = step_fn(w, x_all[idx], y_all[idx], mask, extras)
        with torch.no_grad():
            for i in active:
                alg.correct_grad(w[i], g[i], clients[i])
            live = (lengths > t).to(w.dtype).unsqueeze(1)  # finished clients stay where they are
            optimizer.step(w, g, live)
            loss_sums += losses * mask.sum(1)
        for i in active:
            seen[i] += int(mask[i].sum())
            clients[i].steps += 1
    return w, loss_sums, seen
