"""Seconds per test file, from pytest's ``--durations=0`` report on standard input, written as JSON to
tests/durations.json, by which tests/conftest.py deals the longest files to the workers first (`make
test-durations` regenerates it). Only the suite's order depends on it, never a verdict."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"

# "12.34s call     tests/workflow/test_x.py::test_y[param]"
DURATION_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(tests/\S+?\.py)::")


def measured_seconds() -> dict[str, float]:
    """tests/durations.json as committed (no file: every file counts 0 s)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def order_of(nodeid: str, seconds: dict[str, float]) -> float:
    """The sort key of a test in the suite: its file's seconds, negated (longest first; a file not measured: 0)."""
    return -seconds.get(nodeid.split("::")[0], 0.0)


def seconds_per_file(report: Iterable[str]) -> dict[str, float]:
    """Setup, call and teardown seconds summed per test file, longest first, rounded to 0.1 s."""
    total: dict[str, float] = defaultdict(float)
    for line in report:
        if found := DURATION_LINE.match(line):
            total[found[2]] += float(found[1])
    return {path: round(seconds, 1) for path, seconds in sorted(total.items(), key=lambda kv: -kv[1])}


def main() -> None:
    report = sys.stdin.read()
    sys.stdout.write(report)  # the run's own output stays visible
    per_file = seconds_per_file(report.splitlines())
    if not per_file:
        raise SystemExit("no durations in pytest's output: run it with --durations=0")
    DURATIONS.write_text(json.dumps(per_file, indent=1) + "\n")
    print(f"{DURATIONS}: {len(per_file)} files, {sum(per_file.values()):.0f} s of tests")


if __name__ == "__main__":
    main()
