"""TextCNN (Kim 2014; the Zhang & Wallace 2015 baseline FedDisco cites) for token-id inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedrepro.models.cnn import SplitModel


class TextCNNBody(nn.Module):
    """Embedding, one Conv1d + ReLU per kernel size, max over time, concatenated: [B, L] -> [B, F]."""

    def __init__(self, vocab_size: int, embed_dim: int, num_filters: int,
                 kernel_sizes: Sequence[int]) -> None:
        super().__init__()
        # padding_idx 0: the <pad> row stays zero and gets no gradient, so padding adds nothing.
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, num_filters, k) for k in kernel_sizes)

    def forward(self, tokens: Tensor) -> Tensor:
        e = self.embedding(tokens.long()).transpose(1, 2)  # [B, D, L]; prepared ids are uint16
        return torch.cat([conv(e).relu().amax(dim=2) for conv in self.convs], dim=1)


def textcnn(
    shape: tuple[int],
    num_classes: int,
    vocab_size: int = 20002,
    embed_dim: int = 32,
    num_filters: int = 100,
    kernel_sizes: Sequence[int] = (3, 4, 5),
) -> SplitModel:
    """TextCNN for sequences of ``shape`` = (L,) token ids below ``vocab_size`` (<pad> = 0).

    FedDisco's "TextCNN with a 32 hidden dimension" is read as a 32-dim embedding (the meaning of
    ``hidden_dim`` in PFLlib's TextCNN); filters follow Kim / Zhang & Wallace: 100 per kernel size
    3, 4, 5, so features are 300-dim. No dropout (the model zoo has none). The default vocab_size
    matches the prepared ag_news (20,000 words + <pad> + <unk>); pass meta["vocab_size"].
    """
    (length,) = shape
    if length < max(kernel_sizes):
        raise ValueError(f"sequences of length {length} are shorter than the largest kernel "
                         f"{max(kernel_sizes)}")
    body = TextCNNBody(int(vocab_size), int(embed_dim), int(num_filters), tuple(int(k) for k in kernel_sizes))
    return SplitModel(body, int(num_filters) * len(kernel_sizes), num_classes)
