"""The API store writer's round beside a busy thread, in process (no broker, no HTTP): each round
is one ``api.idempotency.write_batch`` on the requests file, as ``api.writer`` runs it under load,
with the completions of the round before (their answers and request records) and new
reservations. A second thread runs Python code the whole time (``--busy``), as the event loop does
under load: a statement's steps let the interpreter's lock go (``sqlite3`` does around each step),
and the writer waits to take it back. Prints each round's time (p50 / p99 / max, ms: from the
start of its transaction to its commit, SQLite's write lock held all of it) and the SQL
statements a round ran (each row of an ``executemany`` one). ``--profiles``: then, as the writer
does, what the round's new users' profiles say (``ProfileStore.flags_many`` in one transaction,
then ``api.accept.Reach.of``: each user has an address on every channel), timed apart; and for
comparison the same from the senders' whole read (``read_many``: the addresses opened).

    python -m bench.writer_round --rounds 300 --batch 32 [--busy] [--switch-ms 5] [--profiles]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from api.accept import Reach
from api.database import StoreAccess
from api.idempotency import Completion, Reserve, Terms, write_batch
from api.store import RequestRecord
from api.tables import prepare
from bench.in_process import add_interpreter_options, count_statements, interpreter, ms
from bench.senders_load import profile_line
from senders.profiles.crypto import generate_key
from senders.profiles.model import parse_profile
from senders.runtime.pool import open_profile_store
from senders.store.profiles import ProfileRead
from settings import Settings


def _record(key: str, nid: str, i: int) -> RequestRecord:
    return RequestRecord(nid, key, f"u{i}", "order_shipped", ("email",), "normal", "bench", i, i, 0, i)


def _profile(i: int) -> dict[str, Any]:
    profile: dict[str, Any] = json.loads(profile_line(f"u{i}", i))
    del profile["user_id"]
    return profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32, help="reservations, and completions, per round")
    add_interpreter_options(parser)
    parser.add_argument("--profiles", action="store_true", help="then read the round's users' profiles")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="writer-round-"))
    access = StoreAccess(str(work / "status.db"))
    first = access.open()
    prepare(first)
    first.close()
    db = access.open_requests()
    users = args.rounds * args.batch
    profiles = None
    if args.profiles:
        cfg = Settings().with_overrides(senders={"status_store": access.location,
                                                 "contact_encryption_keys": generate_key(),
                                                 "contact_lookup_keys": generate_key()})
        profiles = open_profile_store(cfg)
        for start in range(0, users, 5000):
            profiles.put_many((f"u{i}", parse_profile(_profile(i))) for i in range(start, min(users, start + 5000)))
    statements = count_statements(db)
    total = 0
    terms = Terms(int(time.time() * 1000), 86_400_000, 35_000)
    pending: list[Completion] = []
    times: list[float] = []
    reads: list[float] = []
    whole_reads: list[float] = []
    i = 0
    with interpreter(args):
        for _ in range(args.rounds):
            reserve = []
            for _ in range(args.batch):
                key, nid = f"k-{uuid.uuid4().hex}", uuid.uuid4().hex
                reserve.append(Reserve(key, f"fp{i}", nid, f"u{i}"))  # a user new to each round
                i += 1
            before = statements[0]
            started = time.perf_counter()
            write_batch(db, pending, (), reserve, terms)
            times.append(time.perf_counter() - started)
            total += statements[0] - before
            if profiles is not None:
                users = [r.user_id for r in reserve]
                started = time.perf_counter()
                reaches = [Reach.of(read) for read in profiles.flags_many(users).values()]
                reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                whole = [Reach.of(read) for read in profiles.read_many(users).values() if isinstance(read, ProfileRead)]
                whole_reads.append(time.perf_counter() - started)
                assert len(reaches) == len(reserve) and whole == reaches, (len(reaches), len(whole))
            pending = [(r.key, {"id": r.notification_id, "status": "accepted"}, _record(r.key, r.notification_id, n))
                       for n, r in enumerate(reserve)]
    print(json.dumps({
        "rounds": args.rounds, "batch": args.batch, "busy": args.busy,
        "switch_ms": sys.getswitchinterval() * 1000,
        "round_ms": ms(times),
        "statements_per_round": round(total / args.rounds, 1),
    } | ({"profile_read_ms": ms(reads), "whole_profile_read_ms": ms(whole_reads)} if reads else {})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
