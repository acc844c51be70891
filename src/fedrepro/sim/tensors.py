"""Prepared arrays -> device tensors, once per run: batches are index slices, never a DataLoader."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class DeviceData:
    """A data set as tensors on the run's device: standardised float images [N,C,H,W] (train-set
    channel statistics) or long token ids [N,L]."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    model_kwargs: dict = field(default_factory=dict)  # e.g. vocab_size for text models

    @property
    def shape(self) -> tuple[int, ...]:
        """(H, W, C) of one image, or (L,) of one token sequence: build_model's convention."""
        if self.x_train.ndim == 2:
            return (self.x_train.shape[1],)
        _, c, h, w = self.x_train.shape
        return (h, w, c)


# Float bytes converted at a time: the device holds the resident float tensors plus a few chunks of this size
# while a data set is moved (converting whole splits at once held ~3x the float data: issue #22).
CHUNK_BYTES = 64 * 2**20
# Transient chunk buffers alive at once, at most CHUNK_BYTES each: the float chunk at the source size (its
# uint8 copy is freed once it is made), and in a resize a contiguous copy of the input (a grey->colour expanded
# chunk), the resized chunk and its copy in the other layout (measured on the CPU: up to 2.4 chunks).
_CHUNK_BUFFERS = 4


def _unit_float(x: np.ndarray, device: torch.device, size: tuple[int, int], channels: int) -> torch.Tensor:
    """uint8 [n,H,W,C] -> float [n,channels,*size] in [0,1]: the per-image conversion, on a few images."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device).permute(0, 3, 1, 2).float().div_(255.0)
    if channels != t.shape[1]:
        t = t.expand(-1, channels, -1, -1)
    if size != tuple(t.shape[-2:]):
        t = F.interpolate(t, size=size, mode="bilinear", align_corners=False)
    return t


def images_to_tensor(
    x: np.ndarray, device: torch.device, image_size: int | None = None, channels: int | None = None
) -> torch.Tensor:
    """uint8 [N,H,W,C] -> float [N,C,H',W'] in [0,1], optionally resized and grey->colour expanded.

    Converted a chunk of images at a time into one preallocated tensor (channels_last, the convolutions'
    fast layout: sim/flat.py), so the device never holds more than the result plus a few chunks."""
    n, h, w, c = x.shape
    if channels is not None and channels != c and c != 1:
        raise ValueError(f"cannot convert {c}-channel images to {channels} channels")
    out_channels = channels or c
    # resized (to a square) only when the width differs: every prepared image set is square
    size = (image_size, image_size) if image_size is not None and image_size != w else (h, w)
    out = torch.empty((n, out_channels, *size), device=device, memory_format=torch.channels_last)
    rows = max(1, CHUNK_BYTES // (4 * out_channels * max(h * w, size[0] * size[1])))
    for start in range(0, n, rows):
        out[start : start + rows] = _unit_float(x[start : start + rows], device, size, out_channels)
    return out


def device_data_bytes(n_train: int, n_test: int, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(resident, peak) device bytes of ``to_device_data`` for ``n_train`` + ``n_test`` images of
    ``shape`` (H, W, C) as they are on the device (after resizing / channel expansion): the float images
    and long labels, and that plus the transient chunk buffers (for images of at most CHUNK_BYTES each)."""
    h, w, c = shape
    resident = (n_train + n_test) * (4 * h * w * c + 8)
    return resident, resident + _CHUNK_BUFFERS * CHUNK_BYTES


