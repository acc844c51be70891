"""Low-rank adaptation (Hu et al., 2022) of the query and value projections of ``nn.MultiheadAttention``.

The attention keeps its packed ``in_proj_weight`` ([3d, d]: query, key, value rows); a parametrization adds
``(alpha / rank) * B @ A`` to the query and value rows. ``B`` starts at zero, so an adapted model starts as the
pretrained one; ``A`` starts as nn.Linear's weights do. Only A and B are parameters of the adapter: freezing
everything else (``freeze_except``) leaves them, and the new head, as the model's trainable parameters.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize


class QueryValueLoRA(nn.Module):
    """A parametrization of a [3d, d] packed q/k/v weight: W + scale * [B_q A_q; 0; B_v A_v]."""

    def __init__(self, dim: int, rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.dim, self.scale = dim, alpha / rank
        self.a_q, self.a_v = (nn.Parameter(torch.empty(rank, dim)) for _ in range(2))
        self.b_q, self.b_v = (nn.Parameter(torch.zeros(dim, rank)) for _ in range(2))
        for a in (self.a_q, self.a_v):
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def forward(self, w: Tensor) -> Tensor:
        d = self.dim
        return torch.cat([w[:d] + self.scale * (self.b_q @ self.a_q), w[d : 2 * d],
                          w[2 * d :] + self.scale * (self.b_v @ self.a_v)])


def add_lora(model: nn.Module, rank: int, alpha: float) -> int:
    """Adapt every nn.MultiheadAttention of ``model`` in place; returns how many were adapted."""
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    for m in attentions:
        if not m._qkv_same_embed_dim:
            raise ValueError("LoRA here needs packed q/k/v projections (kdim == vdim == embed_dim)")
        parametrize.register_parametrization(m, "in_proj_weight", QueryValueLoRA(m.embed_dim, rank, alpha))
    return len(attentions)


def freeze_except(model: nn.Module, trainable: tuple[type[nn.Module], ...], also: nn.Module) -> None:
    """requires_grad False for every parameter but those of ``trainable`` modules and of ``also``."""
    for p in model.parameters():
        p.requires_grad_(False)
    for m in model.modules():
        if isinstance(m, trainable) or m is also:
            for p in m.parameters():
                p.requires_grad_(True)
