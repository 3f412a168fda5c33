"""A sender worker's store transactions beside a busy thread, in process (no broker, no provider):
each round claims a batch of new messages, each with a limit counter (``claim_many``, as a
one-time code's claim does), then records their outcomes (``finish_many``), on a SQLite status
store. A second thread runs Python code the whole time (``--busy``), as a sender process's event
loop and its other workers do under load: ``sqlite3`` lets the interpreter's lock go around each
step of a statement (each row of an ``executemany``, each row a statement returns), and the
store thread waits to take it back, holding the file's write lock all the while. Prints each
transaction's time (p50 / p99 / max, ms: from its ``BEGIN IMMEDIATE`` to its ``COMMIT``, what
every other writer of the file waits) and the statements of each.

    python -m bench.claim_round --rounds 200 --batch 16 [--busy] [--switch-ms 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.in_process import add_interpreter_options, count_statements, interpreter, ms
from operators.records import Channel
from senders.policy.transitions import OutcomePlan
from senders.policy.verdict import RuleVerdict
from senders.rules.limits import LimitClaim
from senders.rules.reasons import Reason
from senders.statuses import DeliveryStatus, Lane
from senders.store.batches import ClaimRequest, FinishRequest, claim_many, finish_many
from senders.store.status import open_store

SENT = OutcomePlan(DeliveryStatus.SENT)


def _request(n: int, now_ms: int) -> ClaimRequest:
    limit = LimitClaim(f"otp:r{n}:0", f"m{n}", 5, Reason.RECIPIENT_LIMIT, now_ms + 3_600_000)

    def rules(counts: Any, first: bool) -> RuleVerdict:
        return RuleVerdict(consume=(limit,))

    return ClaimRequest(f"m{n}:sms", f"n{n}", Channel.SMS, Lane.PRIORITY, 1, f"u{n}", rules, (limit,))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="messages claimed, and finished, per round")
    add_interpreter_options(parser)
    args = parser.parse_args()
    store = open_store(str(Path(tempfile.mkdtemp(prefix="claim-round-")) / "status.sqlite3"), synchronous="FULL")
    statements = count_statements(store.db)
    held = {"claim": [], "finish": []}  # type: dict[str, list[float]]
    counted = {"claim": 0, "finish": 0}
    with interpreter(args):
        n = 0
        for _ in range(args.rounds):
            now = int(time.time() * 1000)
            requests = [_request(n + i, now) for i in range(args.batch)]
            n += args.batch
            finishes = [FinishRequest(r.message_key, 1, SENT, "p", None, now) for r in requests]
            for what in ("claim", "finish"):
                before = statements[0]
                started = time.perf_counter()
                if what == "claim":
                    done: list[Any] = claim_many(store.db, requests, now_ms=now, lease_ms=60_000, owner="w")
                else:
                    done = finish_many(store.db, finishes, owner="w")
                held[what].append(time.perf_counter() - started)
                counted[what] += statements[0] - before
                assert len(done) == args.batch
    print(json.dumps({
        "rounds": args.rounds, "batch": args.batch, "busy": args.busy, "switch_ms": sys.getswitchinterval() * 1000,
        **{f"{what}_ms": ms(times) for what, times in held.items()},
        **{f"{what}_statements": round(counted[what] / args.rounds, 1) for what in counted},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
