"""One model whose parameters and gradients are views into two flat vectors.

Federated methods think in parameter vectors (deltas, control variates, proximal terms). Binding the
module's parameters to slices of one vector makes "load the global model" one copy, "the client's
update" one subtraction, and the SGD step one fused vector op, with no per-tensor Python loops.

4-d (convolution) weights are laid out channels-last inside the vector, and images travel channels-last:
oneDNN's convolutions run ~1.7x faster that way on CPU for the 4-layer CNN (benchmarks/engine.py), and
cuDNN's NHWC kernels are the fast ones on GPUs. The layout is fixed, not per device, so a vector means
the same model everywhere (checkpoints move between CPU and GPU); ``vector_of`` and ``as_params`` are
the only ways in and out.

Frozen parameters (``requires_grad=False``, e.g. a pretrained backbone under LoRA) are not in the vectors:
they keep their own storage, so clients neither train nor send them, the server never averages them, and the
communication counted from the vector's size covers only what is trained.

Floating-point buffers (BatchNorm's running mean and variance) are model state that is not trained by
gradients; ``buffers`` / ``load_buffers`` read and write them as one more flat vector (empty for a model
without any), so an engine can send, snapshot and average them beside ``w``. Integer buffers (BatchNorm's
``num_batches_tracked``, a counter read only when its momentum is None) are not in it: they stay the model's.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    """Owns ``w`` (trainable parameters) and ``g`` (their gradients) of ``model`` as contiguous 1-d tensors."""

    def __init__(self, model: nn.Module) -> None:
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        if not params:
            raise ValueError("model has no trainable parameters")
        first = params[0]
        self.model = model
        self.numel = sum(p.numel() for p in params)
        self.w = torch.empty(self.numel, device=first.device, dtype=first.dtype)
        self.g = torch.zeros(self.numel, device=first.device, dtype=first.dtype)
        self._params = params
        self._names = [name for name, _ in named]
        offset = 0
        for p in params:
            n = p.numel()
            view = _shaped(self.w[offset : offset + n], p.shape)
            view.copy_(p.detach())
            p.data = view
            # autograd accumulates in place into an existing .grad, so backward fills self.g
            p.grad = _shaped(self.g[offset : offset + n], p.shape)
            offset += n

    # ----- buffers (floating-point running statistics; looked up by name each time, so a module that replaced
    # its buffer tensors is still read correctly)
    def _float_buffers(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, b) for name, b in self.model.named_buffers() if b.is_floating_point()]

    def buffers(self) -> torch.Tensor:
        """A copy of the model's floating-point buffers as one vector (empty without any)."""
        parts = [b.detach().reshape(-1) for _, b in self._float_buffers()]
        return torch.cat(parts) if parts else self.w.new_zeros(0)

    def load_buffers(self, vector: torch.Tensor) -> None:
        """Set the model's floating-point buffers to ``vector`` (from ``buffers``)."""
        offset = 0
        with torch.no_grad():
            for _, b in self._float_buffers():
                b.copy_(vector[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        if offset != len(vector):
            raise ValueError(f"buffer vector has {len(vector)} values, the model's buffers {offset}")

    def as_buffers(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """``vector`` (from ``buffers``) as a name -> tensor dict for ``torch.func.functional_call`` (views)."""
        out, offset = {}, 0
        for name, b in self._float_buffers():
            out[name] = vector[offset : offset + b.numel()].view_as(b)
            offset += b.numel()
        return out

    def vector_of(self, tensors: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Per-parameter tensors (default: the model's parameters, differentiably) as one vector in
        this binding's layout: what a test or a method needs to write an objective over ``w``."""
        tensors = self._params if tensors is None else tensors
        return torch.cat([_flat_order(t) for t in tensors])

    def as_params(self, vector: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
        """``vector`` as a name -> tensor dict for ``torch.func.functional_call`` (views, no copy); frozen
        parameters are not in it, so functional_call uses the module's own.

        With ``prefix`` (e.g. "body."), only those parameters, names relative to that submodule: how a
        method evaluates another model (the global or a previous local one) without a second module.
        """
        out, offset = {}, 0
        for name, p in zip(self._names, self._params, strict=True):
            n = p.numel()
            if name.startswith(prefix):
                out[name[len(prefix) :]] = _shaped(vector[offset : offset + n], p.shape)
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


def _shaped(flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A view of the 1-d ``flat`` as ``shape``; 4-d shapes (out, in, kh, kw) are channels-last views."""
    if len(shape) == 4:
        out_c, in_c, kh, kw = shape
        return flat.view(out_c, kh, kw, in_c).permute(0, 3, 1, 2)
    return flat.view(shape)


def _flat_order(t: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_shaped``: ``t`` flattened in the vector's layout."""
    return t.permute(0, 2, 3, 1).reshape(-1) if t.dim() == 4 else t.reshape(-1)
