"""A stand-in for Flink's REST API on loopback: the few endpoints ``dedupctl status`` reads.

The job graph, metric ids and values have the shapes a real mini-cluster serves (vertex names,
REST-sanitized metric ids, ``agg=min,max,sum`` answers). Tests change ``values`` and ``uptime``
between calls to play successive refreshes of the JobManager's metric store.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JOB = "0123456789abcdef0123456789abcdef"
SOURCE_V, DEDUP_V = "v-source", "v-dedup"
BASE = 1_796_115_600_000
NOW = BASE + 15 * 60_000
MIN_LONG = -9.223372036854776e18

VERTEX_NAMES = {
    SOURCE_V: "Source: requests -> carry-watermark",
    DEDUP_V: "batch -> dedup -> route -> outputs: Writer -> outputs: Committer",
}


def default_values() -> dict[tuple[str, str], tuple[float, float, float]]:
    """(vertex, metric id) -> (min, max, sum) over two subtasks."""
    wm = float(BASE + 9 * 60_000 - 1)
    v: dict[tuple[str, str], tuple[float, float, float]] = {
        (SOURCE_V, "Source__requests.currentOutputWatermark"): (wm, wm + 5, 2 * wm + 5),
        (SOURCE_V, "carry-watermark.currentInputWatermark"): (wm, wm + 5, 2 * wm + 5),
        (SOURCE_V, "carry-watermark.currentOutputWatermark"): (wm, wm + 5, 2 * wm + 5),
        (SOURCE_V, "backPressuredTimeMsPerSecond"): (0, 12, 12),
        (DEDUP_V, "currentInputWatermark"): (wm, wm, 2 * wm),
        (DEDUP_V, "dedup.currentInputWatermark"): (wm, wm, 2 * wm),
        (DEDUP_V, "dedup.accepted"): (30, 50, 80),
        (DEDUP_V, "dedup.duplicates"): (5, 15, 20),
        (DEDUP_V, "dedup.late"): (0, 2, 2),
        (DEDUP_V, "route.invalid"): (1, 2, 3),
        (DEDUP_V, "dedup.state_reads"): (10, 15, 25),
        (DEDUP_V, "dedup.state_reads_skipped"): (35, 40, 75),
        (DEDUP_V, "dedup.bloom_false_positives"): (0, 1, 1),
        (DEDUP_V, "dedup.evicted"): (0, 0, 0),
        (DEDUP_V, "dedup.keys_held"): (30, 50, 80),
        (DEDUP_V, "dedup.bloom_keys_estimate"): (30, 51, 81),
        (DEDUP_V, "dedup.bloom_fill_ratio_pct"): (0, 3, 3),
        (DEDUP_V, "dedup.newest_event_time"): (BASE + 9 * 60_000, BASE + 10 * 60_000, 0),
        (DEDUP_V, "dedup.entries.rocksdb_estimate-num-keys"): (30, 49, 79),
        (DEDUP_V, "dedup.entries.rocksdb_estimate-live-data-size"): (1000, 2000, 3000),
        (DEDUP_V, "dedup.log_new.rocksdb_estimate-live-data-size"): (100, 200, 300),
        (DEDUP_V, "dedup.entries.rocksdb_total-sst-files-size"): (0, 4096, 4096),
        (DEDUP_V, "route.topic.notifications_push.emitted"): (10, 20, 30),
        (DEDUP_V, "route.topic.notifications_sms_priority.emitted"): (1, 1, 2),
        (DEDUP_V, "route.topic.notifications_duplicates.emitted"): (5, 15, 20),
        (DEDUP_V, "route.topic.notifications_invalid.emitted"): (1, 2, 3),
        (DEDUP_V, "outputs__Writer.currentInputWatermark"): (MIN_LONG, wm, MIN_LONG + wm),
        (DEDUP_V, "outputs__Committer.currentInputWatermark"): (wm, wm, 2 * wm),
        (DEDUP_V, "backPressuredTimeMsPerSecond"): (0, 0, 0),
    }
    # what a real vertex lists besides: never asked for by dedupctl status
    v[(DEDUP_V, "dedup.numRecordsIn")] = (0, 0, 0)
    v[(SOURCE_V, "Shuffle.Netty.Input.numBytesInLocal")] = (0, 0, 0)
    return v


@dataclass
class FakeFlink:
    values: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=default_values)
    uptime: float = 600_000
    restarts: int = 0
    state: str = "RUNNING"
    checkpoints: dict[str, Any] = field(default_factory=lambda: {
        "counts": {"restored": 0, "total": 120, "in_progress": 0, "completed": 118, "failed": 2},
        "latest": {
            "completed": {"id": 118, "latest_ack_timestamp": NOW - 2_500, "checkpointed_size": 55_388,
                          "state_size": 63_524, "end_to_end_duration": 13},
            "failed": {"id": 3, "failure_timestamp": BASE, "failure_message": "Checkpoint expired"},
            "savepoint": None, "restored": None,
        },
    })
    jobs: list[dict[str, Any]] = field(default_factory=lambda: [
        {"jid": JOB, "name": "notify-dedup", "state": "RUNNING", "start-time": NOW - 600_000}
    ])
    #: called before each answer to /jobs/:id/metrics: lets a test refresh the store mid-read
    on_job_metrics: Any = None
    requests: list[str] = field(default_factory=list)

    def answer(self, path: str) -> Any:
        self.requests.append(path)
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        if parts == ["jobs", "overview"]:
            return {"jobs": self.jobs}
        if len(parts) < 2 or parts[0] != "jobs" or parts[1] != JOB:
            return None
        if len(parts) == 2:
            return {
                "jid": JOB, "name": "notify-dedup", "state": self.state, "start-time": NOW - 600_000,
                "duration": 600_000, "now": NOW,
                "vertices": [{"id": v, "name": n, "parallelism": 2} for v, n in VERTEX_NAMES.items()],
            }
        if parts[2:] == ["checkpoints"]:
            return self.checkpoints
        if parts[2:] == ["metrics"]:
            if self.on_job_metrics:
                self.on_job_metrics(self)
            found = {"uptime": self.uptime, "numRestarts": self.restarts}
            return [{"id": k, "value": str(v)} for k, v in found.items() if k in query["get"][0].split(",")]
        if len(parts) == 6 and parts[2] == "vertices" and parts[4:] == ["subtasks", "metrics"]:
            vertex = parts[3]
            ids = [mid for (v, mid) in self.values if v == vertex]
            if "get" not in query:
                return [{"id": mid} for mid in ids]
            wanted = query["get"][0].split(",")
            return [
                {"id": mid, "min": self.values[(vertex, mid)][0], "max": self.values[(vertex, mid)][1],
                 "sum": self.values[(vertex, mid)][2]}
                for mid in wanted if (vertex, mid) in self.values
            ]
        return None

    def bump(self, metric_id: str, by: float, uptime_ms: float) -> None:
        """A store refresh: ``metric_id`` of the dedup or source vertex grew, uptime moved on."""
        for key, (lo, hi, total) in list(self.values.items()):
            if key[1] == metric_id:
                self.values[key] = (lo, hi + by, total + by)
        self.uptime += uptime_ms


@contextmanager
def serve(fake: FakeFlink) -> Iterator[str]:
    """The fake on 127.0.0.1:<free port>; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            body = fake.answer(self.path)
            status = 200 if body is not None else 404
            raw = json.dumps(body if body is not None else {"errors": ["Not found."]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
