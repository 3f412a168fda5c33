"""``dedupctl status`` and ``dedupctl trace``: the command lines of ops.status and ops.trace."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ops.flink_rest import RestClient
from ops.status import StatusReport, collect, watch
from ops.status_probe import Probe
from ops.trace import parse_since, trace
from settings import Settings


def add_status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="the job at a glance: watermarks, checkpoints, state, rates (REST API)")
    p.add_argument("--rest", help="REST address (default: http://127.0.0.1:<flink.rest_port>)")
    p.add_argument("--job", help="job id (default: the only running job)")
    p.add_argument("--json", action="store_true", help="one JSON object (a line per refresh with --watch)")
    p.add_argument("--watch", nargs="?", const=5.0, type=float, metavar="SECONDS",
                   help="refresh every SECONDS (default 5) until interrupted")
    p.add_argument("--count", type=int, help="with --watch: stop after this many refreshes")
    p.add_argument("--sample", type=float, default=15.0, metavar="SECONDS",
                   help="longest wait for a second reading of the counters, for rates (0: no rates)")
    p.set_defaults(func=cmd_status)


def cmd_status(cfg: Settings, args: argparse.Namespace) -> int:
    from ops.status_view import render

    probe = Probe(RestClient(args.rest or f"http://127.0.0.1:{cfg.flink.rest_port}"), args.job)
    clear = sys.stdout.isatty() and not args.json

    def emit(report: StatusReport) -> None:
        if args.json:
            text = json.dumps(report.to_dict(), indent=None if args.watch is not None else 2)
        else:
            text = ("\x1b[H\x1b[2J" if clear else "") + render(report)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    if args.watch is not None:
        watch(probe, cfg, max(0.5, args.watch), args.count, emit)
    else:
        emit(collect(probe, cfg, args.sample))
    return 0



def add_trace_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="what became of a notification: accepted, duplicate, late or invalid")
    p.add_argument("id", metavar="NOTIFICATION_ID_OR_DEDUP_KEY")
    p.add_argument("--since", help="read only records from then on: 30m, 2h, 7d, epoch ms or ISO-8601")
    p.add_argument("--timeout", type=float, default=60.0, help="longest time to spend reading each pass")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(func=cmd_trace)


def cmd_trace(cfg: Settings, args: argparse.Namespace) -> int:
    from ops.trace_view import render

    since = parse_since(args.since) if args.since else None
    result = trace(cfg, args.id, since_ms=since, timeout_s=args.timeout)
    text = json.dumps(result.to_dict(), indent=2) if args.json else render(result)
    sys.stdout.write(text + "\n")
    return 0 if result.found else 1
