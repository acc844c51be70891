"""SLURM: what profiles/slurm asks of the scheduler (dry run, no cluster), and the tiny study run for real
through a throwaway single-node cluster (tools/slurm/start.sh: root, Debian/Ubuntu packages, a fake GPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
TOOLS = REPO / "tools" / "slurm"
LOCALRULES = {"download_dataset", "aggregate", "table", "figure"}
TINY = "studies:\n  feddisco: tests/data/tiny_study.yaml\ntrain_resources: {gpu: 1}\n"
SLURM_RUN_TIMEOUT = 420  # snakemake can wait forever on a broken status query: never let it


def clean_env() -> dict[str, str]:
    """This environment without SLURM_* variables (a stale SLURM_CONF would point clients elsewhere)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}


def start(cmd: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int | None, str]:
    """Exit code and output (stdout and stderr together); on timeout kill it (SIGKILL: snakemake may ignore
    SIGTERM) and return None."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, out + f"\n[killed after {timeout} s]"
    return proc.returncode, out


def run(cmd: list[str], timeout: float, **kw) -> tuple[int | None, str]:
    return finish(start(cmd, **kw), timeout)


def jobs_of(dry_run_output: str) -> list[dict]:
    """The jobs a dry run lists (group members included): rule, threads and resources of each."""
    jobs = []
    for m in re.finditer(r"^\s*(?:local)?rule (\w+):\n((?:[ \t]+\S.*\n?)*)", dry_run_output, flags=re.M):
        body = m[2]
        threads = re.search(r"^\s*threads: (\d+)$", body, flags=re.M)
        res = re.search(r"^\s*resources: (.*)$", body, flags=re.M)
        jobs.append({
            "rule": m[1],
            "threads": int(threads[1]) if threads else 1,
            "resources": dict(kv.split("=", 1) for kv in res[1].split(", ")) if res else {},
        })
    return jobs


def declared_localrules() -> set[str]:
    text = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    return {name for block in re.findall(r"^localrules:\n((?:[ \t]+\w+,?\n)+)", text, flags=re.M)
            for name in re.findall(r"\w+", block)}


def paper_config(tmp_path: Path) -> list[str]:
    """config/paper.yaml when all its study files exist, else the embedded default asking for GPUs."""
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    if all(not isinstance(s, str) or (REPO / s).exists() for s in paper["studies"].values()):
        return [str(REPO / "config" / "paper.yaml")]
    override = tmp_path / "gpu.yaml"
    override.write_text("train_resources: {gpu: 1, threads: 4}\n")
    return [str(REPO / "config" / "config.yaml"), str(override)]


def test_slurm_profile_asks_a_gpu_for_train_jobs_and_none_for_localrules(tmp_path):
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and "slurm_partition" in profile["default-resources"]
    # a profile-wide cpus_per_task would override every job's threads in the sbatch call
    assert "cpus_per_task" not in profile["default-resources"]
    assert declared_localrules() == LOCALRULES

    configs = paper_config(tmp_path)
    want: dict = {}  # train_resources as the given config files set them
    for c in configs:
        want.update((yaml.safe_load(Path(c).read_text()) or {}).get("train_resources", {}))
    proc = subprocess.run([*SNAKEMAKE, "--profile", "profiles/slurm", "--workflow-profile", "none", "-n",
                           "--directory", str(tmp_path), "--configfile", *configs],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = jobs_of(proc.stdout)
    train = [j for j in jobs if j["rule"] == "train"]
    assert train, proc.stdout[-3000:]
    for job in train:
        assert job["resources"].get("gpu") == "1", job  # sbatch --gpus=1
        for key in ("mem_mb", "runtime"):
            assert key not in want or job["resources"][key] == str(want[key]), job
        assert "threads" not in want or job["threads"] == want["threads"], job  # not capped at cores: 2
        assert "cpus_per_task" not in job["resources"], job
    local = [j for j in jobs if j["rule"] in LOCALRULES]
    assert {j["rule"] for j in local} >= {"aggregate", "table", "figure"}
    for job in [*local, *(j for j in jobs if j["rule"] in {"prepare_dataset", "partition"})]:
        assert "gpu" not in job["resources"] and "gres" not in job["resources"], job


@pytest.fixture(scope="module")
def slurm_cluster():
    """A single-node SLURM cluster with one fake GPU for this module; always stopped afterwards."""
    if os.geteuid() != 0:
        pytest.skip("SLURM test cluster needs root (tools/slurm/start.sh starts munged, slurmctld, slurmd)")
    if not shutil.which("slurmctld") and not (shutil.which("apt-get") and shutil.which("dpkg")):
        pytest.skip("SLURM is not installed and there is no apt-get/dpkg to install it")
    try:
        code, out = run(["bash", str(TOOLS / "start.sh")], timeout=600, env=clean_env())
        if code == 77:
            pytest.skip(f"tools/slurm/start.sh cannot run here: {out.strip()[-500:]}")
        assert code == 0, f"tools/slurm/start.sh failed (exit {code}):\n{out}"
        yield
    finally:
        run(["bash", str(TOOLS / "stop.sh")], timeout=120, env=clean_env())


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                         timeout=30, env=clean_env()).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def without_seconds(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns="seconds", errors="ignore")


@pytest.mark.slurm
@pytest.mark.slow
def test_tiny_study_through_slurm_equals_the_local_run(slurm_cluster, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    # the local reference runs beside the SLURM run: the SLURM jobs mostly wait on the scheduler
    local_proc = start([*SNAKEMAKE, "--cores", "2", "--directory", str(local), "--configfile", str(config)],
                       cwd=REPO, env=clean_env())
    code, out = run([*SNAKEMAKE, "--executor", "slurm", "--profile", "profiles/slurm-test", "--workflow-profile",
                     "none", "--directory", str(on_slurm), "--configfile", str(config)],
                    timeout=SLURM_RUN_TIMEOUT, cwd=REPO, env=clean_env())
    local_code, local_out = finish(local_proc, timeout=300)
    ctld_log = Path(os.environ.get("FEDREPRO_SLURM_DIR", "/tmp/fedrepro-slurm")) / "log" / "slurmctld.log"
    assert code == 0, out[-4000:] + "\n--- slurmctld.log\n" + (
        ctld_log.read_text()[-2000:] if ctld_log.exists() else "(none)")
    assert local_code == 0, local_out[-3000:]

    # the same artifacts, and the same numbers except wall seconds
    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in (root / "results").rglob("*") if p.is_file()}

    assert files(on_slurm) == files(local)
    res = on_slurm / "results" / "feddisco"
    for path in ["tables/t1.md", "tables/t1.tex", "tables/t1.csv", "figures/curves.png", "figures/curves.pdf"]:
        assert (res / path).stat().st_size > 0, path
    for rel in ["runs.csv", "summary.csv", "tables/t1.csv",
                *(str(p.relative_to(local / "results/feddisco"))
                  for p in (local / "results/feddisco/runs").rglob("metrics.csv"))]:
        pd.testing.assert_frame_equal(without_seconds(res / rel), without_seconds(local / "results/feddisco" / rel),
                                      check_exact=True, obj=rel)
    assert set(pd.read_csv(res / "summary.csv")["status"]) == {"complete"}

    # train jobs went through SLURM, each with a GPU request; prepare/partition as one group job, no GPU;
    # aggregate, table and figure ran here as localrules
    logs = on_slurm / ".snakemake" / "slurm_logs"
    train_logs = sorted((logs / "rule_train").glob("*/*.log"))
    assert [p.parent.name for p in train_logs] == ["feddisco_iid4_fedavg", "feddisco_iid4_fedprox"]
    train_jobs = []
    for log in train_logs:
        assert "rule train:" in log.read_text(), log
        job = scontrol_job(log.stem)
        assert job.get("JobState") == "COMPLETED" and job.get("Partition") == "debug", job
        assert job.get("Comment", "").startswith("rule_train_"), job
        assert "gpu:1" in job.get("TresPerJob", ""), job  # sbatch --gpus=1
        train_jobs.append(job)
    # the node has one GPU, so SLURM ran the two train jobs one after the other (ISO times sort as text)
    first, second = sorted(train_jobs, key=lambda j: j["StartTime"])
    assert second["StartTime"] >= first["EndTime"], (first, second)
    prep_logs = list(logs.glob("group_prep*/*.log"))
    assert len(prep_logs) == 1
    assert "gpu" not in scontrol_job(prep_logs[0].stem).get("TresPerJob", "")
    assert {p.name for p in logs.iterdir()} == {"rule_train", prep_logs[0].parent.name}
    for rule in ["aggregate", "table", "figure"]:
        assert f"localrule {rule}:" in out, rule
