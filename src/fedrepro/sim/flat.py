"""One model whose parameters and gradients are views into two flat vectors.

Federated methods think in parameter vectors (deltas, control variates, proximal terms). Binding the
module's parameters to slices of one vector makes "load the global model" one copy, "the client's
update" one subtraction, and the SGD step one fused vector op, with no per-tensor Python loops.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    """Owns ``w`` (parameters) and ``g`` (gradients) of ``model`` as contiguous 1-d tensors."""

    def __init__(self, model: nn.Module) -> None:
        params = list(model.parameters())
        if not params:
            raise ValueError("model has no parameters")
        first = params[0]
        self.model = model
        self.numel = sum(p.numel() for p in params)
        self.w = torch.empty(self.numel, device=first.device, dtype=first.dtype)
        self.g = torch.zeros(self.numel, device=first.device, dtype=first.dtype)
        offset = 0
        for p in params:
            n = p.numel()
            self.w[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = self.w[offset : offset + n].view_as(p)
            # autograd accumulates in place into an existing .grad, so backward fills self.g
            p.grad = self.g[offset : offset + n].view_as(p)
            offset += n
        self._params = params
        self._names = [name for name, _ in model.named_parameters()]

    def as_params(self, vector: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
        """``vector`` as a name -> tensor dict for ``torch.func.functional_call`` (views, no copy).

        With ``prefix`` (e.g. "body."), only those parameters, names relative to that submodule: how a
        method evaluates another model (the global or a previous local one) without a second module.
        """
        out, offset = {}, 0
        for name, p in zip(self._names, self._params, strict=True):
            n = p.numel()
            if name.startswith(prefix):
                out[name[len(prefix) :]] = vector[offset : offset + n].view_as(p)
            offset += n
        return out

    def load(self, vector: torch.Tensor) -> None:
        """Set the model's parameters to ``vector``."""
        self.w.copy_(vector)

    def zero_grad(self) -> None:
        self.g.zero_()

    def check_bound(self) -> None:
        """Fail loudly if something replaced a parameter's storage (e.g. ``model.to()`` after binding)."""
        for p in self._params:
            if p.grad is None or p.data.untyped_storage().data_ptr() != self.w.untyped_storage().data_ptr():
                raise RuntimeError("FlatModel: a parameter is no longer a view of the flat vector")
