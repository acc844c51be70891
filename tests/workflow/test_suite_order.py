"""The suite's order (tests/conftest.py): files dealt to the workers longest first, by the seconds pytest measured."""

from __future__ import annotations

from support.durations import DURATIONS, measured_seconds, order_of, seconds_per_file

REPORT = """\
============================= slowest durations ==============================
12.50s call     tests/workflow/test_b.py::test_one[x-y]
3.25s setup    tests/workflow/test_b.py::test_one[x-y]
0.25s teardown tests/workflow/test_b.py::test_one[x-y]
4.00s call     tests/sim/test_a.py::test_two
0.01s call     tests/sim/test_a.py::test_three
(1962 durations < 0.005s hidden.  Use -vv to show these durations.)
927 passed, 6 skipped, 7 warnings in 635.34s (0:10:35)
"""


def test_seconds_per_file_sums_setup_call_and_teardown_and_lists_the_longest_first():
    per_file = seconds_per_file(REPORT.splitlines())
    assert per_file == {"tests/workflow/test_b.py": 16.0, "tests/sim/test_a.py": 4.0}
    assert list(per_file) == ["tests/workflow/test_b.py", "tests/sim/test_a.py"]


def test_the_longest_file_goes_first_and_each_file_keeps_its_tests_in_order():
    seconds = {"tests/b.py": 50.0, "tests/c.py": 5.0}
    collected = ["tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1", "tests/b.py::t2[p]", "tests/c.py::t1"]
    assert sorted(collected, key=lambda nodeid: order_of(nodeid, seconds)) == [
        "tests/b.py::t1", "tests/b.py::t2[p]", "tests/c.py::t1", "tests/a.py::t1", "tests/a.py::t2"]


def test_the_committed_durations_are_seconds_of_files_that_exist():
    seconds = measured_seconds()
    assert seconds and all(isinstance(s, int | float) and s >= 0 for s in seconds.values())
    missing = [path for path in seconds if not (DURATIONS.parents[1] / path).is_file()]
    assert not missing, f"tests/durations.json names files that are gone (`make test-durations`): {missing}"
