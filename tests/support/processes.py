"""The processes a test started, wherever they ended up: each command it runs carries a marker in its
environment, which every descendant inherits, also the ones no parent-child walk reaches (a SLURM job's
steps are children of slurmstepd, not of the test; a process may start a session of its own). At teardown
the test kills what still carries its marker and checks that nothing does."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import psutil

MARK = "FEDREPRO_TEST_PROCESSES"


def new_mark() -> str:
    """A marker value no other test run uses."""
    return uuid.uuid4().hex


def marked_env(env: dict[str, str], mark: str) -> dict[str, str]:
    """``env`` with ``mark``: what a command gets so that it and its descendants can be found later."""
    return {**env, MARK: mark}


def marked(mark: str) -> list[psutil.Process]:
    """The live processes whose environment carries ``mark`` (this one excluded; zombies hold no memory and
    show no environment)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARK) == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone meanwhile, another user's, or a zombie
    return found


def wait_gone(mark: str, timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` seconds for every process carrying ``mark`` to end; the ones still alive. Polled
    rather than waited on: most are no children of ours, and a dead one whose parent is gone may stay a zombie
    (which marked() leaves out) for good."""
    deadline = time.monotonic() + timeout
    while (alive := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def kill_marked(mark: str, timeout: float = 10.0) -> list[psutil.Process]:
    """SIGTERM every process carrying ``mark``, SIGKILL what is left ``timeout`` seconds later; returns the
    processes still alive another ``timeout`` later (none, unless one cannot be killed)."""
    for signal_them in (psutil.Process.terminate, psutil.Process.kill):
        for proc in marked(mark):
            with contextlib.suppress(psutil.NoSuchProcess):  # ended meanwhile
                signal_them(proc)
        alive = wait_gone(mark, timeout)
    return alive


def described(procs: list[psutil.Process]) -> list[str]:
    """pid and command line of each of ``procs`` (for an assertion's message)."""
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:300]}")
    return out


def names(procs: list[psutil.Process]) -> list[str]:
    """The executable name of each of ``procs``, "gone" for one that ended meanwhile."""
    out = []
    for proc in procs:
        try:
            out.append(proc.name())
        except psutil.Error:
            out.append("gone")
    return out
