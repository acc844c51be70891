"""Bad input through real (tiny) snakemake runs: each failure names what is wrong, and nothing already
computed is lost. One successful run of tests/data/bad_input_study.yaml (a method that diverges beside one
that trains) is made once; every test works on a copy of it."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.common import REPO

from fedrepro.sim.checkpoint import save_checkpoint

pytestmark = pytest.mark.slow

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
STUDY = REPO / "tests" / "data" / "bad_input_study.yaml"
RUN_TIMEOUT = 240  # a tiny run takes ~10 s; never let a hung snakemake hang the suite


def snakemake(root: Path, *args: str) -> subprocess.CompletedProcess:
    """snakemake in ``root`` with its config.yaml (laptop profile: 2 cores, keep-going); output in .out."""
    # targets first: --configfile takes every word after it
    proc = subprocess.run([*SNAKEMAKE, *args, "--directory", str(root), "--configfile", str(root / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    proc.out = proc.stdout + proc.stderr
    return proc


def write_config(root: Path, **extra) -> None:
    (root / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(root / "study.yaml")}, **extra}))


def edit_study(root: Path, old: str, new: str) -> None:
    path = root / "study.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under results/ and resources/."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in ("results", "resources") for p in sorted((root / top).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    """A finished run of the bad-input study (every table and figure)."""
    root = tmp_path_factory.mktemp("bad_input") / "base"
    root.mkdir()
    shutil.copy(STUDY, root / "study.yaml")
    write_config(root)
    proc = snakemake(root)
    assert proc.returncode == 0, proc.out[-4000:]
    return root


@pytest.fixture
def run_dir(done, tmp_path) -> Path:
    """A copy of the finished run (mtimes and snakemake's metadata kept, so nothing is out of date)."""
    root = tmp_path / "run"
    shutil.copytree(done, root, symlinks=True)
    write_config(root)
    return root


def test_a_diverged_method_is_reported_with_its_round_and_the_rest_renders(done):
    res = done / "results" / "tiny"
    boom = [json.loads((res / f"runs/iid/boom/seed{s}/summary.json").read_text()) for s in (0, 1)]
    ok = [json.loads((res / f"runs/iid/ok/seed{s}/summary.json").read_text()) for s in (0, 1)]
    # lr 1e6: the first round's loss is already NaN, so training stops there, not at the last round
    assert [(s["status"], s["diverged_round"]) for s in boom] == [("diverged", 1), ("diverged", 1)]
    assert [(s["status"], s["diverged_round"]) for s in ok] == [("complete", None), ("complete", None)]
    metrics = pd.read_csv(res / "runs/iid/boom/seed0/metrics.csv")
    assert metrics["round"].tolist() == [1] and metrics["train_loss"].isna().all()
    assert pd.read_csv(res / "runs/iid/ok/seed0/metrics.csv")["round"].tolist() == [1, 2, 3]
    # why, in the log and the summary: the round's loss and the first quantity that went non-finite
    assert re.search(r"diverged at round 1: train loss nan; first non-finite quantity: client \d+'s training loss",
                     (res / "logs/train/iid/boom.log").read_text())
    assert [(s["divergence"]["round"], s["divergence"]["first_non_finite"][:7]) for s in boom] == [(1, "client ")] * 2
    assert all(s["divergence"] is None for s in ok)
    # the finished marker keeps the verdict: a rerun does not train the diverged run again; no checkpoint left
    marker = json.loads(next((res / "checkpoints/iid/boom").rglob("seed0.done.json")).read_text())
    assert (marker["status"], marker["diverged_round"]) == ("diverged", 1)
    assert not list((res / "checkpoints").rglob("*.pt"))

    summary = pd.read_csv(res / "summary.csv", keep_default_na=False)
    assert sorted(zip(summary["method"], summary["status"], strict=True)) == [
        ("boom", "diverged"), ("boom", "diverged"), ("ok", "complete"), ("ok", "complete")]
    because = dict(zip(summary["method"] + summary["seed"].astype(str), summary["diverged_because"], strict=True))
    assert because["ok0"] == "" and because["boom0"] == boom[0]["divergence"]["why"]
    # the scorecard keeps diverged runs apart from runs still moving, each with why
    scorecard = (done / "results" / "scorecard.md").read_text()
    assert re.search(r"Diverged: \*\*2 of \d+ \(\d+%\)\*\*", scorecard), scorecard
    diverged_rows = scorecard.split("Runs that diverged:")[1].split("\n\n")[1]
    assert f"| iid | boom | 0 | 1 | {boom[0]['divergence']['why']} |" in diverged_rows
    cells = pd.read_csv(res / "tables/t1.csv").set_index("method")
    assert cells.loc["boom", "status"] == "diverged" and cells.loc["boom", "n_diverged"] == 2
    assert pd.isna(cells.loc["boom", "ours_mean"])
    accs = pd.Series([s["final_acc"] for s in ok])
    assert cells.loc["ok", "status"] == "ok" and cells.loc["ok", "ours_mean"] == pytest.approx(accs.mean())
    md = (res / "tables/t1.md").read_text()
    assert "| FedAvg (lr 1e6) | diverged (round 1) |" in md
    assert f"| FedAvg | {accs.mean():.2f} ± {accs.std():.2f} |" in md
    assert "diverged (round 1)" in (res / "tables/t1.tex").read_text()
    for fig in ("curves.png", "curves.pdf"):
        assert (res / "figures" / fig).stat().st_size > 0


@pytest.mark.parametrize("old, new, message", [
    ("last_k: 2}", "last_k: 2, rouns: 5}", "defaults: unknown key 'rouns' (did you mean 'rounds'?)"),
    ("ok: {algorithm: fedavg, label: FedAvg}", "ok: {algorithm: fedavg, label: FedAvg, training: {lr: -0.1}}",
     "methods.ok.training.lr: -0.1 is less than or equal to the minimum of 0"),
    ("rows: [{method: ok}, {method: boom}]", "rows: [{method: ok}, {method: bom}]",
     "tables.t1: cell (bom, iid) names a run the grid does not produce"),
    ("ok: {algorithm: fedavg, label: FedAvg}", "ok: {algorithm: fedprox, label: FedAvg, hparams: {mu: lots}}",
     "methods.ok.hparams.mu: 'lots' is not a number"),
    ("last_k: 2}", "last_k: 2, straggler_steps: [5, 2]}", "defaults.straggler_steps: [5, 2]: [lo, hi] needs lo <= hi"),
    ("{kind: iid, clients: 3}", "{kind: iid, clients: 100000}",
     "settings.iid.partition.clients: 100000 clients share the 1347 training samples of digits: some would hold none"),
    ("  ok: {algorithm", "  fed/ok: {algorithm", "methods: 'fed/ok' is no usable name"),
    ("last_k: 2}", "last_k: 2, eval_every: 5}",
     "settings.iid / methods.boom: training.eval_every: 5 exceeds rounds (3): the run would be evaluated at its last "
     "round only"),
])
def test_b_an_invalid_edit_after_a_run_is_refused_naming_file_and_key_and_loses_nothing(run_dir, old, new, message):
    before = hashes(run_dir)
    edit_study(run_dir, old, new)
    proc = snakemake(run_dir)  # a real run, not a dry run: nothing may start, nothing may be deleted
    assert proc.returncode != 0
    assert f"invalid configuration: {run_dir / 'study.yaml'}: " in proc.out, proc.out[-3000:]
    assert message in proc.out, proc.out[-3000:]
    assert "Building DAG of jobs" not in proc.out
    assert hashes(run_dir) == before


def test_b_a_last_k_window_longer_than_a_reported_runs_evaluations_is_refused(run_dir):
    before = hashes(run_dir)
    edit_study(run_dir, "metric: final_acc", "metric: last_k_acc")
    edit_study(run_dir, "last_k: 2}", "last_k: 50}")  # 3 evaluations: the "last 50" would be all 3
    proc = snakemake(run_dir)
    assert proc.returncode != 0
    assert ("settings.iid / methods.ok: training.last_k: 50 exceeds the 3 evaluations of 3 rounds evaluated every 1, "
            "and tables.t1 reports its last_k_acc") in proc.out, proc.out[-3000:]
    assert "Building DAG of jobs" not in proc.out
    assert hashes(run_dir) == before


def test_c_a_checkpoint_of_another_configuration_is_refused_naming_it(run_dir):
    res = run_dir / "results" / "tiny"
    # left behind by an unfinished attempt under another configuration (no finished marker): a checkpoint of
    # boom's seed 0 in ok's place
    ok_markers = sorted((res / "checkpoints/iid/ok").rglob("seed0.done.json"))
    assert len(ok_markers) == 1
    ok_markers[0].unlink()
    boom = json.loads(next((res / "checkpoints/iid/boom").rglob("seed0.done.json")).read_text())
    ok_ckpts = [ok_markers[0].with_name("seed0.pt")]
    save_checkpoint(ok_ckpts[0], boom["fingerprint"], {"round": 1})
    untouched = {k: v for k, v in hashes(run_dir).items()
                 if "/ok/" not in k and not k.endswith(("/ok.log", "seeds.json"))}
    foreign = hashlib.sha256(ok_ckpts[0].read_bytes()).hexdigest()

    proc = snakemake(run_dir, "--forcerun", "results/tiny/runs/iid/ok/seeds.json")
    assert proc.returncode != 0
    rel = ok_ckpts[0].relative_to(run_dir)
    expected = f"checkpoint {rel} was written by another configuration"
    log = (res / "logs/train/iid/ok.log").read_text()
    assert expected in proc.out and expected in log, proc.out[-3000:]
    assert "refusing to resume from it. Delete it to start this run from scratch" in log
    assert "Error in rule train" in proc.out and "wildcards: study=tiny, setting=iid, method=ok" in proc.out
    # refused, not overwritten; every other file as it was (tables and figures included: nothing downstream ran)
    assert hashlib.sha256(ok_ckpts[0].read_bytes()).hexdigest() == foreign
    now = hashes(run_dir)
    assert {k: now.get(k) for k in untouched} == untouched
    # ok's finished seeds are still there (only the index, the job's declared output, went)
    for s in (0, 1):
        assert (res / f"runs/iid/ok/seed{s}/metrics.csv").stat().st_size > 0
    assert not (res / "runs/iid/ok/seeds.json").exists()


def test_c_a_cut_metrics_file_is_refused_and_the_printed_remedy_restores_the_results(run_dir):
    res = run_dir / "results" / "tiny"
    metrics = res / "runs/iid/ok/seed0/metrics.csv"
    whole = pd.read_csv(metrics)
    results = {k: v for k, v in hashes(run_dir).items() if "/tables/" in k}
    metrics.write_bytes(metrics.read_bytes()[: metrics.stat().st_size // 2])  # a copy cut short, a failing disk
    proc = snakemake(run_dir, "--forcerun", "aggregate")  # whatever aggregates again reads the cut file
    assert proc.returncode != 0
    assert f"run metrics {metrics.relative_to(run_dir)} do not match the sha256" in proc.out, proc.out[-3000:]
    printed = re.search(r"`snakemake (--forcerun \S+)`, with the --configfile and options of the run that failed",
                        proc.out)
    assert printed, proc.out[-3000:]
    # run as printed (this run's --configfile added, as the message says): seed 0 trains again, seed 1 is kept
    proc = snakemake(run_dir, *printed.group(1).split())
    assert proc.returncode == 0, proc.out[-3000:]
    again = pd.read_csv(metrics)
    timing = ["seconds"]  # wall-clock seconds differ between two trainings; every number they report does not
    pd.testing.assert_frame_equal(again.drop(columns=timing), whole.drop(columns=timing))
    assert {k: v for k, v in hashes(run_dir).items() if "/tables/" in k} == results
    assert (res / "runs.csv").is_file()
    assert "seed 1: finished (complete)" in (res / "logs/train/iid/ok.log").read_text()


def test_c_a_corrupt_partition_is_named(run_dir):
    res = run_dir / "results" / "tiny"
    part = res / "partitions/iid/seed1.npz"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])  # a failing disk, an interrupted copy
    others = {k: v for k, v in hashes(run_dir).items()
              if "seed1.npz" not in k and not k.endswith(("/ok.log", "seeds.json"))}
    proc = snakemake(run_dir, "results/tiny/runs/iid/ok/seeds.json")
    assert proc.returncode != 0
    assert {k: v for k, v in hashes(run_dir).items() if k in others} == others
    assert "results/tiny/partitions/iid/seed1.npz" in (res / "logs/train/iid/ok.log").read_text().splitlines()[-1]


class _NotFound(http.server.SimpleHTTPRequestHandler):
    """A mirror with nothing on it: every GET is a 404 (and is recorded)."""

    requested: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.requested.append(self.path)
        self.send_error(404, "File not found")

    def log_message(self, *args):
        pass


@pytest.fixture
def empty_mirror():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _NotFound.requested = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mnist/", _NotFound.requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_d_a_download_that_fails_names_the_url_and_other_studies_are_untouched(run_dir, empty_mirror):
    mirror, requested = empty_mirror
    net = yaml.safe_load(STUDY.read_text())
    net["settings"]["iid"]["dataset"] = "mnist"
    before = hashes(run_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "studies": {"tiny": str(run_dir / "study.yaml"), "net": net}, "mirrors": {"mnist": mirror}}))
    proc = snakemake(run_dir)
    assert proc.returncode != 0
    url = f"{mirror}train-images-idx3-ubyte.gz"
    expected = f"HTTP 404 File not found while downloading {url}"
    log = (run_dir / "resources/data/logs/download/mnist.log").read_text()
    assert expected in proc.out and expected in log, proc.out[-3000:]
    assert "mnist: no mirror served train-images-idx3-ubyte.gz" in log
    assert "Error in rule download_dataset" in proc.out and "wildcards: dataset=mnist" in proc.out
    assert requested == ["/mnist/train-images-idx3-ubyte.gz"]  # the mirror, and only it, was asked
    # nothing half-downloaded is left, nothing of net was made, and tiny is exactly as it was
    assert sorted(p.name for p in (run_dir / "resources/data/mnist").rglob("*") if p.is_file()) == []
    assert not (run_dir / "results/net").exists()
    after = hashes(run_dir)
    assert {k: after.get(k) for k in before} == before
    assert set(after) - set(before) == {"resources/data/logs/download/mnist.log"}


def test_d_a_download_step_that_succeeds_writes_its_declared_output(run_dir):
    # rule download_dataset declares raw/MANIFEST.json: a step that got every file must write it, or snakemake
    # fails a good download with MissingOutputException
    raw = run_dir / "resources/data/ham10000/raw"
    raw.mkdir(parents=True)
    names = ("HAM10000_images_part_1.zip", "HAM10000_images_part_2.zip", "HAM10000_metadata.csv")
    for name in names:
        (raw / name).write_text("placed by hand\n")  # HAM10000's download step re-hashes what is placed
    # stand-ins for Dataverse's files: the config's checksums replace the pinned md5 sums
    stand_in = hashlib.md5(b"placed by hand\n").hexdigest()
    write_config(run_dir, checksums={"ham10000": dict.fromkeys(names, stand_in)})
    proc = snakemake(run_dir, "--latency-wait", "1", "resources/data/ham10000/raw/MANIFEST.json")
    assert proc.returncode == 0, proc.out[-3000:]
    manifest = json.loads((raw / "MANIFEST.json").read_text())
    assert sorted(manifest["files"]) == ["HAM10000_images_part_1.zip", "HAM10000_images_part_2.zip",
                                         "HAM10000_metadata.csv"]
