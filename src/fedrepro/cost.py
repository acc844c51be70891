"""What a full regeneration costs before it is submitted: jobs, runs, SGD steps and estimated hours.

    python -m fedrepro.cost --configfile config/paper.yaml [--gpu-tflops 60 --step-floor-ms 1.5]

Per run, SGD steps = rounds x sampled clients x local steps (epochs over ~N/K samples in batches, or the
stragglers' mean; plus Feddle's Fig. 2 diagnostic, every client's local steps in each evaluation round),
counted from the study file and each data set's training size. Per-step FLOPs (forward
and backward) come from torch.utils.flop_counter on the setting's model at its batch size. CPU seconds
per step are measured here on a reference model and scaled by FLOPs; GPU seconds per step are
max(step floor, FLOPs / sustained throughput) — small models on a GPU are bound by per-step latency, not
FLOPs; both numbers are assumptions you can set (defaults: a sustained 60 TFLOP/s, a 1.5 ms floor).

The asynchronous methods' passes over the server's own data (``server_passes``: Feddle's search, OOD feature
pass and gradient-cosine diagnostic, FedDF's teachers and distillation, Fed+FT's, HFCL's and Center's
training) are counted apart, in every round, from the study's server-set sizes (in-domain ``server_samples``,
out-of-domain ``ood_samples`` or the whole OOD set): their FLOPs per sample (forward, or forward and backward)
at the same throughput and floor per batch, shown as client-step equivalents and server hours.
Evaluation, data loading and start-up are not counted (a few % for the papers' budgets).
A tuned run is costed with the choices its tuning stages wrote under the results root (its local epochs may be
chosen); a run whose stage has not chosen yet, with its study file's values, and the count of those is printed.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedrepro.asyncfl.base import ServerPass, ServerWork
from fedrepro.asyncfl.methods import build_method
from fedrepro.config import REPO, load_yaml, resolve_config, run_studies
from fedrepro.data.registry import SHAPES as DATASETS
from fedrepro.data.registry import TEST_SIZES
from fedrepro.models import TEXT_MODELS, build_model
from fedrepro.sim.batches import batches_per_epoch
from fedrepro.sim.tensors import inference_batch
from fedrepro.study import grid_runs, run_spec
from fedrepro.tuning import written_choices_applied

GPU_INFERENCE_BATCH = inference_batch(torch.device("cuda"))  # the forward-only passes' batch on a GPU
SHOWN_METHODS = 6  # per study, the methods with the most server GPU-hours are printed
GPU_TFLOPS = 60.0  # the assumed sustained fp32/tf32 throughput of one GPU
STEP_FLOOR_MS = 1.5  # the least GPU time of one step (small models are bound by latency)


def step_flops(model_name: str, shape: tuple[int, ...], classes: int, batch: int, group_of: int = 0,
               backward: bool = True) -> float:
    """FLOPs of one SGD step (forward + backward) of ``model_name`` on a batch; with ``group_of`` = K clients,
    ``model_name`` is a model group and the step is the mean over the K clients' architectures (i mod X);
    with ``backward`` False, of the forward pass alone."""
    return models_step_flops(build_members(model_name, shape, classes, bool(group_of)), model_name, shape, batch,
                             group_of, backward)


def build_members(model_name: str, shape: tuple[int, ...], classes: int, group: bool,
                  **kwargs: object) -> dict[str, torch.nn.Module]:
    """``model_name`` built for ``shape`` and ``classes`` (``kwargs`` to ``build_model``): {name: model}, or for a
    model group each distinct architecture of it."""
    if group:
        from fedrepro.models.groups import build_arch, group_members

        return {m: build_arch(m, shape, classes) for m in dict.fromkeys(group_members(model_name))}
    return {model_name: build_model(model_name, shape, classes, **kwargs)}


def models_step_flops(models: dict[str, torch.nn.Module], model_name: str, shape: tuple[int, ...], batch: int,
                      group_of: int = 0, backward: bool = True) -> float:
    """``step_flops`` of models already built (``build_members``)."""
    if group_of:
        from fedrepro.models.groups import group_members

        members = group_members(model_name)
        flops = {m: _flops(model, shape, batch, False, backward) for m, model in models.items()}
        return sum(flops[members[i % len(members)]] for i in range(group_of)) / group_of
    return _flops(models[model_name], shape, batch, model_name in TEXT_MODELS, backward)


def _flops(model: torch.nn.Module, shape: tuple[int, ...], batch: int, text: bool, backward: bool = True) -> float:
    x = torch.zeros(batch, shape[0], dtype=torch.long) if text else torch.zeros(batch, shape[2], shape[0], shape[1])
    counter = FlopCounterMode(display=False)
    with counter:
        loss = F.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long))
        if backward:
            loss.backward()
    return float(counter.get_total_flops())


def cpu_seconds_per_flop(repeats: int = 30) -> float:
    """Measured here: one thread, the 4-layer CNN at batch 32 (a typical small-model step)."""
    torch.set_num_threads(1)
    model = build_model("cnn4", (28, 28, 1), 10)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad(), F.cross_entropy(model(x), y).backward(), opt.step()
    t0 = time.perf_counter()
    for _ in range(repeats):
        opt.zero_grad(), F.cross_entropy(model(x), y).backward(), opt.step()
    return (time.perf_counter() - t0) / repeats / step_flops("cnn4", (28, 28, 1), 10, 32)


def model_input(spec: dict) -> tuple[tuple[int, ...], int]:
    """(input shape as the model sees it, classes) of a run spec: the setting's resizing and grey -> colour
    expansion (FedGTST's MNIST) applied to its data set's shape."""
    _, raw, classes = DATASETS[spec["dataset"]]
    if len(raw) == 3:
        side = spec.get("image_size")
        return (side or raw[0], side or raw[1], spec.get("channels") or raw[2]), classes
    return raw, classes


def run_steps(spec: dict) -> float:
    """SGD steps of one run of ``spec``'s clients (none for an asynchronous method that samples none: Center)."""
    if spec.get("federation") == "async" and not build_method(spec["algorithm"], **spec["hparams"]).uses_clients:
        return 0.0
    n, _, _ = DATASETS[spec["dataset"]]
    part, t = spec["partition"], spec["training"]
    if part.get("pool_test"):
        n += TEST_SIZES[spec["dataset"]]
    n = part.get("samples") or n  # laptop scale: a class-stratified subset of that many is partitioned
    if spec.get("federation") == "hetero":
        n *= 0.75  # each client trains on its own 75% (fedrepro.hetero.engine.HeteroConfig.train_fraction)
    clients = part["clients"]
    if part["kind"] == "imbalance":  # long tail keeps about sum rho^(-c/(C-1)) of the classes
        c = DATASETS[spec["dataset"]][2]
        n = n / c * sum(part["rho"] ** (-i / (c - 1)) for i in range(c))
    per_client = n / clients
    sampled = max(1, round(t["join_ratio"] * clients))
    if t.get("straggler_steps"):
        local = sum(t["straggler_steps"]) / 2
    else:
        local = t["local_epochs"] * batches_per_epoch(math.ceil(per_client), t["batch_size"], t["drop_last"])
    steps = t["rounds"] * sampled * local
    if spec.get("async", {}).get("true_update"):  # Feddle's Fig. 2: every client trains in each evaluation
        steps += math.ceil(t["rounds"] / t["eval_every"]) * clients * local
    return steps


def server_passes(spec: dict) -> list[ServerPass]:
    """The passes over its own data that the server of an asynchronous run makes (the method's
    ``server_passes``), forward-only ones in a GPU's inference batch."""
    if spec.get("federation") != "async":
        return []
    method = build_method(spec["algorithm"], **spec["hparams"])
    asyn, t = spec["async"], spec["training"]
    n_id = asyn["server_samples"]
    n = n_id if method.server_data != "out_of_domain" else asyn.get("ood_samples") or DATASETS[asyn["ood_dataset"]][0]
    work = ServerWork(rounds=t["rounds"], samples=n, in_domain_samples=n_id,
                      clients_per_round=max(1, round(t["join_ratio"] * spec["partition"]["clients"])),
                      local_epochs=t["local_epochs"], client_batch=t["batch_size"])
    return [p if p.batch is not None else replace(p, batch=GPU_INFERENCE_BATCH) for p in method.server_passes(work)]


def server_cost(passes: list[ServerPass], sample_flops: dict[bool, float], gpu_tflops: float,
                step_floor_ms: float) -> tuple[float, float]:
    """(FLOPs, GPU seconds) of ``passes``; ``sample_flops[backward]``: one sample's FLOPs, forward (False) or
    forward and backward (True). Each batch takes the GPU at least the step floor, as a client's step."""
    flops = gpu_s = 0.0
    for p in passes:
        per_batch = p.batch * sample_flops[p.backward]
        flops += p.samples * sample_flops[p.backward]
        gpu_s += p.samples / p.batch * max(step_floor_ms / 1e3, per_batch / (gpu_tflops * 1e12))
    return flops, gpu_s


class FlopsCache:
    """step_flops per (model, input shape, classes, batch, group, backward), each counted once."""

    def __init__(self) -> None:
        self._known: dict[tuple, float] = {}

    def __call__(self, *key) -> float:
        if key not in self._known:
            self._known[key] = step_flops(*key)
        return self._known[key]


def job_cost(spec: dict, seeds: int, flops_of: FlopsCache, gpu_tflops: float, step_floor_ms: float,
             cpu_spf: float) -> dict:
    """What one train job of ``spec`` with ``seeds`` seeds costs: its clients' SGD steps and their GPU and CPU
    seconds, and its server's passes over its own data (in client-step equivalents) and their seconds."""
    shape, classes = model_input(spec)
    hetero = spec.get("federation") == "hetero"
    step = flops_of(spec["model"], shape, classes, spec["training"]["batch_size"],
                    spec["partition"]["clients"] if hetero else 0)
    steps = run_steps(spec) * seeds
    cost = {"steps": steps, "gpu_s": steps * max(step_floor_ms / 1e3, step / (gpu_tflops * 1e12)),
            "cpu_s": steps * step * cpu_spf, "server_steps": 0.0, "server_gpu_s": 0.0, "server_cpu_s": 0.0}
    if passes := server_passes(spec):  # one sample's FLOPs: a batch of one (FLOPs grow linearly with the batch)
        sample = {b: flops_of(spec["model"], shape, classes, 1, 0, b) for b in {p.backward for p in passes}}
        flops, run_gpu_s = server_cost(passes, sample, gpu_tflops, step_floor_ms)
        cost |= {"server_steps": flops / step * seeds, "server_gpu_s": run_gpu_s * seeds,
                 "server_cpu_s": flops * cpu_spf * seeds}
    return cost


def costed_spec(config: dict, study: dict, setting: str, method: str) -> tuple[dict, bool]:
    """(the spec a train job trains with, whether it is known): its tuning stages' choices applied where they are
    written under the config's results root; where one is not yet, the spec as its study file gives it and False."""
    spec = run_spec(study, setting, method)
    if not spec.get("tuned"):
        return spec, True
    applied = written_choices_applied(spec, config["results_dir"])
    return (spec, False) if applied is None else (applied, True)


def estimate(config: dict, gpu_tflops: float, step_floor_ms: float, cpu_spf: float) -> list[dict]:
    rows = []
    flops_of = FlopsCache()
    for name, study in run_studies(config).items():  # tuning runs cost too
        jobs = grid_runs(study)
        total = dict.fromkeys(("steps", "gpu_s", "cpu_s", "server_steps", "server_gpu_s", "server_cpu_s"), 0.0)
        server_by_method: dict[str, float] = {}
        unchosen = 0
        for setting, method in jobs:
            spec, chosen = costed_spec(config, study, setting, method)
            unchosen += not chosen
            cost = job_cost(spec, len(study["seeds"]), flops_of, gpu_tflops, step_floor_ms, cpu_spf)
            total = {k: v + cost[k] for k, v in total.items()}
            if cost["server_gpu_s"]:
                server_by_method[method] = server_by_method.get(method, 0.0) + cost["server_gpu_s"] / 3600
        rows.append({"study": name, "jobs": len(jobs), "runs": len(jobs) * len(study["seeds"]),
                     "steps": total["steps"], "gpu_hours": total["gpu_s"] / 3600, "cpu_hours": total["cpu_s"] / 3600,
                     "server_steps": total["server_steps"], "server_gpu_hours": total["server_gpu_s"] / 3600,
                     "server_cpu_hours": total["server_cpu_s"] / 3600, "server_gpu_hours_by_method": server_by_method,
                     "unchosen_jobs": unchosen})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", default=str(REPO / "config" / "paper.yaml"))
    parser.add_argument("--gpu-tflops", type=float, default=GPU_TFLOPS, help="sustained fp32/tf32 TFLOP/s of one GPU")
    parser.add_argument("--step-floor-ms", type=float, default=STEP_FLOOR_MS, help="GPU seconds per step at least (ms)")
    args = parser.parse_args()
    config = resolve_config(load_yaml(Path(args.configfile)), source=args.configfile)
    cpu_spf = cpu_seconds_per_flop()
    rows = estimate(config, args.gpu_tflops, args.step_floor_ms, cpu_spf)
    print(f"{args.configfile}: CPU cost measured here ({1 / cpu_spf / 1e9:.1f} GFLOP/s, one thread); GPU assumed "
          f"{args.gpu_tflops:g} TFLOP/s sustained with a {args.step_floor_ms:g} ms step floor; clients' SGD steps "
          f"and the server's passes over its own data (in client-step equivalents) counted apart")
    columns = ("steps", "gpu_hours", "cpu_hours", "server_steps", "server_gpu_hours", "server_cpu_hours")
    print(f"{'study':12s} {'jobs':>6s} {'runs':>6s} {'SGD steps':>12s} {'GPU-hours':>10s} {'CPU core-hours':>15s} "
          f"{'server steps':>12s} {'server GPU-h':>12s} {'server CPU-h':>12s}")
    total = {"study": "total", "jobs": sum(r["jobs"] for r in rows), "runs": sum(r["runs"] for r in rows),
             **{c: sum(r[c] for r in rows) for c in columns}}
    for r in [*rows, total]:
        print(f"{r['study']:12s} {r['jobs']:6d} {r['runs']:6d} {r['steps']:12.3g} {r['gpu_hours']:10.1f} "
              f"{r['cpu_hours']:15.1f} {r['server_steps']:12.3g} {r['server_gpu_hours']:12.1f} "
              f"{r['server_cpu_hours']:12.1f}")
    for r in rows:
        by_method = sorted(r["server_gpu_hours_by_method"].items(), key=lambda item: -item[1])
        if by_method:
            print(f"{r['study']} server GPU-hours by method: "
                  + ", ".join(f"{m} {h:.1f}" for m, h in by_method[:SHOWN_METHODS])
                  + (f", {len(by_method) - SHOWN_METHODS} more" if len(by_method) > SHOWN_METHODS else ""))
        if r["unchosen_jobs"]:
            print(f"{r['study']}: {r['unchosen_jobs']} of its jobs train with tuning choices not made yet, costed "
                  "with the values its study file gives")


if __name__ == "__main__":
    main()
