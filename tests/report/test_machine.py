"""Which machine produced the numbers: every run's summary.json records its CPU and torch's CPU capability, and
the scorecard says, once per study, which machines its runs came from."""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path

import pandas as pd
import torch

import fedrepro.train as train
from fedrepro.report.collect import collect_runs
from fedrepro.report.integrity import write_checked_csv
from fedrepro.report.scorecard import build_scorecard
from fedrepro.sim.runs import RunResult

SPEC = {"study": "s", "setting": "iid", "method": "fedavg", "training": {"rounds": 1, "last_k": 1}}
ROW = {"round": 1, "test_acc": 50.0, "test_loss": 1.0, "train_loss": 1.0, "bytes_up": 1, "bytes_down": 1,
       "seconds": 0.1}


def write(root: Path, seed: int) -> Path:
    """One seed's run folder, as a train job writes it (train.write_run)."""
    out = root / "runs" / SPEC["setting"] / SPEC["method"] / f"seed{seed}"
    train.write_run(out, SPEC, seed, RunResult(history=[ROW]), torch.device("cpu"))
    return out


def test_a_run_summary_records_its_cpu_and_torch_cpu_capability(tmp_path: Path) -> None:
    machine = json.loads((write(tmp_path, 0) / "summary.json").read_text())["machine"]
    assert machine["cpu"].strip() and machine["cpu"] != "unknown"
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["torch"] == torch.__version__ and machine["threads"] == torch.get_num_threads()


def test_the_kernel_set_asked_for_is_the_one_that_runs_and_is_recorded(tmp_path: Path) -> None:
    """`make test KERNELS=...` (Makefile) caps torch's kernels through the environment; a cap torch did not take
    would let a second pass of the suite run the native kernels again and prove nothing."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked:
        assert torch.backends.cpu.get_cpu_capability() == {"default": "DEFAULT"}.get(asked, asked.upper())
    machine = json.loads((write(tmp_path, 0) / "summary.json").read_text())["machine"]
    assert machine["onednn_max_cpu_isa"] == os.environ.get("ONEDNN_MAX_CPU_ISA")
    runs, summary = collect_runs([tmp_path / "runs/iid/fedavg/seed0"])
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    assert summary["cpu_capability"][0] == machine["cpu_capability"] + (f", oneDNN max ISA {isa}" if isa else "")


def test_cpu_model_reads_cpuinfo_and_falls_back_to_platform(tmp_path: Path, monkeypatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU @ 2.0GHz\n")
    assert train.cpu_model(cpuinfo) == "Some CPU @ 2.0GHz"
    monkeypatch.setattr(train.platform, "processor", lambda: "")
    assert train.cpu_model(tmp_path / "absent") == "unknown"


def test_the_scorecard_lists_each_machine_of_a_study_with_its_runs(tmp_path: Path, monkeypatch) -> None:
    here, capability = train.cpu_model(), torch.backends.cpu.get_cpu_capability()
    if isa := os.environ.get("ONEDNN_MAX_CPU_ISA"):  # a capped kernel set says so (Makefile, KERNELS)
        capability += f", oneDNN max ISA {isa}"
    dirs = [write(tmp_path, seed) for seed in (0, 1)]
    monkeypatch.setattr(train, "cpu_model", lambda: "Other CPU")
    dirs.append(write(tmp_path, 2))
    runs, summary = collect_runs(dirs)
    write_checked_csv(runs, tmp_path / "runs.csv")  # as the aggregation writes them
    write_checked_csv(summary, tmp_path / "summary.csv")
    spec = {"name": "t", "caption": "T", "paper_table": "Table 1", "metric": "best_acc", "claims": [],
            "rows": [{"method": "fedavg", "label": "FedAvg"}], "columns": [{"setting": "iid", "label": "IID"}]}
    pd.DataFrame([{"row": "FedAvg", "column": "IID", "method": "fedavg", "setting": "iid", "ours_mean": 50.0,
                   "paper_mean": math.nan, "paper_std": math.nan, "status": "ok", "n_seeds": 3, "ours_std": 0.0}]
                 ).to_csv(tmp_path / "t.csv", index=False)
    build_scorecard([("s", spec, tmp_path / "t.csv")], "embedded", tmp_path / "sc.md", tmp_path / "sc.html",
                    runs={"s": (tmp_path / "runs.csv", tmp_path / "summary.csv")})
    line = (f"Machines (CPU, torch CPU capability) the runs came from: {here} ({capability}): 2 runs; "
            f"Other CPU ({capability}): 1 run.")
    md = (tmp_path / "sc.md").read_text()
    assert md.count("Machines (") == 1 and line in md
    assert html.escape(line) in (tmp_path / "sc.html").read_text()
