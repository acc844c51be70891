"""Which of torch's CPU kernel sets give distinct numbers on this machine, and what each costs.

    python benchmarks/kernel_sets.py

Users' CPUs differ (Intel, AMD, AVX2-only, AVX-512), and so do the kernels torch runs on them: ATen's vectorised
element-wise and reduction kernels follow ``ATEN_CPU_CAPABILITY`` (default = no vectors, avx2, avx512), oneDNN's
convolutions follow ``ONEDNN_MAX_CPU_ISA`` (SSE41, AVX2, AVX512_CORE, ...). Capping either on one machine runs the
kernels another CPU would, so the rounding another CPU gives can be had here (docs/measurements/kernel-sets.md;
the Makefile's ``KERNELS`` names the sets the tests and the default were checked under).

Each setting runs in a fresh process (torch reads both variables once, at start): a convolution, a matrix product,
an element-wise chain, and 20 SGD steps of FedDisco's simple CNN on fixed inputs. Rows: the capability torch
reports, a digest of each result (equal digests: bit-identical numbers), which group of identical training results
the setting falls in, and the milliseconds of one training step (batch 64, one thread) with its ratio to this
machine's own kernels in the same run.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

ATEN = ("", "default", "avx2", "avx512")
ONEDNN = ("", "SSE41", "AVX2", "AVX512_CORE")

PROBE = r"""
import hashlib, json, time, torch
import torch.nn.functional as F
from fedrepro.models import build_model
from fedrepro.sim.flat import FlatModel

torch.set_num_threads(1)
torch.manual_seed(0)


def digest(t):
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:10]


x = torch.randn(64, 1, 28, 28).contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 10, (64,))
a, b = torch.randn(64, 400), torch.randn(400, 120)
out = {"capability": torch.backends.cpu.get_cpu_capability(),
       "conv": digest(F.conv2d(x, torch.randn(6, 1, 5, 5))), "matmul": digest(a @ b),
       "elementwise": digest(torch.tanh(a).exp().sum(1))}
model = build_model("simple_cnn", (28, 28, 1), 10)
flat = FlatModel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps = []
for _ in range(40):
    t0 = time.perf_counter()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    steps.append(time.perf_counter() - t0)
    if len(steps) == 20:
        out["training"] = digest(flat.w)
out["ms_per_step"] = 1e3 * sorted(steps[20:])[10]
print(json.dumps(out))
"""


def probe(aten: str, onednn: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    env |= {"ATEN_CPU_CAPABILITY": aten} if aten else {}
    env |= {"ONEDNN_MAX_CPU_ISA": onednn} if onednn else {}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    rows = [(aten, onednn, probe(aten, onednn)) for aten, onednn in itertools.product(ATEN, ONEDNN)]
    groups: dict[str, int] = {}
    native_ms = rows[0][2]["ms_per_step"]
    print(f"torch: the capability it reports; digests of each result (equal: bit-identical); group: settings whose "
          f"20 training steps end bit-identical; ms: one step, batch 64, one thread (native {native_ms:.2f})")
    print(f"{'ATEN_CPU_CAPABILITY':>19s} {'ONEDNN_MAX_CPU_ISA':>18s} | {'torch':>7s} {'conv':>10s} {'matmul':>10s} "
          f"{'elementw.':>10s} {'training':>10s} group | {'ms':>5s} {'x native':>8s}")
    for aten, onednn, r in rows:
        group = groups.setdefault(r["training"], len(groups) + 1)
        print(f"{aten or '(native)':>19s} {onednn or '(native)':>18s} | {r['capability']:>7s} {r['conv']:>10s} "
              f"{r['matmul']:>10s} {r['elementwise']:>10s} {r['training']:>10s} {group:5d} | "
              f"{r['ms_per_step']:5.2f} {r['ms_per_step'] / native_ms:8.2f}")
    print(f"{len(groups)} distinct training results among {len(rows)} settings")


if __name__ == "__main__":
    main()
