"""Snakemake from the tests, and its jobs counted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.common import REPO

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "-s", str(REPO / "Snakefile"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.M)}
