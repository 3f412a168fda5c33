"""What the in-process store benchmarks share (``bench.writer_round``, ``bench.claim_round``): the
options of a thread running Python code beside the store's writer and of the switch interval,
that thread, a count of the SQL statements a connection runs, and a summary of times."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from bench.api_load import percentile
from senders.store.db import Database


def add_interpreter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--busy", action="store_true", help="a second thread runs Python code throughout")
    parser.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval, ms (5: CPython's)")


@contextmanager
def interpreter(args: argparse.Namespace) -> Iterator[None]:
    """The options' switch interval, and with ``--busy`` a thread running Python code the whole
    time, as an event loop does under load."""
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1000)
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    if args.busy:
        threading.Thread(target=spin, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def count_statements(db: Database) -> list[int]:
    """A counter, ``[n]``, of the statements ``db``'s connection runs from now on (SQLite; each
    row of an ``executemany`` one)."""
    statements = [0]
    db._connection().set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))
    return statements


def ms(seconds: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``seconds``, in ms."""
    out = sorted(t * 1000 for t in seconds)
    return {"p50": round(percentile(out, 0.5), 2), "p99": round(percentile(out, 0.99), 2), "max": round(out[-1], 2)}
