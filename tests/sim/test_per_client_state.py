"""State that grows with the number of clients: CA2FL's cache of every client's latest update lives in host
memory (device state O(P)), is checkpointed once and restored exactly; methods declare their per-client bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.asyncfl import make_run
from support.common import digits_cut

import fedrepro.sim.checkpoint as checkpoint_module
from fedrepro.algorithms import ALGORITHMS, build_algorithm
from fedrepro.asyncfl.base import Update
from fedrepro.asyncfl.engine import _tensor_bytes
from fedrepro.asyncfl.methods import METHODS, build_method

torch.set_num_threads(1)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
P, NUM_CLIENTS = 1000, 16


@pytest.fixture(scope="module")
def data8(digits_prepared):
    return digits_cut(digits_prepared, 300, 200, image_size=8)


def arrivals(clients: list[int], device: str, seed: int = 0) -> list[Update]:
    """One random update per entry of ``clients`` (repeats: a client's later update replaces its cached one)."""
    gen = torch.Generator().manual_seed(seed)
    return [Update(cid=cid, delta=torch.randn(P, generator=gen).to(device), w_start=torch.zeros(P, device=device),
                   dispatch_round=1, staleness=0, num_samples=10) for cid in clients]


def ca2fl(buffer_size: int = 3):
    method = build_method("ca2fl", server_lr=0.7, buffer_size=buffer_size)
    method.setup(SimpleNamespace(flat=None, model=None, num_clients=NUM_CLIENTS, seed=0))
    return method


def reference_ca2fl(w: torch.Tensor, updates: list[Update], buffer_size: int = 3, server_lr: float = 0.7):
    """The module docstring's rule with a plain dict of cached vectors on the updates' device: h^t = the cache
    mean at a buffer period's start, calibration sum(Delta_i - h_i), a step every ``buffer_size`` updates
    (running sums in arrival order, as CA2FL has always kept them, so the float32 rounding is the same)."""
    cache: dict[int, torch.Tensor] = {}
    cache_sum, calib, count, models = torch.zeros_like(w), torch.zeros_like(w), 0, []
    for u in updates:
        if count == 0:
            h = cache_sum / NUM_CLIENTS
        change = u.delta - cache.get(u.cid, torch.zeros_like(u.delta))
        calib += change
        cache_sum += change
        cache[u.cid] = u.delta.clone()
        count += 1
        if count == buffer_size:
            w = w + server_lr * (h + calib / count)
            calib.zero_()
            count = 0
        models.append(w)
    return models, cache, cache_sum


def device_bytes(state: object, device: torch.device) -> int:
    """Bytes of the tensors in a state tree that live on ``device``."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() if state.device == device else 0
    if isinstance(state, dict):
        return sum(device_bytes(v, device) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(device_bytes(v, device) for v in state)
    return 0


@pytest.mark.parametrize("device", DEVICES)
def test_ca2fl_equals_a_plain_dict_cache_bit_for_bit(device):
    updates = arrivals([3, 5, 3, 0, 7, 5, 5, 9, 0, 3, 12, 7, 1], device)
    expected, cache, cache_sum = reference_ca2fl(torch.zeros(P, device=device), updates)
    method, w = ca2fl(), torch.zeros(P, device=device)
    for u, want in zip(updates, expected, strict=True):
        w = method.server_receive(w, u)
        assert torch.equal(w, want)
    assert torch.equal(method.state["cache_sum"], cache_sum)
    assert method.state["cache"].keys() == cache.keys()
    assert all(torch.equal(method.state["cache"][cid].to(device), cache[cid]) for cid in cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: on the CPU host and device memory are one")
def test_ca2fl_device_memory_does_not_grow_with_the_clients_that_reported():
    method, w = ca2fl(), torch.zeros(P, device="cuda")
    allocated = []
    for reported in (2, 8, 14):
        for u in arrivals(list(range(reported)), "cuda", seed=reported):
            w = method.server_receive(w, u)
        allocated.append(torch.cuda.memory_allocated())
        assert all(row.device.type == "cpu" for row in method.state["cache"].values())
    assert allocated[0] == allocated[1] == allocated[2]


@pytest.mark.parametrize("reported", [2, 12])
def test_a_resumed_ca2fl_keeps_its_cache_in_host_memory_and_o_p_state_on_the_device(reported):
    """Resuming onto an accelerator (here the meta device, which holds no data) moves the sums there and leaves
    the cache rows where torch.load put them, in host memory, uncopied."""
    method, w = ca2fl(), torch.zeros(P)
    for u in arrivals(list(range(reported)), "cpu"):
        w = method.server_receive(w, u)
    resumed = ca2fl()
    resumed.load_state(method.state, torch.device("meta"))
    assert device_bytes(resumed.state, torch.device("meta")) == 3 * 4 * P  # cache_sum, calib, h^t
    assert all(resumed.state["cache"][cid] is row for cid, row in method.state["cache"].items())
    assert _tensor_bytes(resumed.state["cache"]) == reported * resumed.state_bytes_per_client(P)


def test_a_checkpoint_holds_the_cache_once_saved_from_the_live_rows(data8, tmp_path, monkeypatch):
    shared = []
    save = checkpoint_module.save_checkpoint

    def recording_save(path, fingerprint, payload):
        live = runs["ca2fl"].method.state.get("cache", {})
        shared.append(all(payload["state"]["cache"][cid].data_ptr() == row.data_ptr() for cid, row in live.items()))
        save(path, fingerprint, payload)

    runs, sizes = {}, {}
    for name in ("fedbuff", "ca2fl"):  # the same dispatches, arrivals and history; only the state differs
        runs[name] = make_run(data8, name, {"buffer_size": 4}, rounds=4, sigma=1.0, checkpoint_every=4)
        if name == "ca2fl":
            monkeypatch.setattr(checkpoint_module, "save_checkpoint", recording_save)
        runs[name].run(tmp_path / f"{name}.pt", "fp")
        sizes[name] = (tmp_path / f"{name}.pt").stat().st_size
    method = runs["ca2fl"].method
    per_client = method.state_bytes_per_client(runs["ca2fl"].flat.numel)
    cached = len(method.state["cache"])
    assert shared == [True] and cached >= 5
    # CA2FL's state beyond FedBuff's buffer: the cache once, its sum, the calibration sum and h^t
    assert cached * per_client < sizes["ca2fl"] - sizes["fedbuff"] < (cached + 3) * per_client
    saved = torch.load(tmp_path / "ca2fl.pt", weights_only=False)["state"]["cache"]
    assert all(torch.equal(saved[cid], row) for cid, row in method.state["cache"].items())


def test_methods_declare_the_full_vectors_they_keep_per_client():
    per_client = {name: build_method(name).state_bytes_per_client(P) for name in METHODS}
    assert per_client == {name: 4 * P if name == "ca2fl" else 0 for name in METHODS}
    keeps = {"scaffold": 4 * P, "feddyn": 4 * P, "moon": 4 * P, "feddc": 8 * P}  # c_k; grad_k; prev; h_k and g_k
    assert {name: build_algorithm(name).state_bytes_per_client(P) for name in ALGORITHMS} == {
        name: keeps.get(name, 0) for name in ALGORITHMS}
    # switched-off terms keep nothing
    assert build_algorithm("feddyn", alpha=0.0).state_bytes_per_client(P) == 0
    assert build_algorithm("moon", mu=0.0).state_bytes_per_client(P) == 0
    assert build_algorithm("feddc", grad_correction=False).state_bytes_per_client(P) == 4 * P
    assert build_algorithm("feddc", alpha=0.0, grad_correction=False).state_bytes_per_client(P) == 0
