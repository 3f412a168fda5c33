"""The API's Prometheus metrics (``prometheus_client``), served on its own ``GET /metrics``.

Names come from ``operators/metric_names.py``. Labels are bounded and never carry what a caller
wrote: ``route`` is the matched route's template (``unmatched`` otherwise), ``method`` one of the
HTTP methods (``other`` for anything else a client sends), ``status`` the answer's code, and
``caller`` only on the rate-limited answers: a caller's name is made by an operator (``dedupctl api
token create``, the name rule of ``api.callers``), there are as many as the operator made, and
"which caller is being throttled" is the question that counter answers. Never a user id, a key, a
token, a namespace or a template a caller named.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``dedupctl api run --processes N`` sets it for its
processes), every process writes its values to files there and ``/metrics`` on any process
serves the sum over all of them (``prometheus_client.multiprocess``).

Besides the answers, what tells where an answer's time went: the event loop's lag (a ticker's
lateness), a store call's wait for a store thread and its own time, Kafka's acknowledgement, the
garbage collector's pauses, and the size of each batch of idempotency reservations.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client import multiprocess as prom_multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from operators import metric_names as names

#: seconds; resolves 1-100 ms (the accept target is p99 < 50 ms), then the tail up to 10 s
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1,
                   0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: the loop's lag, the store's queue and a GC pause: from a tenth of a millisecond
SHORT_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
CONTENT_TYPE = CONTENT_TYPE_LATEST
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
GC_PAUSES_KEPT = 10_000


def method_label(method: object) -> str:
    text = str(method)
    return text if text in METHODS else "other"


class ApiMetrics:
    """One per process. Thread-safe (prometheus_client's values are)."""

    def __init__(self) -> None:
        disable_created_metrics()
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(names.API_REQUESTS, "Answers by method, route template and status",
                                ("method", "route", "status"), registry=r)
        self.accept = Histogram(names.API_ACCEPT_SECONDS, "POST /v1/notifications: from the request's arrival to"
                                " its answer, by status", ("status",), buckets=LATENCY_BUCKETS, registry=r)
        self.kafka_ack = Histogram(names.API_KAFKA_ACK_SECONDS, "A request record's produce to Kafka's"
                                   " acknowledgement (acks=all)", buckets=LATENCY_BUCKETS, registry=r)
        self.repeats = Counter(names.API_IDEMPOTENT_REPEATS, "Requests with an Idempotency-Key seen before: replay"
                               " (200, the first answer), other_body (422), in_progress (409)", ("outcome",),
                               registry=r)
        self.rate_limited = Counter(names.API_RATE_LIMITED, "429 answers by caller and bucket (send, calls)",
                                    ("caller", "bucket"), registry=r)
        self.unavailable = Counter(names.API_UNAVAILABLE, "503 answers by cause: kafka_down, kafka_no_ack,"
                                   " store_unavailable, not_ready", ("cause",), registry=r)
        self.loop_lag = Histogram(names.API_LOOP_LAG_SECONDS, "How late the event loop ran a ticker due every"
                                  " 50 ms", buckets=SHORT_BUCKETS, registry=r)
        self.store_queue = Histogram(names.API_STORE_QUEUE_SECONDS, "A store call's wait for a store thread",
                                     buckets=SHORT_BUCKETS, registry=r)
        self.store_call = Histogram(names.API_STORE_CALL_SECONDS, "A store call's own time in its thread",
                                    buckets=SHORT_BUCKETS, registry=r)
        self.store_lock_wait = Histogram(names.API_STORE_LOCK_WAIT_SECONDS, "A SQLite write transaction's wait for"
                                         " the file's write lock, by connection: writer (the idempotency"
                                         " rounds), budgets (the rate leases), routes (the rest)",
                                         ("connection",), buckets=SHORT_BUCKETS, registry=r)
        self.reservation_batch = Histogram(names.API_RESERVATION_BATCH, "Idempotency reservations per store"
                                           " transaction", buckets=BATCH_BUCKETS, registry=r)
        self.reservation = Histogram(names.API_RESERVATION_SECONDS, "A request's idempotency reservation, from"
                                     " its hand-over to the store writer to its answer (the writer's round, its"
                                     " transaction and its new requests' profile reads)", buckets=LATENCY_BUCKETS,
                                     registry=r)
        self.rate_grants = Counter(names.API_RATE_GRANTS, "Store transactions that leased a chunk of a caller's"
                                   " per-second budget, by bucket", ("bucket",), registry=r)
        self.gc_pause = Histogram(names.API_GC_PAUSE_SECONDS, "The garbage collector's collections, by generation",
                                  ("generation",), buckets=SHORT_BUCKETS, registry=r)
        self.leader = Gauge(names.API_LEADER, "1 in the API process that runs the campaigns, the verdicts' reader"
                            " and pruning (the lease's holder); summed over the processes",
                            multiprocess_mode="livesum", registry=r)
        self.campaigns_held = Gauge(names.API_CAMPAIGNS_HELD, "Campaigns whose next batch waits while more than"
                                    " api.campaign_max_backlog messages wait for the senders on their lanes;"
                                    " summed over the processes", multiprocess_mode="livesum", registry=r)
        self.campaign_held = Counter(names.API_CAMPAIGN_HELD_SECONDS, "Seconds campaigns have waited so for the"
                                     " senders", registry=r)
        self._gc_started = 0.0
        #: (generation, seconds) of collections not yet observed; bounded, should nobody observe them
        self._gc_pauses: deque[tuple[str, float]] = deque(maxlen=GC_PAUSES_KEPT)

    def hold_started(self) -> None:
        """A campaign's hold began (``RunnerContext.on_hold``)."""
        self.campaigns_held.inc()

    def hold_ended(self, held_s: float) -> None:
        """That hold ended (the backlog fell under the bound, or the campaign stopped) after ``held_s``."""
        self.campaigns_held.dec()
        self.campaign_held.inc(held_s)

    def render(self) -> bytes:
        """The text exposition: this process's values, or with several processes the sum over them."""
        self.record_gc_pauses()
        if not self.multiprocess:
            return bytes(generate_latest(self.registry))
        merged = CollectorRegistry()
        prom_multiprocess.MultiProcessCollector(merged)
        return bytes(generate_latest(merged))

    # -- the garbage collector's pauses ------------------------------------------------------------

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The collector's callback: it runs in whichever thread's allocation started the
        collection, which may hold prometheus_client's lock at that moment (creating a labelled
        child allocates under it; with several processes it is one lock for every value, and not
        reentrant). Observing here would wait for that lock in the thread holding it: the thread
        stops for good, and every thread of the process after it at its next metric (seen as an
        API process that answered nothing more while its lease went on, its campaign stopped
        without a log line). So the pause is only noted here, and observed from the event loop
        (``record_gc_pauses``)."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc_pauses.append((str(info.get("generation", "?")), time.perf_counter() - self._gc_started))
            self._gc_started = 0.0

    def record_gc_pauses(self) -> None:
        """Observe the pauses noted since the last call (from outside any metric's lock)."""
        while True:
            try:
                generation, seconds = self._gc_pauses.popleft()
            except IndexError:
                return
            self.gc_pause.labels(generation).observe(seconds)

    def watch_gc(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    # -- the event loop's lag ----------------------------------------------------------------------

    async def watch_loop(self, interval_s: float = 0.05) -> None:
        """Until cancelled: how much later than due the loop ran a sleeper (its lag)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval_s
            await asyncio.sleep(interval_s)
            self.loop_lag.observe(max(0.0, loop.time() - due))
            self.record_gc_pauses()
