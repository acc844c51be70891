"""FedIIR (Guo et al., ICML 2023): implicit invariant relationships via gradient alignment.

At the start of a round every participant computes the gradient of its loss w.r.t. the classifier at the
global model and sends it up; the server averages them (aggregation weights) into this round's mean and
folds it into the global gradient g_bar, an exponential moving average over rounds,
g_bar_p = ema g_bar_{p-1} + (1 - ema) mean_p with g_bar_0 = 0 (``ema`` 0.95, the FedIIR code's default and
FL-bench's), and sends g_bar down. During local training each client minimises
CE + penalty * ||dCE/dw_cls - g_bar||^2 on every batch (double backprop through the classifier gradient),
as the FedIIR code does. The extra exchange (a gradient up, g_bar down, both of classifier size) is
counted in bytes. ``params: all`` aligns the gradients of every weight instead of the classifier's.
penalty = 0 is FedAvg exactly: no gradients are taken or exchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.algorithms.base import Algorithm, Client
from fedrepro.algorithms.jacobian import JacobianStats
from fedrepro.plugins import NonNegative, PositiveInt, Range

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


def head_slice(flat: FlatModel, prefix: str = "head.") -> slice:
    """The contiguous range of the flat vector holding the parameters whose names start with ``prefix``."""
    offset, start, stop = 0, None, None
    for name, p in flat.model.named_parameters():  # FlatModel's order: model.parameters()
        if name.startswith(prefix):
            start = offset if start is None else start
            stop = offset + p.numel()
        offset += p.numel()
    if start is None:
        raise ValueError(f"fediir: the model has no parameters named {prefix}*")
    return slice(start, stop)


class FedIIR(JacobianStats, Algorithm):
    name = "fediir"

    def __init__(self, penalty: NonNegative = 1e-3, params: Literal["head", "all"] = "head",
                 grad_samples: PositiveInt | None = 512, ema: Annotated[float, Range(ge=0, lt=1)] = 0.95,
                 jac_stats: bool = False, jac_samples: PositiveInt | None = 512) -> None:
        super().__init__()
        self.penalty, self.params, self.grad_samples, self.ema = float(penalty), params, grad_samples, float(ema)
        self.init_jacobian(jac_stats, jac_samples)

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        self._span = head_slice(flat) if self.params == "head" else slice(0, flat.numel)
        # g_bar carries over rounds (the moving average), so it lives in the checkpointed state
        self.state = {} if self.penalty == 0 else {
            "g_bar": torch.zeros(self._span.stop - self._span.start, device=self.device)}
        self._client_grads: dict[int, torch.Tensor] = {}

    def _aligned(self, model: nn.Module) -> list[torch.Tensor]:
        params = list(model.parameters())
        if self.params == "all":
            return params
        return [p for name, p in model.named_parameters() if name.startswith("head.")]

    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, client: Client) -> torch.Tensor:
        if self.penalty == 0:
            return super().local_loss(model, x, y, client)
        ce = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(ce, self._aligned(model), create_graph=True)
        g = torch.cat([t.reshape(-1) for t in grads])
        return ce + self.penalty * (g - self.state["g_bar"]).pow(2).sum()

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        return {} if self.penalty == 0 else {"g_bar": self.state["g_bar"]}

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        if self.penalty != 0:
            out["grad"] = self._client_grads.pop(client.cid)  # sent at the round's start; counted here
        return out

    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        if self.penalty == 0:
            self.probe_round(w_global, sampled)
            return
        weight_of = dict(zip(np.asarray(sampled).tolist(), np.asarray(weights, dtype=np.float64).tolist(),
                             strict=True))
        round_mean = torch.zeros(self._span.stop - self._span.start, device=w_global.device)
        self._client_grads = {}

        def collect(cid: int, g: torch.Tensor) -> None:
            part = g[self._span].clone()
            self._client_grads[cid] = part
            round_mean.add_(part, alpha=weight_of[cid])

        if self.jac_stats and self.grad_samples != self.jac_samples:
            self.probe_round(w_global, sampled)  # statistics on their own sample budget
            for cid in weight_of:
                collect(cid, self.client_gradient(w_global, cid, self.grad_samples))
        else:
            self.probe_round(w_global, sampled, on_gradient=collect, max_samples=self.grad_samples)
        self.state["g_bar"] = self.ema * self.state["g_bar"] + (1 - self.ema) * round_mean

    def round_metrics(self) -> dict[str, float]:
        return self.jacobian_metrics()
