"""The embedded default under other CPUs' kernels: does every run still finish, over more seeds than the default's?

    python benchmarks/default_on_kernel_sets.py [--sets native avx2 sse41] [--seeds 5] [--summarize-only]

For each kernel set of the Makefile's ``KERNELS`` (torch's ATen vectors and oneDNN's convolutions capped to what an
AVX2-only or an SSE4.1-only x86-64 CPU runs), this runs `config/config.yaml` with seeds 0..N-1 into
results/kernels/<set>/ (Snakemake, every core; a rerun resumes or skips what is done), then prints per set and run:
its status (diverged: the round and why), the number its tables report (best accuracy over rounds) and its plateau
change (the best over all evaluations minus the best over the first three quarters: at most 1 point is finished),
then per cell the mean and sd over seeds, and Disco's gain per column over the seeds both runs have, paired by seed.
About 3,700 s of training per set and 5 seeds natively (~31 minutes on 2 cores), twice that under SSE4.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from fedrepro.report.convergence import BEST_OVER_ROUNDS, PLATEAU_POINTS, plateau_check

REPO = Path(__file__).resolve().parents[1]
STUDY = "feddisco"


def kernel_sets(makefile: Path = REPO / "Makefile") -> dict[str, dict[str, str]]:
    """The Makefile's KERNELS sets (``KERNELS_<name> := VAR=value ...``), the one place they are defined."""
    found = re.findall(r"^KERNELS_(\w+) :=(.*)$", makefile.read_text(), flags=re.MULTILINE)
    return {name: dict(word.split("=", 1) for word in assignments.split()) for name, assignments in found}


KERNEL_SETS = kernel_sets()


def run_default(kernel_set: str, seeds: int, cores: int) -> None:
    overlay = {"showcase": None, "studies": {STUDY: {"seeds": list(range(seeds))}}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(overlay, fh)
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    env |= KERNEL_SETS[kernel_set]
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile", "config/config.yaml",
                    fh.name, "--config", f"results_dir=results/kernels/{kernel_set}"], cwd=REPO, env=env,
                   check=True)
    os.unlink(fh.name)


def runs_of(root: Path) -> pd.DataFrame:
    """One row per run of the study under ``root``: status, best accuracy, plateau change, why it diverged."""
    rows = []
    for summary_path in sorted((root / STUDY / "runs").glob("*/*/seed*/summary.json")):
        summary = json.loads(summary_path.read_text())
        acc = pd.read_csv(summary_path.with_name("metrics.csv"))["test_acc"].to_numpy(dtype=float)
        check = plateau_check(acc, BEST_OVER_ROUNDS)
        rows.append({"setting": summary["setting"], "method": summary["method"], "seed": summary["seed"],
                     "status": summary["status"], "diverged_round": summary["diverged_round"],
                     "why": (summary.get("divergence") or {}).get("why", ""), "best_acc": summary["best_acc"],
                     "plateau_change": np.nan if check is None else check.change,
                     "capability": summary["machine"]["cpu_capability"],
                     "onednn": summary["machine"].get("onednn_max_cpu_isa") or "native"})
    return pd.DataFrame(rows)


def paired_gain(runs: pd.DataFrame, setting: str) -> str:
    base = runs[(runs.setting == setting) & (runs.method == "fedavg") & (runs.status == "complete")]
    disco = runs[(runs.setting == setting) & (runs.method == "fedavg-disco") & (runs.status == "complete")]
    both = base.set_index("seed")["best_acc"].to_frame("a").join(disco.set_index("seed")["best_acc"].rename("b"),
                                                                  how="inner")
    d = (both["b"] - both["a"]).to_numpy()
    if len(d) < 2:
        return f"{setting}: fewer than 2 paired seeds"
    se = d.std(ddof=1) / np.sqrt(len(d))
    return (f"{setting}: Disco - FedAvg per seed {', '.join(f'{x:+.2f}' for x in d)}; mean {d.mean():+.2f} "
            f"± {se:.2f} (2 SE {2 * se:.2f}, {len(d)} pairs)")


def summarize(kernel_set: str) -> None:
    runs = runs_of(REPO / "results" / "kernels" / kernel_set)
    if runs.empty:
        print(f"{kernel_set}: no runs under results/kernels/{kernel_set}")
        return
    machines = sorted(set(zip(runs.capability, runs.onednn, strict=True)))
    finished = (runs.status == "complete") & (runs.plateau_change.abs() <= PLATEAU_POINTS)
    print(f"\n## {kernel_set} (torch capability, oneDNN max ISA: {machines}): {len(runs)} runs, "
          f"{int((runs.status == 'diverged').sum())} diverged, {int(finished.sum())} at their plateau")
    for r in runs.itertuples(index=False):
        state = r.status if r.status == "complete" else f"diverged at round {r.diverged_round}: {r.why}"
        print(f"  {r.setting:6s} {r.method:13s} seed {r.seed}: best {r.best_acc:6.2f}, plateau change "
              f"{r.plateau_change:+.2f}, {state}")
    cells = runs[runs.status == "complete"].groupby(["setting", "method"])["best_acc"].agg(["mean", "std", "count"])
    for (setting, method), c in cells.iterrows():
        print(f"  cell {setting} {method}: {c['mean']:.2f} ± {c['std']:.2f} over {int(c['count'])} seeds")
    for setting in sorted(runs.setting.unique()):
        print("  " + paired_gain(runs, setting))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(KERNEL_SETS), choices=list(KERNEL_SETS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    for kernel_set in args.sets:
        if not args.summarize_only:
            run_default(kernel_set, args.seeds, args.cores)
    for kernel_set in args.sets:
        summarize(kernel_set)


if __name__ == "__main__":
    main()
