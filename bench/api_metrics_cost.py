"""The API metrics' cost on the accept path: ``python -m bench.api_metrics_cost [--updates N]``.

Times the metric updates of one accepted ``POST /v1/notifications`` (the answers counter, the
accept and the Kafka acknowledgement histograms: what the gate and the producer do per request)
in CPU time, in one process and with ``PROMETHEUS_MULTIPROC_DIR`` set (the values in files, as
under ``dedupctl api run --processes N``), each in a fresh interpreter. CPU time rather than the
wall clock, so that a busy machine inflates it less.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import timeit


def measure(updates: int) -> float:
    """CPU seconds per accepted request's updates, the best of five runs."""
    from api.metrics import ApiMetrics

    metrics = ApiMetrics()

    def one_request() -> None:
        metrics.requests.labels("POST", "/v1/notifications", "202").inc()
        metrics.accept.labels("202").observe(0.012)
        metrics.kafka_ack.observe(0.004)

    return min(timeit.repeat(one_request, number=updates, repeat=5, timer=time.process_time)) / updates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_metrics_cost")
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        print(f"{measure(args.updates) * 1e6:.2f}")
        return 0
    for mode in ("one process", "multi-process files"):
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with tempfile.TemporaryDirectory() as files:
            if mode != "one process":
                env["PROMETHEUS_MULTIPROC_DIR"] = files
            out = subprocess.run([sys.executable, "-m", "bench.api_metrics_cost", "--inner", "--updates",
                                  str(args.updates)], env=env, check=True, capture_output=True, text=True)
        print(f"{mode}: {out.stdout.strip()} us CPU per accepted request (3 metric updates); "
              f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
