"""Memory of getting a data set ready. Moving a prepared image set to the device (sim/tensors.py): chunked into
one preallocated tensor, with the same values as converting whole splits at once, and a peak of the resident
tensors plus a few chunks. DomainNet's leave-one-out preparation: each domain read straight into its place."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.images import CPU, image_set
from torch.profiler import ProfilerActivity, profile

from fedrepro import io
from fedrepro.data import domainnet
from fedrepro.data.format import PreparedFormatError, load_prepared, save_prepared
from fedrepro.sim import tensors
from fedrepro.sim.tensors import device_data_bytes, to_device_data


def whole_split_reference(prepared, image_size: int | None, channels: int | None) -> tuple[torch.Tensor, ...]:
    """The conversion as one expression per split: float, expand, resize, standardise with the train set's
    per-channel mean and unbiased sd."""
    def unit(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x).permute(0, 3, 1, 2).float().div_(255.0)
        if channels is not None and channels != t.shape[1]:
            t = t.expand(-1, channels, -1, -1)
        if image_size is not None and image_size != t.shape[-1]:
            t = F.interpolate(t, size=(image_size, image_size), mode="bilinear", align_corners=False)
        return t.contiguous(memory_format=torch.channels_last)

    x_train, x_test = unit(prepared.x_train), unit(prepared.x_test)
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return (x_train - mean) / std, (x_test - mean) / std


def allocation_peak(fn) -> tuple[object, int, int]:
    """(fn(), peak, net) CPU bytes allocated by torch while fn runs, from the profiler's allocation events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    held = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return result, peak, held


@pytest.mark.parametrize(("channels_in", "image_size", "channels"),
                         [(3, None, None), (1, None, 3), (3, 12, None), (1, 24, 3)],
                         ids=["plain", "grey_to_colour", "resize", "grey_to_colour_resize"])
def test_chunked_move_equals_whole_split_conversion(monkeypatch: pytest.MonkeyPatch, channels_in: int,
                                                    image_size: int | None, channels: int | None) -> None:
    monkeypatch.setattr(tensors, "CHUNK_BYTES", 20_000)  # a few images per chunk, the last one partial
    prepared = image_set(103, 41, 16, channels_in)
    data = to_device_data(prepared, CPU, image_size, channels)
    ref_train, ref_test = whole_split_reference(prepared, image_size, channels)
    assert torch.equal(data.x_train, ref_train) and torch.equal(data.x_test, ref_test)
    assert data.x_train.is_contiguous(memory_format=torch.channels_last)
    assert data.shape == (image_size or 16, image_size or 16, channels or channels_in)


def test_peak_grows_as_the_float_data_not_three_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "CHUNK_BYTES", 64 * 1024)
    peaks, floats = [], []
    for n in (200, 400):
        data, peak, _ = allocation_peak(lambda n=n: to_device_data(image_set(n, n // 4, 16, 3), CPU))
        peaks.append(peak)
        floats.append(data.x_train.nbytes + data.x_test.nbytes)
    # converting whole splits at once held the train floats three times over (slope 2.6 here)
    assert (peaks[1] - peaks[0]) / (floats[1] - floats[0]) < 1.05


@pytest.mark.parametrize(("channels_in", "image_size", "channels"), [(3, None, None), (1, 24, 3)],
                         ids=["plain", "grey_to_colour_resize"])
def test_device_data_bytes_bounds_the_measured_peak(monkeypatch: pytest.MonkeyPatch, channels_in: int,
                                                    image_size: int | None, channels: int | None) -> None:
    monkeypatch.setattr(tensors, "CHUNK_BYTES", 64 * 1024)
    prepared = image_set(300, 75, 16, channels_in)
    data, peak, held = allocation_peak(lambda: to_device_data(prepared, CPU, image_size, channels))
    resident, projected_peak = device_data_bytes(300, 75, data.shape)
    assert held == resident == sum(t.nbytes for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    assert resident < peak <= projected_peak


def write_domains(data_dir: Path, per_domain: int) -> list[Path]:
    """Prepared files of the six DomainNet domains, domain i with (i + 1) * per_domain train images (and half
    that in test) of 16x16x3; the paths of all but clipart, in DOMAINS order."""
    paths = []
    for i, d in enumerate(domainnet.DOMAINS):
        n_train, n_test = (i + 1) * per_domain, (i + 1) * per_domain // 2
        meta = {"name": f"domainnet_{d}", "num_classes": 2, "classes": ["a", "b"], "shape": [16, 16, 3],
                "source": "test", "domain": d}
        save_prepared(data_dir / f"domainnet_{d}.npz", np.full((n_train, 16, 16, 3), i, np.uint8),
                      np.arange(n_train) % 2, np.full((n_test, 16, 16, 3), i, np.uint8), np.arange(n_test) % 2, meta)
        paths.append(data_dir / f"domainnet_{d}.npz")
    return paths[1:]


def test_leave_one_out_holds_its_output_and_no_domain_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io, "READ_BLOCK_BYTES", 4096)
    beyond_output = []
    for per_domain in (100, 400):
        inputs = write_domains(tmp_path, per_domain)
        tracemalloc.start()
        try:
            arrays = domainnet.prepare_leave_one_out("clipart", inputs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert np.array_equal(arrays[0][: 2 * per_domain], np.full((2 * per_domain, 16, 16, 3), 1, np.uint8))
        beyond_output.append(peak - sum(a.nbytes for a in arrays[:4]))
    largest_domain_growth = 6 * 300 * (1 + 1 / 2) * 16 * 16 * 3  # sketch's images, per_domain 100 -> 400
    # loading each domain whole, then copying it, held the two largest domains beside the output (growth ~2x)
    assert beyond_output[1] - beyond_output[0] < 0.25 * largest_domain_growth


def test_load_prepared_reads_into_given_arrays(tmp_path: Path) -> None:
    path = write_domains(tmp_path, 10)[0]  # infograph: 20 train, 10 test images
    whole = load_prepared(path)
    x_train = np.zeros((25, 16, 16, 3), np.uint8)
    loaded = load_prepared(path, into={"x_train": x_train[5:], "y_test": np.empty(10, np.int64)})
    assert np.shares_memory(loaded.x_train, x_train) and np.array_equal(x_train[5:], whole.x_train)
    assert not x_train[:5].any() and np.array_equal(loaded.y_test, whole.y_test)
    with pytest.raises(PreparedFormatError, match=f"{path}: x_test is uint8 \\(10, 16, 16, 3\\)"):
        load_prepared(path, into={"x_test": np.empty((9, 16, 16, 3), np.uint8)})
