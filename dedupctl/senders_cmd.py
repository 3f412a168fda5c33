"""``dedupctl senders``: run the sender workers, create their topics, look up a message's status."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Mapping
from functools import partial
from types import FrameType
from typing import Any

from operators.errors import ConfigError
from operators.records import Channel
from ops import collector, gil
from ops.cpu_idle import run_cpu_idle
from ops.priority import yield_cpu
from ops.status_view import fmt_time
from senders.errors import InstanceInUseError
from senders.providers import OutboxProvider
from senders.runtime.dispatch import Dispatcher
from senders.runtime.host import record_cpu_idle
from senders.runtime.pool import build_pool, ensure_topics, open_profile_store, open_status_store
from senders.statuses import DeadLetterReason, DeliveryStatus, Lane
from senders.store.status import StatusRow
from settings import Settings

logger = logging.getLogger(__name__)


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _selection(args: argparse.Namespace) -> tuple[list[Channel], list[Lane]]:
    channels = [Channel(c) for c in dict.fromkeys(args.channel or [c.value for c in Channel])]
    lanes = [Lane(lane) for lane in dict.fromkeys(args.lane or [lane.value for lane in Lane])]
    return channels, lanes


def cmd_senders_run(cfg: Settings, args: argparse.Namespace) -> int:
    channels, lanes = _selection(args)
    if cfg.senders.nice:
        logger.info("sender workers: %s", yield_cpu(cfg.senders.nice))
    if not args.no_create_topics:
        created = ensure_topics(cfg, channels, lanes)
        logger.info(
            "sender topics: %d created, %d existed",
            sum(v == "created" for v in created.values()),
            sum(v == "exists" for v in created.values()),
        )
    pool = build_pool(cfg, channels=channels, lanes=lanes, workers_per_lane=args.workers)
    if cfg.senders.cpu_idle:  # every thread of the process moves, the clients' already started too
        logger.info("sender workers: %s", run_cpu_idle(observer=partial(record_cpu_idle, pool.metrics)))
    _log_providers(pool.dispatchers)
    stop = pool.stop_event
    server = None
    port = args.metrics_port if args.metrics_port is not None else (cfg.senders.metrics_port or None)
    if port is not None:
        from senders.runtime.metrics import serve_metrics

        server = serve_metrics(pool.metrics, port)
        logger.info("sender metrics on http://127.0.0.1:%d/metrics", server.server_address[1])

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping the workers after their current batch", signum)
        stop.set()

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    deadline = time.monotonic() + args.max_seconds if args.max_seconds else None
    interval = cfg.senders.metrics_log_interval_s
    next_log = time.monotonic() + interval if interval > 0 else None
    logger.info("running %d sender workers: %s", len(pool.workers), ", ".join(w.name for w in pool.workers))
    # start-up frozen out of the collector's sight while the workers run; a store thread gets the
    # interpreter back within senders.switch_interval_ms between the steps of its statements
    with collector.serving(), gil.switch_interval(cfg.senders.switch_interval_ms):
        try:
            try:
                pool.start()
            except InstanceInUseError as exc:
                logger.error("not starting: %s", exc)
                sys.stderr.write(f"dedupctl senders run: {exc}\n")
                return 2
            while not stop.wait(0.2):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if next_log is not None and now >= next_log:
                    next_log = now + interval
                    _log_metrics(pool.metrics.snapshot())
        finally:
            pool.stop()
            if server is not None:
                server.shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    _log_metrics(pool.metrics.snapshot())
    if pool.fatal is not None:
        sys.stderr.write(f"dedupctl senders run: {pool.fatal}\n")
        return 2
    if pool.errors:
        logger.info("%d worker failure(s) were ridden out (restarted)", len(pool.errors))
    return 0


def _log_providers(dispatchers: Mapping[Channel, Dispatcher]) -> None:
    """Once per channel: the protocol and name of its providers, as a warning where one is the
    outbox (nothing is delivered; a production configuration names a real provider)."""
    for channel, d in dispatchers.items():
        used = f"primary {d.primary.describe()}" + (f", secondary {d.secondary.describe()}" if d.secondary else "")
        outboxes = [(role, p) for role, p in (("primary", d.primary), ("secondary", d.secondary))
                    if isinstance(p, OutboxProvider)]
        if not outboxes:
            logger.info("%s: %s", channel, used)
            continue
        role, outbox = outboxes[0]
        logger.warning(
            "%s: %s: writes its messages to the outbox in %s, delivers none"
            " (senders.%s_%s is outbox; a production configuration names a real provider)",
            channel, used, outbox.root / channel.value, channel, role,
        )


def _log_metrics(snapshot: dict[str, float]) -> None:
    for name, value in snapshot.items():
        logger.info("metric %s %g", name, value)


def cmd_senders_topics(cfg: Settings, args: argparse.Namespace) -> int:
    channels, lanes = _selection(args)
    for name, state in ensure_topics(cfg, channels, lanes).items():
        _out(f"{name}: {state}")
    return 0


def status_fields(row: StatusRow) -> dict[str, Any]:
    """A status row as ``senders status --json`` and ``trace --json`` show it (no address)."""
    t = row.template
    return {
        "message_key": row.message_key,
        "notification_id": row.notification_id,
        "channel": row.channel.value,
        "lane": row.lane.value,
        "status": row.status.value,
        "reason": row.reason,
        "not_before": row.not_before_ms if row.status is DeliveryStatus.DEFERRED else None,
        "attempts": row.attempts,
        "provider": row.provider,
        "last_error": row.last_error,
        "retry_at": row.retry_at_ms if row.status is DeliveryStatus.QUEUED else None,
        "dead_letter": row.dead_letter.value if row.dead_letter else None,
        "template": t.name if t else None,
        "template_version": t.version if t else None,
        "locale": t.locale if t else None,
        "updated_at": row.updated_ms,
    }


def cmd_senders_status(cfg: Settings, args: argparse.Namespace) -> int:
    store = open_status_store(cfg)
    try:
        row = store.get(args.message_key)
    finally:
        store.close()
    if row is None:
        unknown = {"message_key": args.message_key, "status": None}
        _out(json.dumps(unknown) if args.json else f"{args.message_key}: unknown")
        return 3
    if args.json:
        _out(json.dumps(status_fields(row), indent=2, ensure_ascii=False))
        return 0
    retry = f", retry at {fmt_time(row.retry_at_ms)}" if row.retry_at_ms and row.status == "queued" else ""
    later = f" until {fmt_time(row.not_before_ms)}" if row.status == "deferred" and row.not_before_ms else ""
    reason = f": {row.reason}" if row.reason else ""
    error = f", last error: {row.last_error}" if row.last_error else ""
    t = row.template
    template = f", template {t.name} v{t.version} {t.locale}" if t and t.version is not None else ""
    _out(
        f"{row.message_key}: {row.status}{reason}{later} after {row.attempts} attempt(s) via {row.provider or '-'}"
        f" ({row.channel}/{row.lane}){template}{retry}{error}"
    )
    return 0


def cmd_senders_addresses_reactivate(cfg: Settings, args: argparse.Namespace) -> int:
    channel = Channel(args.channel)
    store = open_status_store(cfg)
    try:
        if args.user:
            profile = open_profile_store(cfg, store).get(args.user)
            addresses = [c.address for c in profile.contacts.of(channel)] if profile is not None else []
            if not addresses:
                _out(f"user {args.user} has no {channel} address in the profiles")
                return 3
        elif args.address:
            addresses = [args.address]
        else:
            raise ConfigError("give the address, or --user USER to take the user's addresses from the profiles")
        done = sum(store.reactivate(channel, address) for address in addresses) > 0
    finally:
        store.close()
    # never the address itself: this output may end up in a log
    _out(f"{channel} address reactivated" if done else f"{channel} address was not inactive")
    return 0 if done else 3


def cmd_senders_redrive(cfg: Settings, args: argparse.Namespace) -> int:
    from senders.runtime.redrive import RedriveFilter, redrive

    which = RedriveFilter(
        channels=set(args.channel or ()), reasons=set(args.reason or ()), message_keys=set(args.message_key or ())
    )
    store = open_status_store(cfg)
    try:
        report = redrive(cfg, store, which, dry_run=args.dry_run)
    finally:
        store.close()
    _out(f"{'would redrive' if args.dry_run else 'redriven'}: {report.redriven}")
    _out(f"already redriven: {report.already}")
    _out(f"no longer failed (sent, or redriven through another dead letter): {report.not_failed}")
    _out(f"undecodable (never redriven): {report.undecodable}")
    _out(f"left out by the filters: {report.left_out}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``senders`` to the ``dedupctl`` parser."""
    p = subparsers.add_parser("senders", help="sender workers: deliver the channel topics")
    sub = p.add_subparsers(dest="senders_command", required=True)

    def selection(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--channel",
            action="append",
            choices=[c.value for c in Channel],
            help="a channel to serve (repeatable; default: all)",
        )
        q.add_argument(
            "--lane",
            action="append",
            choices=[lane.value for lane in Lane],
            help="a lane to serve (repeatable; default: both)",
        )

    q = sub.add_parser("run", help="run workers (one consumer group per channel and lane) in the foreground")
    selection(q)
    q.add_argument("--workers", type=int, default=1, help="workers per channel and lane in this process")
    q.add_argument("--max-seconds", type=float, help="stop after this long")
    q.add_argument("--metrics-port", type=int,
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (default: senders.metrics_port)")
    q.add_argument("--no-create-topics", action="store_true", help="do not create the senders' topics first")
    q.set_defaults(func=cmd_senders_run)

    q = sub.add_parser("topics", help="create the status, dead-letter and delay topics")
    selection(q)
    q.set_defaults(func=cmd_senders_topics)

    q = sub.add_parser("status", help="a message key's row in the status store")
    q.add_argument("message_key")
    q.add_argument("--json", action="store_true", help="the row as one JSON object")
    q.set_defaults(func=cmd_senders_status)

    q = sub.add_parser(
        "redrive",
        help="send the messages of the dead-letter topic again, each dead letter once (reactivate"
        " an address first if its letters say address_inactive)",
    )
    q.add_argument("--channel", action="append", choices=[c.value for c in Channel], help="repeatable")
    q.add_argument("--reason", action="append", choices=[r.value for r in DeadLetterReason], help="repeatable")
    q.add_argument("--message-key", action="append", help="repeatable")
    q.add_argument("--dry-run", action="store_true", help="count, change nothing")
    q.set_defaults(func=cmd_senders_redrive)

    q = sub.add_parser("addresses", help="deactivated addresses")
    addresses = q.add_subparsers(dest="addresses_command", required=True)
    r = addresses.add_parser(
        "reactivate", help="use an address again that an invalid-recipient answer deactivated (exit 3: it was not)"
    )
    r.add_argument("--channel", required=True, choices=[c.value for c in Channel])
    r.add_argument("address", nargs="?", help="the address (phone number, email, device token)")
    r.add_argument("--user", help="reactivate the user's addresses on the channel (from the profiles) instead")
    r.set_defaults(func=cmd_senders_addresses_reactivate)
