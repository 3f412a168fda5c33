"""The store thread's CPU per message, in process (no broker, no provider): what a sender worker's
store thread does for each batch of a campaign, timed with ``time.thread_time``: read the
batch's profiles and claim it (``DeliveryHandler.claim_batch``: decrypt, rule, render, one
claim transaction), record its outcomes as sent (``finish_batch``: one transaction, the status
records encoded) and mark them published (``StatusStore.mark_published``). Every user is new
(no profile cache hit), as in ``bench.senders_probe``. Prints microseconds per message for each
step, and the SQL statements each executed per message (SQLite: every statement the library ran,
each row of an ``executemany`` counted).

    python -m bench.store_cost --messages 6000 --batch 200 [--vary] [--campaign sms|push|email] [--postgres]
        [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.senders_load import profile_line
from harness.ports import free_port
from operators import codec
from operators.records import Channel
from senders import records
from senders.policy.transitions import AttemptResult
from senders.profiles.crypto import generate_key
from senders.profiles.model import parse_profile
from senders.runtime.handler import DeliveryHandler, HandlerTopics, SendJob
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_dispatchers, open_profile_store, open_status_store, rules_context
from senders.statuses import AttemptOutcome, Lane
from senders.store.profiles import ProfileCache
from settings import Settings


def _message(i: int, campaign: str | None) -> bytes:
    """An order update by email, or a campaign's message on the ``campaign`` channel as
    ``bench.senders`` sends it."""
    channel = campaign or "email"
    return codec.encode(
        "channel_message",
        {
            "message_key": f"p{i}:{channel}:1",
            "channel": channel,
            "notification_id": f"n{i}",
            "user_id": f"u{i}",
            "template_id": "eid_sale" if campaign else "order_shipped",
            "params": {"pct": "20", "campaign": "c"} if campaign else {"order": str(i)},
            "channels": [channel],
            "priority": "normal",
            "category": "marketing" if campaign else "transactional",
            "event_time": int(time.time() * 1000),
            "dedup_key": f"p{i}",
            "dedup_ttl_sec": None,
        },
    )


def _profile(i: int, campaign: str | None) -> dict[str, Any]:
    """An order email's user, or a campaign's: every channel, as ``bench.senders`` imports them."""
    if not campaign:
        return {"contacts": {"email": [f"u{i}@example.com"]}}
    profile: dict[str, Any] = json.loads(profile_line(f"u{i}", i))
    del profile["user_id"]
    return profile


def _timed(totals: dict[str, float], name: str, fn: Callable[..., Any], *args: Any) -> Any:
    start = time.thread_time()
    out = fn(*args)
    totals[name] = totals.get(name, 0.0) + time.thread_time() - start
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument(
        "--vary", action="store_true", help="batches of 1 to --batch messages (seeded), as a worker's claims come"
    )
    parser.add_argument("--postgres", action="store_true", help="the status store on a local PostgreSQL")
    parser.add_argument("--profile", help="cProfile the timed steps into this file")
    parser.add_argument(
        "--campaign", choices=[c.value for c in Channel],
        help="a campaign's marketing messages on this channel (its daily limit counted), to users with every"
        " channel, as bench.senders sends them",
    )
    args = parser.parse_args()

    channel = Channel(args.campaign or "email")
    work = Path(tempfile.mkdtemp(prefix="store-cost-"))
    pg = None
    store_at = str(work / "status.sqlite3")
    if args.postgres:
        from harness.local_postgres import LocalPostgres

        pg = LocalPostgres(port=free_port()).start()
        store_at = pg.dsn
    try:
        senders = {
            "status_store": store_at,
            "sqlite_synchronous": "NORMAL",
            f"{channel.value}_primary": "http://127.0.0.1:9/v1/send",  # never called
            "contact_encryption_keys": generate_key(),
            "contact_lookup_keys": generate_key(),
        }
        cfg = Settings().with_overrides(senders=senders)
        n = args.messages
        profiles = open_profile_store(cfg)
        for i in range(0, n, 5000):
            profiles.put_many(
                (f"u{j}", parse_profile(_profile(j, args.campaign)))
                for j in range(i, min(n, i + 5000))
            )
        store = open_status_store(cfg)
        statements = [0]
        if store.db.dialect == "sqlite":
            store.db._connection().set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))
        metrics = Metrics()
        s = cfg.senders
        handler = DeliveryHandler(
            channel=channel,
            lane=Lane.NORMAL,
            store=store,
            dispatcher=build_dispatchers(cfg, [channel], metrics)[channel],
            profiles=ProfileCache(open_profile_store(cfg, store), s.profile_cache_ttl_ms),
            rules=rules_context(cfg),
            policy=s.retry_policy(),
            topics=HandlerTopics(status=s.status_topic, dlq=s.dlq_topic, delay=lambda t, step: f"{t}.{step}"),
            lease_ms=s.lease_ms,
            owner="bench",
            metrics=metrics,
        )
        deliveries = [
            records.from_channel_record(
                _message(i, args.campaign), key=f"u{i}".encode(), lane=Lane.NORMAL, source_topic=channel.value
            )
            for i in range(n)
        ]
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        profiler = cProfile.Profile() if args.profile else None

        def step(name: str, fn: Callable[..., Any], *args: Any) -> Any:
            before = statements[0]
            out = _timed(totals, name, fn, *args)
            counts[name] = counts.get(name, 0) + statements[0] - before
            return out

        if profiler is not None:
            profiler.enable()
        sent = AttemptResult(AttemptOutcome.SENT, provider="http", reference="ref")
        sizes = random.Random(7)
        i = 0
        while i < n:
            size = sizes.randint(1, args.batch) if args.vary else args.batch
            jobs = step("claim_batch", handler.claim_batch, deliveries[i : i + size])
            i += size
            assert all(isinstance(j, SendJob) and j.can_send for j in jobs), jobs[:1]
            done = step("finish_batch", handler.finish_batch, [(job, sent) for job in jobs])
            step("mark_published", store.mark_published, [p for h in done for p in h.published])
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        print(
            json.dumps(
                {
                    "messages": n,
                    "batch": f"1-{args.batch}" if args.vary else args.batch,
                    "store": store.db.dialect,
                    "cpu_us_per_message": {k: round(v / n * 1e6, 1) for k, v in totals.items()}
                    | {"total": round(sum(totals.values()) / n * 1e6, 1)},
                    "statements_per_message": {k: round(v / n, 3) for k, v in counts.items()}
                    if store.db.dialect == "sqlite"
                    else None,
                },
                indent=2,
            )
        )
    finally:
        if pg is not None:
            pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
