"""FedAsync (Xie et al., 2019): each arriving client model is mixed into the global one at once,
w <- (1 - alpha_t) w + alpha_t (w_start + Delta), with alpha_t = alpha * (staleness + 1)^(-a) (the
polynomial staleness function; staleness = rounds since the client was sent its model); BatchNorm statistics
mix the same way, b <- (1 - alpha_t) b + alpha_t b_i."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update
from fedrepro.plugins import Fraction, NonNegative


def mixing_weight(alpha: float, a: float, staleness: int) -> float:
    """alpha * (staleness + 1)^(-a)."""
    return alpha * (staleness + 1.0) ** (-a)


class FedAsync(AsyncMethod):
    name = "fedasync"

    def __init__(self, alpha: Fraction = 0.8, a: NonNegative = 0.5) -> None:
        super().__init__()
        self.alpha, self.a = alpha, a

    def receive(self, w: Tensor, update: Update) -> Tensor:
        mix = mixing_weight(self.alpha, self.a, update.staleness)
        self.mix_buffers([mix], [update.buffers])
        return (1.0 - mix) * w + mix * (update.w_start + update.delta)

    def round_end(self, w: Tensor, rnd: int) -> Tensor:
        return w
