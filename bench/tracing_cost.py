"""The traces' cost per notification: ``python -m bench.tracing_cost [--requests N]``.

Times, in CPU time of the whole process (the exporter's thread included), what one notification
costs the API, the job's decision and the senders with tracing on, exporting over OTLP/HTTP to a real local Jaeger
(harness/local_jaeger.py, started here), against the same calls with tracing off
(``operators.tracing.OFF``): the API's server span continuing the caller's traceparent, with its
attributes and the traceparent written into the record; the job's decision span (what
``jobs.dedup_function.DedupShard`` records per traced request of a batch); the sender's attempt span and its
provider call span (the calls ``api/notifications.py`` and ``senders/runtime/dispatch.py`` make).
Each mode runs in a fresh interpreter; the best of three runs. CPU time rather than the wall clock,
so that a busy machine inflates it less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from operators.tracing import (
    ATTEMPT,
    CHANNEL,
    DECISION,
    DECISION_SPAN,
    LANE,
    MESSAGE_KEY,
    NOTIFICATION_ID,
    OUTCOME,
    PROVIDER,
    Tracing,
    start_tracing,
)
from operators.tracing import CALLER as CALLER_KEY


def caller_traceparents(n: int) -> list[str]:
    """A caller's span per request: each notification is a trace of its own."""
    return [f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01" for _ in range(n)]


def api_request(tracing: Tracing, caller: str | None) -> str | None:
    """What ``api.notifications.notify`` adds to one accepted request."""
    if not tracing.on:
        return None
    with tracing.span("POST /v1/notifications", parent=caller, kind="server",
                      attributes={CALLER_KEY: "shop", "http.route": "/v1/notifications"}) as span:
        assert span is not None
        traceparent = tracing.traceparent()
        span.set_attribute("http.response.status_code", 202)
        span.set_attribute(NOTIFICATION_ID, "n_0123456789abcdef0123456789abcdef")
        return traceparent


def job_decision(tracing: Tracing, traceparent: str | None) -> str | None:
    """What ``jobs.dedup_function.DedupShard`` adds to one traced request's decision."""
    if traceparent is None or not tracing.on:
        return traceparent
    return tracing.record(DECISION_SPAN, parent=traceparent, start_ns=time.time_ns(),
                          attributes={NOTIFICATION_ID: "n_0123", DECISION: "accepted"})


def sender_attempt(tracing: Tracing, traceparent: str | None) -> None:
    """What ``senders.runtime.dispatch.Dispatcher`` adds to one attempt and its provider call."""
    if not tracing.follows(traceparent):  # off, untraced, or a trace not kept (as dispatch.py checks)
        return
    key = "shop/evt-1:sms:1796115600000"
    with tracing.span("send sms", parent=traceparent, attributes={
            MESSAGE_KEY: key, NOTIFICATION_ID: "n_0123", CHANNEL: "sms", LANE: "normal", ATTEMPT: 1}) as span:
        assert span is not None
        with tracing.child("gateway call", kind="client",
                           attributes={MESSAGE_KEY: key, PROVIDER: "gateway", CHANNEL: "sms"}) as call:
            assert call is not None
            call.set_attribute(OUTCOME, "sent")
        span.set_attribute(OUTCOME, "sent")
        span.set_attribute(PROVIDER, "gateway")


def measure(requests: int, endpoint: str | None, sample_ratio: float = 1.0) -> dict[str, float]:
    """CPU microseconds per notification (API, job, senders), the best of three runs of ``requests``.
    ``sample_ratio`` below 1: the requests come without a caller's traceparent, so the API's root
    keeps that share of them and the job and the senders follow its decision."""
    api = start_tracing(endpoint, "bench-api", sample_ratio=sample_ratio)
    job = start_tracing(endpoint, "bench-job", sample_ratio=sample_ratio)
    senders = start_tracing(endpoint, "bench-senders", sample_ratio=sample_ratio)
    best = {"api_us": float("inf"), "job_us": float("inf"), "senders_us": float("inf")}
    for _ in range(3):
        callers: list[str | None] = (list(caller_traceparents(requests)) if sample_ratio >= 1.0
                                     else [None] * requests)
        parents = []
        t0 = time.process_time()
        for caller in callers:
            parents.append(api_request(api, caller))
        t1 = time.process_time()
        decided = [job_decision(job, tp) for tp in parents]
        tj = time.process_time()
        for tp in decided:
            sender_attempt(senders, tp if endpoint else None)
        t2 = time.process_time()
        best["api_us"] = min(best["api_us"], (t1 - t0) / requests * 1e6)
        best["job_us"] = min(best["job_us"], (tj - t1) / requests * 1e6)
        best["senders_us"] = min(best["senders_us"], (t2 - tj) / requests * 1e6)
    # what the exporter threads still have to send is sent (and counted) before the process ends
    t = time.process_time()
    api.shutdown()
    job.shutdown()
    senders.shutdown()
    best["flush_us"] = (time.process_time() - t) / (3 * requests) * 1e6
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost")
    parser.add_argument("--requests", type=int, default=1_000, help="per run (three runs); at most the"
                        " exporter's queue (2048 spans) is made faster than it sends")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--sample-ratio", type=float, default=0.01,
                        help="the third mode's [telemetry] sample_ratio (default 0.01)")
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner is not None:
        print(json.dumps(measure(args.requests, args.inner or None, args.sample_ratio)))
        return 0
    from harness.local_jaeger import LocalJaeger

    results: dict[str, object] = {"requests": args.requests, "command": "python -m bench.tracing_cost "
                                  f"--requests {args.requests}"}
    with tempfile.TemporaryDirectory() as home, LocalJaeger(Path(home)) as jaeger:
        modes = (("off", "", 1.0), ("on", jaeger.otlp_endpoint, 1.0),
                 (f"on, {args.sample_ratio:g} sampled", jaeger.otlp_endpoint, args.sample_ratio))
        for mode, endpoint, ratio in modes:
            out = subprocess.run([sys.executable, "-m", "bench.tracing_cost", "--inner", endpoint,
                                  "--requests", str(args.requests), "--sample-ratio", str(ratio)],
                                 check=True, capture_output=True, text=True)
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode] = figures
            print(f"tracing {mode}: API {figures['api_us']:.2f} us CPU per request, job {figures['job_us']:.2f} us"
                  f" per decision, senders "
                  f"{figures['senders_us']:.2f} us per attempt (+ {figures['flush_us']:.2f} us flushed at exit); "
                  f"load average {os.getloadavg()[0]:.1f}")
        # what reached Jaeger (a span the exporter's queue had no room for is dropped, not sent)
        results["exported_traces_with_senders_spans"] = len(jaeger.traces("bench-senders", limit=100_000))
        results["traces_made"] = {"on": 3 * args.requests, "sampled_ratio": args.sample_ratio,
                                  "sampled_of": 3 * args.requests}
    results["load_average"] = os.getloadavg()[0]
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