def to_device_data(
    prepared, device: torch.device, image_size: int | None = None, channels: int | None = None,
    normalize: dict[str, list[float]] | None = None,
) -> DeviceData:
    """Move a prepared data set (fedrepro.data.format.Prepared) to ``device`` as standardised tensors.

    Images in [0, 1] become (x - mean) / std per channel: by default with the training split's mean and sd;
    with ``normalize`` ({"mean": [...], "std": [...]}, one value per channel or one for all, a setting's
    `normalize` key) with those fixed constants, as the papers' code does (FedDisco's and HtFLlib's
    Fashion-MNIST: (x - 0.5) / 0.5; their inputs then have mean -0.43 and sd 0.71, where the training
    split's statistics give 0 and 1). The statistics are reductions over the whole tensor, which need no
    copy of it, and the standardisation is in place: the peak is ``device_data_bytes``'s."""
    meta = prepared.meta
    if meta.get("kind") == "text":
        return DeviceData(
            *(torch.as_tensor(a.astype(np.int64), device=device)
              for a in (prepared.x_train, prepared.y_train, prepared.x_test, prepared.y_test)),
            num_classes=int(meta["num_classes"]),
            model_kwargs={"vocab_size": int(meta["vocab_size"])},
        )
    x_train = images_to_tensor(prepared.x_train, device, image_size, channels)
    x_test = images_to_tensor(prepared.x_test, device, image_size, channels)
    if normalize is None:
        mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
        std = x_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    else:
        mean, std = (_per_channel(normalize, key, x_train.shape[1], device) for key in ("mean", "std"))
    return DeviceData(
        x_train=x_train.sub_(mean).div_(std),
        y_train=torch.as_tensor(prepared.y_train, dtype=torch.long, device=device),
        x_test=x_test.sub_(mean).div_(std),
        y_test=torch.as_tensor(prepared.y_test, dtype=torch.long, device=device),
        num_classes=int(prepared.meta["num_classes"]),
    )


def _per_channel(normalize: dict[str, list[float]], key: str, channels: int, device: torch.device) -> torch.Tensor:
    """normalize[key] as a [1, C, 1, 1] tensor: one value per channel, or one broadcast to all."""
    values = list(normalize[key])
    if len(values) not in (1, channels):
        raise ValueError(f"setting key normalize.{key} has {len(values)} values for images of {channels} "
                         f"channel(s): give one, or one per channel")
    return torch.tensor(values, device=device).expand(channels).reshape(1, channels, 1, 1)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode inside the block, its previous mode restored after: for passes that are not
    training (evaluation, a server's feature pass or coefficient search), so BatchNorm normalises with its
    running statistics and leaves them unchanged (and dropout is off)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def inference_batch(device: torch.device) -> int:
    """Samples per forward pass of an evaluation: on a CPU few enough that a batch's activations stay in the
    core's caches (256: Feddle's CNN at 28x28 evaluates 2.2x faster than in batches of 2048, the simple CNN as
    fast; benchmarks/inference_batch.py), on a GPU many (a launch a layer for thousands of images)."""
    return 2048 if device.type == "cuda" else 256


def in_inference_batches(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``forward`` over the rows of ``x`` in batches of ``inference_batch``, concatenated: a pass over many
    samples (a teacher's logits, a frozen body's features) with one batch's activations alive at a time."""
    size = inference_batch(x.device)
    return torch.cat([forward(x[start : start + size]) for start in range(0, len(x), size)])


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int | None = None,
             batch_size: int | None = None):
    """(accuracy in percent, mean cross-entropy) of ``model`` on (x, y), ``batch_size`` samples a forward pass
    (default: ``inference_batch``); with ``num_classes``, also the per-class accuracies in percent (None for a
    class absent from y)."""
    batch_size = batch_size or inference_batch(x.device)
    correct = torch.zeros((), device=x.device)
    loss = torch.zeros((), device=x.device)
    hits = torch.zeros(num_classes or 1, device=x.device)
    with eval_mode(model):
        for start in range(0, len(y), batch_size):
            logits = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            loss += F.cross_entropy(logits, target, reduction="sum")
            right = logits.argmax(1) == target
            correct += right.sum()
            if num_classes:
                hits += torch.bincount(target[right], minlength=num_classes)
    n = max(len(y), 1)
    acc, mean_loss = 100.0 * correct.item() / n, loss.item() / n
    if not num_classes:
        return acc, mean_loss
    totals = torch.bincount(y, minlength=num_classes).double()
    per_class = [None if t == 0 else 100.0 * h / t for h, t in zip(hits.tolist(), totals.tolist(), strict=True)]
    return acc, mean_loss, per_class
