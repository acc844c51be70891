"""FedProx (Li et al., 2020): local objective + (mu/2) ||w - w_global||^2."""

from collections.abc import Callable

import torch

from fedrepro.algorithms.base import Algorithm, Client
from fedrepro.plugins import NonNegative


class FedProx(Algorithm):
    name = "fedprox"

    def __init__(self, mu: NonNegative = 0.01) -> None:
        super().__init__()
        self.mu = mu

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        # gradient of the proximal term, added analytically: no second forward pass
        g.add_(w - client.w_start, alpha=self.mu)

    def batched_correction(self, clients: list[Client], w_global: torch.Tensor
                           ) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
        def correct(w: torch.Tensor, g: torch.Tensor, t: int) -> None:
            g.add_(w - w_global, alpha=self.mu)  # every lane started from w_global

        return correct
