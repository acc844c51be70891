"""SLURM: what profiles/slurm asks of the scheduler (dry run, no cluster), the tiny study run for real
through a throwaway single-node cluster (tools/slurm/start.sh: root, Debian/Ubuntu packages, a fake GPU),
and a train job cancelled mid-run with scancel that a rerun resumes to the uninterrupted run's numbers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from support.common import REPO
from support.processes import described, kill_marked, marked, marked_env, names, new_mark

from fedrepro.config import merge_configfiles, resolve_config
from fedrepro.study import job_resources

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
TOOLS = REPO / "tools" / "slurm"
LOCALRULES = {"download_dataset", "download_weights", "aggregate", "aggregate_finetune", "table", "figure", "scorecard",
              "showcase", "choose_tuning"}  # choose_tuning reads the tuning runs' summaries: seconds, no GPU
TINY = "studies:\n  feddisco: tests/data/tiny_study.yaml\ntrain_resources: {gpu: 1}\n"
SLURM_RUN_TIMEOUT = 420  # snakemake can wait forever on a broken status query: never let it
# one train job of 100 rounds (~10 s of training), long enough to be cancelled in the middle
PREEMPT = "studies:\n  pre: tests/data/preempt_study.yaml\ntrain_resources: {gpu: 1}\n"
PREEMPT_RUN = "results/pre/runs/niid/fedavg"


def _preempt_checkpoint() -> str:
    """The train job's checkpoint: under a digest of its run spec (workflow/rules/common.smk)."""
    from fedrepro.config import resolve_config
    from fedrepro.study import run_spec, spec_digest

    study = resolve_config({"studies": {"pre": "tests/data/preempt_study.yaml"}})["studies"]["pre"]
    return f"results/pre/checkpoints/niid/fedavg/{spec_digest(run_spec(study, 'niid', 'fedavg'))}/seed0.pt"


PREEMPT_CKPT = _preempt_checkpoint()


def clean_env(mark: str | None = None) -> dict[str, str]:
    """This environment without SLURM_* variables (a stale SLURM_CONF would point clients elsewhere), with
    ``mark`` (processes.marked_env) if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    return marked_env(env, mark) if mark else env


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
    """The jobs a dry run lists (group members included): rule, threads, resources and wildcards of each."""
    jobs = []
    for m in re.finditer(r"^\s*(?:local)?rule (\w+):\n((?:[ \t]+\S.*\n?)*)", dry_run_output, flags=re.M):
        body = m[2]
        threads = re.search(r"^\s*threads: (\d+)$", body, flags=re.M)
        res = re.search(r"^\s*resources: (.*)$", body, flags=re.M)
        wildcards = re.search(r"^\s*wildcards: (.*)$", body, flags=re.M)
        jobs.append({
            "rule": m[1],
            "threads": int(threads[1]) if threads else 1,
            "resources": dict(kv.split("=", 1) for kv in res[1].split(", ")) if res else {},
            "wildcards": dict(kv.split("=", 1) for kv in wildcards[1].split(", ")) if wildcards else {},
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


def test_kill_marked_ends_a_detached_process_tree_and_nothing_else():
    """What the SLURM tests' teardown relies on: every marked process, also one in a session of its own (as a
    SLURM job's steps are: no parent-child walk from the test reaches them) and one that ignores SIGTERM."""
    mark = new_mark()
    tree = subprocess.Popen(["bash", "-c", "setsid sleep 300 & trap '' TERM; sleep 300 & wait"],
                            env=marked_env(os.environ.copy(), mark), start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        # bash and its two sleeps, each past its exec: a child caught between fork and exec is still a bash, and
        # its environment can be unreadable for that instant (seen once: 2 of 3 found right after 3 were)
        deadline = time.monotonic() + 5
        started = marked(mark)
        while sorted(names(started)) != ["bash", "sleep", "sleep"] and time.monotonic() < deadline:
            time.sleep(0.02)
            started = marked(mark)
        assert len(started) == 3 and tree.pid in {p.pid for p in started}
        assert len({os.getsid(p.pid) for p in started}) == 2  # the setsid sleep left the tree's session
        assert kill_marked(mark, timeout=0.5) == [] and marked(mark) == []
        tree.wait(timeout=5)
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in started)
        assert bystander.poll() is None  # unmarked: left alone
    finally:
        for proc in (tree, bystander):
            proc.kill()
            proc.wait()


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
    studies = resolve_config(merge_configfiles(*configs))["studies"]
    for job in train:
        assert job["resources"].get("gpu") == "1", job  # sbatch --gpus=1
        w = job["wildcards"]  # train_resources, or what the study asks for this setting x method
        asked = {**want, **job_resources({}, studies[w["study"]], w["setting"], w["method"])}
        for key in ("mem_mb", "runtime"):
            assert key not in asked or job["resources"][key] == str(asked[key]), job
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


