"""``dedupctl slo``: each SLO with its current value and error budget left, from the running
services' ``/metrics`` (ops/slo.py computes; this reads)."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from ops.slo import API, SENDERS, Sample, costs, deltas, evaluate, parse_samples, render
from settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("slo", help="each SLO's current value and error budget left, from the services' /metrics")
    p.add_argument("--api", metavar="URL",
                   help="the API's metrics (default: http://<api.host>:<api.port>/metrics)")
    p.add_argument("--senders", metavar="URL", action="append",
                   help="a senders process's metrics, summed over all given (default: "
                        "http://127.0.0.1:<senders.metrics_port>/metrics)")
    p.add_argument("--interval", type=float, default=0.0, metavar="SECONDS",
                   help="read twice, this far apart, and give the SLOs over that span (default: since the "
                        "services started)")
    p.add_argument("--timeout", type=float, default=5.0, help="how long to wait for each service")
    p.set_defaults(func=cmd_slo)


def _targets(cfg: Settings, args: argparse.Namespace) -> dict[str, list[str]]:
    api = args.api or f"{cfg.api.local_url()}/metrics"
    senders = args.senders or ([f"http://127.0.0.1:{cfg.senders.metrics_port}/metrics"]
                               if cfg.senders.metrics_port else [])
    return {API: [api], SENDERS: senders}


def _read(urls: Sequence[str], timeout: float) -> list[Sample]:
    samples: list[Sample] = []
    for url in urls:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - an operator's URL
            samples += parse_samples(reply.read().decode("utf-8", "replace"))
    return samples


def _scrape(targets: dict[str, list[str]], timeout: float, unreachable: dict[str, str]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for service, urls in targets.items():
        if service in unreachable:
            continue
        if not urls:
            unreachable[service] = "has no metrics address (set senders.metrics_port, or give --senders URL)"
            continue
        try:
            out[service] = _read(urls, timeout)
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            unreachable[service] = f"did not answer at {', '.join(urls)} ({reason})"
        except ValueError as exc:
            unreachable[service] = f"answered at {', '.join(urls)} with metrics that do not parse ({exc})"
    return out


def cmd_slo(cfg: Settings, args: argparse.Namespace) -> int:
    targets = _targets(cfg, args)
    unreachable: dict[str, str] = {}
    samples = _scrape(targets, args.timeout, unreachable)
    over = "the services' lifetime (their counters since each started)"
    if args.interval > 0:
        time.sleep(args.interval)
        later = _scrape(targets, args.timeout, unreachable)
        samples = {s: deltas(samples[s], later[s]) for s in later if s in samples}
        over = f"the last {args.interval:g} s"
    results = evaluate(samples)
    sys.stdout.write(render(results, unreachable, costs(samples.get(SENDERS, [])), over=over))
    return 0 if not unreachable and all(r.met is not False for r in results) else 1
