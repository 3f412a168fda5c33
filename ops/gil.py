"""How soon a thread that wants Python's interpreter lock gets it from one that runs Python code.

A thread that leaves the interpreter (for a system call, or for SQLite: ``sqlite3`` lets the lock
go around each step of a statement) must take the lock back afterwards; while another thread runs
Python code, it waits for that thread to drop the lock at its next blocking call or, at the
latest, after the switch interval (CPython's default 5 ms). The API's store writer holds SQLite's
write lock of the requests file through a transaction of several statements, each a few steps:
beside a busy event loop every step could wait up to 5 ms, and the other process's writer waited
for the file all that time.

Measured on this machine (``python -m bench.writer_round --rounds 200 --batch 32 [--busy]
--switch-ms 5|1``; bench/results/writer-round-2026-12-07-s46.md): a writer's round of six
statements beside a thread running Python code took p50 43 ms at 5 ms, 13 ms at 1 ms (1.4-1.5 ms
alone either way).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def switch_interval(ms: float) -> Iterator[None]:
    """While the service runs: a thread that runs Python code gives the lock up to one that wants
    it after at most ``ms``; the interpreter's own interval again on the way out (a test process
    runs many services in turn)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(ms / 1000)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
