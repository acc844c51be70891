"""Feddle's model atlas and coefficient search, as plain functions of flat vectors (methods/feddle.py uses them).

The atlas holds at most M anchors (client updates). A search finds coefficients c for
w' = w + sum_m c_m a_m on the server data; App. E's trick gives every dL/dc_m from one backward pass:
w' is built without a graph (stop-grad), the model's flat gradient g = dL/dw' comes from one backward, and
dL/dc_m = <g, a_m>, i.e. grad_c = A g. No graph is ever built through the anchors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedrepro.sim.flat import FlatModel


def normalize_anchors(anchors: Tensor) -> tuple[Tensor, Tensor]:
    """(a_m * median_m ||a_m|| / ||a_m||, the factors median / ||a_m||) of the rows of ``anchors`` (Eq. 5).
    torch.median takes the lower middle value for an even count: a norm one of the anchors has."""
    norms = anchors.norm(dim=1)
    factors = norms.median() / norms.clamp_min(1e-12)
    return anchors * factors[:, None], factors


def replace_slot(scores: list[float], ages: list[int], capacity: int, importance: bool) -> int | None:
    """The slot a new anchor takes: None while the atlas has room (append); when full, the anchor with the
    smallest importance score |c_m| (``importance``), else the oldest (FIFO)."""
    if len(scores) < capacity:
        return None
    keys = scores if importance else ages
    return min(range(len(keys)), key=lambda m: (keys[m], ages[m]))


def coefficient_grad(flat: FlatModel, w: Tensor, anchors: Tensor, c: Tensor, batch_loss: Callable[[Tensor], Tensor],
                     idx: Tensor, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """(loss, dL/dc) at w + sum_m c_m a_m of the mean loss over the samples ``idx`` by App. E's trick:
    ``batch_loss(indices)`` is the mean loss of the model bound to ``flat`` (loaded with the detached w') on
    those samples, backward fills flat.g, and dL/dc = anchors @ flat.g. With ``chunk``, the samples go through
    in chunks of at most that many, each chunk's mean weighted by its share of ``idx`` and backwarded on its own:
    flat.g accumulates the gradient of the mean over all of ``idx`` (up to float summation order) while only
    one chunk's activations are alive. That is the one-batch result because every server pass runs in eval
    mode: BatchNorm normalises each chunk with its running statistics, not with the chunk's own."""
    with torch.no_grad():
        flat.load(w + c @ anchors)
    flat.zero_grad()
    n, step = len(idx), chunk or len(idx)
    losses = []
    for start in range(0, n, step):
        part = idx[start : start + step]
        part_loss = batch_loss(part) * (len(part) / n)
        part_loss.backward()
        losses.append(part_loss.detach())
    with torch.no_grad():
        return sum(losses), anchors @ flat.g


def search_coefficients(
    flat: FlatModel,
    w: Tensor,
    anchors: Tensor,
    c_init: Tensor,
    batch_loss: Callable[[Tensor], Tensor],
    n: int,
    epochs: int,
    lr: float,
    batch_size: int,
    gen: torch.Generator,
    lam: float = 0.0,
    c_prior: Tensor | None = None,
) -> Tensor:
    """SGD on c from ``c_init`` over ``epochs`` passes of the server data (n samples, ``batch_loss(indices)``),
    with the fallback regulariser (lam/2) ||c - c_prior||^2 taken as an exact proximal step after each
    gradient step (c <- (c + lr lam c_prior) / (1 + lr lam)), which minimises the same objective and stays
    stable for any lam (a plain gradient step overshoots once lr * lam > 2)."""
    c = c_init.clone()
    prior = c_init if c_prior is None else c_prior
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(w.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            _, grad = coefficient_grad(flat, w, anchors, c, batch_loss, idx)
            c = c - lr * grad
            if lam:
                c = (c + lr * lam * prior) / (1.0 + lr * lam)
    return c
