"""An in-process metrics registry: counters, gauges and histograms with labels, a snapshot,
Prometheus text."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Labels = tuple[tuple[str, str], ...]
CounterKey = tuple[str, Labels]


#: the sorted labels of each keyword set seen (a process has few: channel, lane, provider,
#: outcome ...), so counting on the send path does not sort and format them for every message
_SORTED: dict[tuple[object, ...], Labels] = {}
_SORTED_MAX = 10_000


def _labels(labels: Mapping[str, object]) -> Labels:
    given = tuple(labels.items())
    key = (*given, *map(type, labels.values()))  # 1 and True are equal keys, not equal labels
    try:
        return _SORTED[key]
    except KeyError:
        pass
    except TypeError:  # a label value that cannot be a key
        return tuple(sorted((k, str(v)) for k, v in given))
    out = tuple(sorted((k, str(v)) for k, v in given))
    if len(_SORTED) >= _SORTED_MAX:
        _SORTED.clear()
    _SORTED[key] = out
    return out


def _name(metric: str, labels: Labels) -> str:
    if not labels:
        return metric
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{metric}{{{inner}}}"


@dataclass
class _Histogram:
    """Cumulative on rendering: ``counts[i]`` holds the observations in bucket ``i`` alone (the
    last one past every bound, ``+Inf``)."""

    bounds: tuple[float, ...]
    counts: list[int]
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, metric: str, labels: Labels) -> list[str]:
        out: list[str] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            # as prometheus_client writes it (5.0, 0.25), which Prometheus 3 normalises to anyway
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.append(f"{_name(metric + '_bucket', (*labels, ('le', le)))} {running}")
        out.append(f"{_name(metric + '_sum', labels)} {self.total:g}")
        out.append(f"{_name(metric + '_count', labels)} {running}")
        return out


@dataclass
class Metrics:
    """Thread-safe; one per process, shared by its workers and providers.

    Counters: ``sender_deliveries_total`` (provider, outcome), ``sender_retries_total``,
    ``sender_dead_letters_total`` (reason), ``sender_skipped_total`` (reason),
    ``provider_calls_total`` and ``provider_call_ms_sum`` (provider, outcome).
    Gauges: ``sender_consumer_lag``, ``sender_oldest_waiting_age_seconds``,
    ``sender_circuit_state`` (0 closed, 1 half-open, 2 open). Histograms:
    ``sender_accept_to_provider_seconds``. Channel and lane label them all.
    """

    _counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    _gauges: dict[tuple[str, Labels], float] = field(default_factory=dict)
    _histograms: dict[tuple[str, Labels], _Histogram] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def counter_key(metric: str, **labels: object) -> CounterKey:
        """A counter's key, for ``add``: a caller that counts the same series on every message
        makes its key once."""
        return (metric, _labels(labels))

    def add(self, *amounts: tuple[CounterKey, float]) -> None:
        """Add to counters by their keys (``counter_key``), under one lock."""
        with self._lock:
            for key, amount in amounts:
                self._counters[key] = self._counters.get(key, 0.0) + amount

    def inc(self, metric: str, amount: float = 1.0, **labels: object) -> None:
        key = (metric, _labels(labels))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def set(self, metric: str, value: float, **labels: object) -> None:
        with self._lock:
            self._gauges[(metric, _labels(labels))] = value

    def observe(self, metric: str, value: float, buckets: tuple[float, ...], **labels: object) -> None:
        """One observation of a histogram whose upper bounds are ``buckets`` (ascending; the same
        for every call of one metric)."""
        self.observe_many(metric, (value,), buckets, **labels)

    def observe_many(self, metric: str, values: Iterable[float], buckets: tuple[float, ...], **labels: object) -> None:
        """``observe`` of each value, under one lock."""
        key = (metric, _labels(labels))
        with self._lock:
            hist = self._histograms.get(key)
            if hist is None:
                hist = self._histograms[key] = _Histogram(buckets, [0] * (len(buckets) + 1))
            for value in values:
                hist.observe(value)

    def _scalars(self) -> list[tuple[tuple[str, Labels], float]]:
        """Counters and gauges, and each histogram as its ``_count`` and ``_sum``; under the lock."""
        items = list(self._counters.items()) + list(self._gauges.items())
        for (m, lab), h in self._histograms.items():
            items += [((f"{m}_count", lab), float(sum(h.counts))), ((f"{m}_sum", lab), h.total)]
        return items

    def value(self, metric: str, **labels: object) -> float:
        """A counter's or gauge's value (a histogram's: ``<name>_count``, ``<name>_sum``), summed
        over the labels not given."""
        want = set(_labels(labels))
        with self._lock:
            items = self._scalars()
        return sum(v for (m, lab), v in items if m == metric and want <= set(lab))

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            items = self._scalars()
        return {_name(m, lab): v for (m, lab), v in sorted(items)}

    def render_prometheus(self) -> str:
        """The text exposition format (serve it from any HTTP handler)."""
        lines: list[str] = []
        with self._lock:
            counters = sorted(self._counters.items())
            gauges = sorted(self._gauges.items())
            histograms = [(key, h.lines(*key)) for key, h in sorted(self._histograms.items())]
        for kind, items in (("counter", counters), ("gauge", gauges)):
            seen: set[str] = set()
            for (metric, labels), value in items:
                if metric not in seen:
                    seen.add(metric)
                    lines.append(f"# TYPE {metric} {kind}")
                lines.append(f"{_name(metric, labels)} {value:g}")
        seen = set()
        for (metric, _), sample_lines in histograms:
            if metric not in seen:
                seen.add(metric)
                lines.append(f"# TYPE {metric} histogram")
            lines += sample_lines
        return "\n".join(lines) + "\n"


def serve_metrics(metrics: Metrics, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` (Prometheus text format) from a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.render_prometheus().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence access logs
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="sender-metrics", daemon=True).start()
    return server
