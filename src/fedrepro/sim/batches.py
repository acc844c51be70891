"""A client's local mini-batches: one definition of an epoch for every engine (sim/sync.py and, through it,
sim/vectorized.py and the asynchronous engine; hetero/engine.py) and for the cost estimate (fedrepro.cost).

With ``drop_last`` an epoch is floor(n / B) full batches, as a torch DataLoader(drop_last=True) gives them
(FedDisco's and HtFLlib's code); without it, ceil(n / B), the last one short. Torch-free, so the cost
estimate can use it without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def batches_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Mini-batches in one pass over ``n`` samples."""
    full, rest = divmod(n, batch_size)
    if drop_last and full:
        return full
    # A client with fewer samples than one batch keeps its one short batch even with drop_last: a
    # DataLoader would give it none, and a client that never steps has no update (SCAFFOLD and FedNova
    # would divide by its zero steps; FedDisco's code fails there).
    return full + (rest > 0)


def epoch_batches(order: Tensor, batch_size: int, drop_last: bool) -> Iterator[Tensor]:
    """One pass over ``order`` (a client's sample indices, already shuffled) in mini-batches."""
    for b in range(batches_per_epoch(len(order), batch_size, drop_last)):
        yield order[b * batch_size : (b + 1) * batch_size]
