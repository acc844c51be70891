"""Peak memory of a FedAvg job against its client count: per-client state is vectors, not models.

    python benchmarks/memory.py            # 10 vs 100 clients, FedAvg and SCAFFOLD, each in a fresh process

Each run is a fresh Python process (so its peak RSS is its own): the 4-layer CNN on digits, Dirichlet
1.0 (100 clients on 1347 digits leave no room for 0.1), full participation, 2 rounds. FedAvg keeps no
per-client state; SCAFFOLD keeps one control-variate vector per client that has trained, so its memory
grows by clients x parameters x 4 bytes, by design.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
from fedrepro import seeding
from fedrepro.algorithms import build_algorithm
from fedrepro.data.registry import DATASETS
from fedrepro.models import build_model
from fedrepro.partition import make_partition
from fedrepro.sim.sync import FederatedRun, TrainingConfig
from fedrepro.sim.tensors import to_device_data

clients, algorithm = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
class Digits:
    def __init__(self):
        self.x_train, self.y_train, self.x_test, self.y_test, self.meta = DATASETS["digits"].prepare(None)
data = to_device_data(Digits(), torch.device("cpu"))
parts = make_partition(data.y_train.numpy(), {"kind": "dirichlet", "clients": clients, "beta": 1.0, "min_size": 1}, 0)
torch.manual_seed(seeding.derive_seed(0, seeding.INIT))
cfg = TrainingConfig(rounds=2, local_epochs=1, batch_size=10, lr=0.01)
run = FederatedRun(build_model("cnn4", data.shape, 10), build_algorithm(algorithm), data, parts, cfg,
                   {"kind": "size"}, 0, log=lambda m: None, engine="sequential")
run.run()
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "params": run.flat.numel}))
"""


def peak(clients: int, algorithm: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(clients), algorithm], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    print(f"{'method':10s} {'10 clients':>11s} {'100 clients':>12s} {'ratio':>6s}   (peak RSS, MB)")
    for algorithm in ("fedavg", "scaffold"):
        small, large = peak(10, algorithm), peak(100, algorithm)
        print(f"{algorithm:10s} {small['rss_mb']:11.0f} {large['rss_mb']:12.0f} "
              f"{large['rss_mb'] / small['rss_mb']:6.2f}   ({small['params']} parameters)")


if __name__ == "__main__":
    main()
