"""FedAsync (Xie et al., 2019): each arriving client update enters the global model at once, weighted by
alpha_t = alpha * (staleness + 1)^(-a) (the polynomial staleness function; staleness = rounds since the client was
sent its model). Two readings, ``form``:

- ``mix`` (Xie et al.'s Algorithm 1): the client's model is mixed into the global one,
  w <- (1 - alpha_t) w + alpha_t (w_start + Delta) = w + alpha_t (Delta - (w - w_start)): a stale client also
  pulls the model back towards the one it was sent;
- ``update``: the client's update is applied to the current model, w <- w + alpha_t Delta, as Feddle frames every
  aggregator (its Eq. 4, M({Delta}, w), with clients reporting updates "as adopted by" FedAsync, its footnote 2).

They agree for a fresh update (w_start = w). BatchNorm statistics mix the same way either way,
b <- (1 - alpha_t) b + alpha_t b_i."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update
from fedrepro.plugins import Fraction, NonNegative


def mixing_weight(alpha: float, a: float, staleness: int) -> float:
    """alpha * (staleness + 1)^(-a)."""
    return alpha * (staleness + 1.0) ** (-a)


class FedAsync(AsyncMethod):
    name = "fedasync"

    def __init__(self, alpha: Fraction = 0.8, a: NonNegative = 0.5, form: Literal["mix", "update"] = "mix") -> None:
        super().__init__()
        self.alpha, self.a, self.form = alpha, a, form

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        mix = mixing_weight(self.alpha, self.a, update.staleness)
        self.mix_buffers([mix], [update.buffers])
        if self.form == "update":
            return w + mix * update.delta
        return (1.0 - mix) * w + mix * (update.w_start + update.delta)

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        return w