@pytest.fixture
def own_processes():
    """A marker for the snakemake runs a SLURM test starts (clean_env(mark)): sbatch and srun pass it on to
    every process of the jobs. At teardown whatever still carries it is killed, and none may survive that.
    A cancelled job's snakemake can outlive its job: scancel's SIGTERM ends the batch script's shell first,
    which orphans the snakemake and srun it started (reparented to init, so out of the process tree that
    start.sh's proctrack/linuxproc SIGKILLs KillWait later), and snakemake waits for its running job on
    SIGTERM; once the cluster is stopped, nothing else would end them."""
    mark = new_mark()
    yield mark
    left = kill_marked(mark)
    assert not left, f"processes of this test survive SIGKILL: {described(left)}"


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                         timeout=30, env=clean_env()).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def without_seconds(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns="seconds", errors="ignore")


@pytest.mark.slurm
@pytest.mark.slow
def test_tiny_study_through_slurm_equals_the_local_run(slurm_cluster, own_processes, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    # the local reference runs beside the SLURM run: the SLURM jobs mostly wait on the scheduler
    local_proc = start([*SNAKEMAKE, "--cores", "2", "--directory", str(local), "--configfile", str(config)],
                       cwd=REPO, env=clean_env(own_processes))
    code, out = run([*SNAKEMAKE, "--executor", "slurm", "--profile", "profiles/slurm-test", "--workflow-profile",
                     "none", "--directory", str(on_slurm), "--configfile", str(config)],
                    timeout=SLURM_RUN_TIMEOUT, cwd=REPO, env=clean_env(own_processes))
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



def wait_for_checkpoint(proc: subprocess.Popen, path: Path, at_least: int, timeout: float) -> int:
    """The round of the checkpoint at ``path`` once it is ``at_least`` (written atomically: never half-read)."""
    import torch

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (rnd := torch.load(path, weights_only=False)["round"]) >= at_least:
            return rnd
        if proc.poll() is not None:
            out = proc.stdout.read()[-4000:]
            pytest.fail(f"snakemake ended (exit {proc.returncode}) before round {at_least}:\n{out}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no checkpoint of round >= {at_least} at {path} after {timeout} s:\n{proc.communicate()[0][-4000:]}")


def train_jobs_in_queue() -> list[str]:
    """Ids of the queued or running train jobs (the plugin comments each job with rule_<rule>_wildcards_...)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True, timeout=30,
                         env=clean_env()).stdout
    rows = [line.split() for line in out.splitlines()]
    return [row[0] for row in rows if len(row) > 1 and row[1].startswith("rule_train")]


def in_slurm_job(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs in a SLURM job (a slurmstepd is one of its ancestors)."""
    try:
        return any(parent.name() == "slurmstepd" for parent in proc.parents())
    except psutil.Error:  # ended meanwhile
        return False


def cancel_mid_run(command: list[str], checkpoint: Path, at_least: int, mark: str) -> tuple[int | None, str, str, int]:
    """Run ``command`` (snakemake through SLURM, its processes carrying ``mark``); once ``checkpoint`` holds
    round ``at_least`` or later, scancel the train job. Returns snakemake's exit code and output, the cancelled
    job's id and the round seen."""
    proc = start(command, cwd=REPO, env=clean_env(mark))
    try:
        seen = wait_for_checkpoint(proc, checkpoint, at_least=at_least, timeout=180)
        # sbatch and srun pass the marker on to the job's processes: own_processes' teardown can find them
        assert any(in_slurm_job(p) for p in marked(mark)), described(marked(mark))
        jobs = train_jobs_in_queue()
        assert len(jobs) == 1, jobs
        subprocess.run(["scancel", jobs[0]], check=True, timeout=30, env=clean_env())
    finally:
        code, out = finish(proc, timeout=SLURM_RUN_TIMEOUT)
    return code, out, jobs[0], seen


def stopped_round(job_log: str) -> int:
    """The round after which the train script stopped on SIGTERM, from its message in the SLURM job's log."""
    found = re.search(rf"Preempted: stopped by a signal after round (\d+); checkpoint {PREEMPT_CKPT}$", job_log, re.M)
    assert found, job_log[-3000:]
    return int(found[1])


@pytest.mark.slurm
@pytest.mark.slow
def test_scancel_mid_run_checkpoints_fails_the_job_and_reruns_resume_to_the_uninterrupted_metrics(
        slurm_cluster, own_processes, tmp_path):
    """scancel of a running train job: SLURM sends SIGTERM to every process of the job's steps (the python of
    the train script included, under snakemake's srun step), SIGKILL KillWait (5 s) later. The script
    checkpoints the round it is in and exits non-zero, and snakemake reports the job failed: without
    --retries it stops (exit 1); rerun with --retries (profiles/slurm has retries: 2), it resumes from that
    checkpoint, is cancelled once more and resubmitted by snakemake, and ends with exactly the metrics of an
    uninterrupted local run."""
    import torch

    config = tmp_path / "preempt.yaml"
    config.write_text(PREEMPT)
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    target = f"{PREEMPT_RUN}/seeds.json"
    ckpt = on_slurm / PREEMPT_CKPT
    train_log = on_slurm / "results/pre/logs/train/niid/fedavg.log"
    slurm_logs = on_slurm / ".snakemake/slurm_logs/rule_train/pre_niid_fedavg"
    # the train job's inputs are made here (the test above sends the prep group job through SLURM), so the
    # SLURM runs are the train job alone
    code, out = run([*SNAKEMAKE, "results/pre/partitions/niid/seed0.npz", "--cores", "2", "--directory",
                     str(on_slurm), "--configfile", str(config)], timeout=120, cwd=REPO,
                    env=clean_env(own_processes))
    assert code == 0, out[-3000:]
    local_proc = start([*SNAKEMAKE, target, "--cores", "1", "--directory", str(local), "--configfile", str(config)],
                       cwd=REPO, env=clean_env(own_processes))
    command = [*SNAKEMAKE, target, "--executor", "slurm", "--profile", "profiles/slurm-test", "--workflow-profile",
               "none", "--directory", str(on_slurm), "--configfile", str(config)]
    try:
        # 1. no retries: the cancelled job fails the run, and its checkpoint holds the round it stopped at
        code, out, first, seen = cancel_mid_run(command, ckpt, at_least=4, mark=own_processes)
        assert code == 1, out[-4000:]
        assert f"SLURM-job '{first}' failed, SLURM status is: 'CANCELLED'" in out, out[-4000:]
        assert scontrol_job(first).get("JobState") == "CANCELLED"
        job_log = (slurm_logs / f"{first}.log").read_text()
        assert "train.py' returned non-zero exit status 1." in job_log, job_log[-3000:]  # the script's own exit
        stopped = stopped_round(job_log)
        saved = torch.load(ckpt, weights_only=False)
        # saved at the round it stopped at (checkpoint_every is 4: not only at the interval)
        assert saved["round"] == stopped == len(saved["history"]) and seen <= stopped < 100
        assert f"resumed from {PREEMPT_CKPT}" not in train_log.read_text()
        assert not (on_slurm / PREEMPT_RUN / "seeds.json").exists()
        assert not (on_slurm / PREEMPT_RUN / "seed0/summary.json").exists()

        # 2. the same command with --retries: it resumes, is cancelled again, and snakemake submits it once more
        code, out, second, _ = cancel_mid_run([*command, "--retries", "1"], ckpt, at_least=stopped + 3,
                                             mark=own_processes)
        assert code == 0, out[-4000:]
        assert f"SLURM-job '{second}' failed, SLURM status is: 'CANCELLED'" in out, out[-4000:]
        assert "Trying to restart job 0." in out, out[-4000:]
        job_log = (slurm_logs / f"{second}.log").read_text()
        assert f"resumed from {PREEMPT_CKPT} after round {stopped}\n" in job_log, job_log[-3000:]
        stopped_again = stopped_round(job_log)
        assert stopped_again > stopped
        third = sorted({p.stem for p in slurm_logs.glob("*.log")} - {first, second}, key=int)
        assert len(third) == 1 and scontrol_job(third[0]).get("JobState") == "COMPLETED", third
        # snakemake deletes a job's log before it runs the job again: the train log is the last attempt's
        log = train_log.read_text()
        assert f"resumed from {PREEMPT_CKPT} after round {stopped_again}\n" in log, log[-3000:]
        assert f"round {stopped_again}/100 " not in log  # no round trained twice
    finally:
        local_code, local_out = finish(local_proc, timeout=300)
    assert local_code == 0, local_out[-3000:]

    # 3. and it ended with the numbers of the uninterrupted run
    rel = "seed0/metrics.csv"
    pd.testing.assert_frame_equal(without_seconds(on_slurm / PREEMPT_RUN / rel),
                                  without_seconds(local / PREEMPT_RUN / rel), check_exact=True, obj=rel)
    summary = json.loads((on_slurm / PREEMPT_RUN / "seed0/summary.json").read_text())
    reference = json.loads((local / PREEMPT_RUN / "seed0/summary.json").read_text())
    assert summary["status"] == "complete"
    for key in ("final_acc", "best_acc", "last_k_acc", "per_class_acc"):
        assert summary[key] == reference[key], key
