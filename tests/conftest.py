"""Shared fixtures: small real data (scikit-learn's digits) and tiny runs of the engine."""

from __future__ import annotations

import os

# Tiny models on 2 cores: one thread per process is fastest and keeps parallel test runs from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from support.common import REPO


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first (tests/durations.json; a file not in it counts 0 s). `make test` hands whole files
    to its workers in collection order (--dist loadfile --no-loadscope-reorder), so a long file dealt last would
    leave the other cores idle until it ends: longest first, the workers finish together. The sort is stable, so a
    file's tests keep their order; only the order depends on the file, never a verdict."""
    from support.durations import measured_seconds, order_of

    seconds = measured_seconds()
    items.sort(key=lambda item: order_of(item.nodeid, seconds))


def pytest_report_header(config) -> str:
    """Which of torch's CPU kernels the suite runs (Makefile, KERNELS): the second pass CI makes runs another set."""
    import torch

    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or "native"
    return f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}; oneDNN max ISA: {isa}"


@pytest.fixture(scope="session")
def digits_prepared(tmp_path_factory):
    """The embedded digits data set, prepared once per test session."""
    from fedrepro.data.format import load_prepared
    from fedrepro.data.registry import prepare_dataset

    path = tmp_path_factory.mktemp("data") / "digits.npz"
    prepare_dataset("digits", path)
    return load_prepared(path)


@pytest.fixture(scope="session")
def small_data(digits_prepared):
    """Digits as CPU tensors, cut to 400 train / 200 test samples to keep engine tests fast."""
    import torch

    from fedrepro.sim.tensors import to_device_data

    data = to_device_data(digits_prepared, torch.device("cpu"))
    data.x_train, data.y_train = data.x_train[:400], data.y_train[:400]
    data.x_test, data.y_test = data.x_test[:200], data.y_test[:200]
    return data


@pytest.fixture(scope="session")
def small_data64(small_data):
    """small_data in float64: for tests that compare two mathematically equal computations over many steps, where
    float32's rounding (which differs between CPUs' kernel sets) must not decide the verdict. A run on it builds
    its model in float64 (sync_run follows the data's dtype)."""
    import dataclasses

    return dataclasses.replace(small_data, x_train=small_data.x_train.double(), x_test=small_data.x_test.double())


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """The tiny study (tests/data/tiny_study.yaml) run end to end by snakemake once per test session, with
    a README (showcase markers) in the working directory: (working directory, config file, the process)."""
    import subprocess
    import sys

    workdir = tmp_path_factory.mktemp("tiny_pipeline")
    config = workdir / "tiny.yaml"
    config.write_text("showcase: {study: feddisco, figure: curves}\n"
                      "studies:\n  feddisco: tests/data/tiny_study.yaml\n")
    (workdir / "README.md").write_text("# tiny\n\n<!-- showcase:begin -->\nto fill\n<!-- showcase:end -->\n\nend\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
                           "--directory", str(workdir), "--configfile", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    return workdir, config, proc


