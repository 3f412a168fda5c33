"""A server the harness runs as a child process (Redis, Jaeger): launched with its output in a
log file, awaited until it answers, stopped with SIGTERM and then SIGKILL."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def launch(command: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` with its stdout and stderr appended to ``log``."""
    out = open(log, "ab")  # noqa: SIM115 - the server's for its life
    return subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_ready(proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout_s: float,
               interval_s: float = 0.1) -> bool:
    """Poll ``ready()`` until it is true (True), the process exits or ``timeout_s`` passes (False:
    ``proc.poll()`` tells which)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            return True
        time.sleep(interval_s)
    return False


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, and SIGKILL past ``timeout_s``; returns once the process is reaped."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
