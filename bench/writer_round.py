"""The API store writer's round beside a busy thread, in process (no broker, no HTTP): each round
is one ``api.idempotency.write_batch`` on the requests file, as ``api.writer`` runs it under load,
with the completions of the round before (their answers and request records) and new
reservations. A second thread runs Python code the whole time (``--busy``), as the event loop does
under load: a statement's steps let the interpreter's lock go (``sqlite3`` does around each step),
and the writer waits to take it back. Prints each round's time (p50 / p99 / max, ms: from the
start of its transaction to its commit, SQLite's write lock held all of it) and the SQL
statements a round ran (each row of an ``executemany`` one).

    python -m bench.writer_round --rounds 300 --batch 32 [--busy] [--switch-ms 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from api.database import StoreAccess
from api.idempotency import Completion, Reserve, Terms, write_batch
from api.store import RequestRecord
from api.tables import prepare
from bench.api_load import percentile


def _record(key: str, nid: str, i: int) -> RequestRecord:
    return RequestRecord(nid, key, f"u{i}", "order_shipped", ("email",), "normal", "bench", i, i, 0, i)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32, help="reservations, and completions, per round")
    parser.add_argument("--busy", action="store_true", help="a second thread runs Python code throughout")
    parser.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval, ms (5: CPython's)")
    args = parser.parse_args()
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1000)

    work = Path(tempfile.mkdtemp(prefix="writer-round-"))
    access = StoreAccess(str(work / "status.db"))
    first = access.open()
    prepare(first)
    first.close()
    db = access.open_requests()
    statements = [0]
    total = 0
    db._connection().set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))

    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    if args.busy:
        threading.Thread(target=spin, daemon=True).start()
    terms = Terms(int(time.time() * 1000), 86_400_000, 35_000)
    pending: list[Completion] = []
    times: list[float] = []
    i = 0
    for _ in range(args.rounds):
        reserve = []
        for _ in range(args.batch):
            key, nid = f"k-{uuid.uuid4().hex}", uuid.uuid4().hex
            reserve.append(Reserve(key, f"fp{i}", nid, f"u{i}"))
            i += 1
        before = statements[0]
        started = time.perf_counter()
        write_batch(db, pending, (), reserve, terms)
        times.append(time.perf_counter() - started)
        total += statements[0] - before
        pending = [(r.key, {"id": r.notification_id, "status": "accepted"}, _record(r.key, r.notification_id, n))
                   for n, r in enumerate(reserve)]
    stop.set()
    times.sort()
    ms = [t * 1000 for t in times]
    print(json.dumps({
        "rounds": args.rounds, "batch": args.batch, "busy": args.busy,
        "switch_ms": sys.getswitchinterval() * 1000,
        "round_ms": {"p50": round(percentile(ms, 0.5), 2), "p99": round(percentile(ms, 0.99), 2),
                     "max": round(ms[-1], 2)},
        "statements_per_round": round(total / args.rounds, 1),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
