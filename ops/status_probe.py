"""Reading a job through Flink's REST API: its graph, and its metrics over one store refresh.

The REST API serves metrics from a store that the JobManager refreshes at most every
``metrics.fetcher.update-interval`` (10 s by default). A ``Sample`` holds the values of one
refresh, paired with the job's ``uptime`` metric fetched in the same refresh, so that the delta
of two samples is exact whatever the refresh interval (``dedupctl status`` rates).

Metric ids are the REST API's: ``<operator>.<groups>.<name>``, every ' ', '.', ':' and ',' inside
a part written as '_' (``route.topic.notifications_push.emitted``).
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators.metric_names import (
    BACK_PRESSURED,
    CURRENT_INPUT_WATERMARK,
    CURRENT_OUTPUT_WATERMARK,
    DEDUP_COUNTERS,
    DEDUP_LEVELS,
    DEDUP_OPERATOR,
    EMITTED,
    JOB_NAME,
    NUM_RESTARTS,
    ROUTE_COUNTERS,
    ROUTE_OPERATOR,
    TOPIC_GROUP,
    UPTIME,
)
from ops.flink_rest import JobControlError, RestClient

_ACTIVE_STATES = ("RUNNING", "RESTARTING", "CREATED", "INITIALIZING", "RECONCILING")


def rest_name(name: str) -> str:
    """A name as Flink's metric query service writes it into metric ids."""
    return re.sub(r"[ .:,]", "_", name)


def operator_names(vertex_name: str) -> list[str]:
    """The operators chained in a vertex, in order: ``a -> b -> (c, d)`` -> a, b, c, d."""
    names: list[str] = []
    for part in vertex_name.split(" -> "):
        part = part.strip()
        if part.startswith("(") and part.endswith(")"):
            names.extend(p.strip() for p in part[1:-1].split(","))
        else:
            names.append(part)
    return names


@dataclass(frozen=True)
class Agg:
    """One metric over the subtasks of a vertex."""

    min: float
    max: float
    sum: float


@dataclass(frozen=True)
class Vertex:
    """A job vertex: its chained operators (metric-id name -> display name) and metric ids."""

    id: str
    name: str
    parallelism: int
    operators: Mapping[str, str]
    metric_ids: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    """The metric values of one refresh of the JobManager's metric store."""

    uptime_ms: float | None
    restarts: int | None
    values: Mapping[tuple[str, str], Agg]
    read_at: float

    def find(self, vertices: Sequence[Vertex], metric_id: str) -> Agg | None:
        """A metric by id in whichever vertex has it."""
        for v in vertices:
            agg = self.values.get((v.id, metric_id))
            if agg is not None:
                return agg
        return None

    def total(self, vertices: Sequence[Vertex], metric_id: str) -> int:
        agg = self.find(vertices, metric_id)
        return int(agg.sum) if agg else 0


@dataclass(frozen=True)
class Reading:
    """What one look at the REST API saw."""

    job: Mapping[str, Any]
    checkpoints: Mapping[str, Any] | None
    vertices: tuple[Vertex, ...]
    sample: Sample


def _wanted(metric_id: str) -> bool:
    last = metric_id.rsplit(".", 1)[-1]
    if last in (CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK, BACK_PRESSURED):
        return True
    if metric_id in {f"{ROUTE_OPERATOR}.{n}" for n in ROUTE_COUNTERS}:
        return True
    if last == EMITTED:
        return metric_id.startswith(f"{ROUTE_OPERATOR}.{TOPIC_GROUP}.")
    return metric_id.startswith(f"{DEDUP_OPERATOR}.") and (
        last in DEDUP_COUNTERS or last in DEDUP_LEVELS or last.startswith("rocksdb_")
    )


class Probe:
    """Reads one job through the REST API; the job is found once, on the first read."""

    def __init__(self, rest: RestClient, job_id: str | None = None) -> None:
        self.rest = rest
        self._job_id = job_id

    def job_id(self) -> str:
        if self._job_id is None:
            self._job_id = pick_job(self.rest.call("GET", "/jobs/overview").get("jobs", []))
        return self._job_id

    def read(self) -> Reading:
        jid = self.job_id()
        job = self.rest.call("GET", f"/jobs/{jid}")
        try:
            checkpoints = self.rest.call("GET", f"/jobs/{jid}/checkpoints")
        except JobControlError:  # checkpointing off, or the job is gone from the history
            checkpoints = None
        vertices = tuple(self._vertex(v) for v in job.get("vertices", []))
        return Reading(job, checkpoints, vertices, self.sample(vertices))

    def sample(self, vertices: Sequence[Vertex]) -> Sample:
        """Counters and the uptime of one store refresh (read again if it changed meanwhile)."""
        for _ in range(3):
            before = self._job_metrics()
            values = {k: v for vertex in vertices for k, v in self._values(vertex).items()}
            after = self._job_metrics()
            if before == after:
                break
        uptime = after.get(UPTIME)
        restarts = after.get(NUM_RESTARTS)
        return Sample(uptime, int(restarts) if restarts is not None else None, values, time.monotonic())

    def _vertex(self, raw: Mapping[str, Any]) -> Vertex:
        jid = self.job_id()
        listed = self.rest.call("GET", f"/jobs/{jid}/vertices/{raw['id']}/subtasks/metrics") or []
        ids = tuple(m["id"] for m in listed if _wanted(m["id"]))
        operators = {rest_name(n): n for n in operator_names(raw["name"])}
        return Vertex(raw["id"], raw["name"], int(raw.get("parallelism", 1)), operators, ids)

    def _values(self, vertex: Vertex) -> dict[tuple[str, str], Agg]:
        if not vertex.metric_ids:
            return {}
        query = ",".join(urllib.parse.quote(i, safe="") for i in vertex.metric_ids)
        path = f"/jobs/{self.job_id()}/vertices/{vertex.id}/subtasks/metrics?get={query}&agg=min,max,sum"
        out = {}
        for m in self.rest.call("GET", path) or []:
            if "sum" in m:
                out[(vertex.id, m["id"])] = Agg(float(m["min"]), float(m["max"]), float(m["sum"]))
        return out

    def _job_metrics(self) -> dict[str, float]:
        try:
            got = self.rest.call("GET", f"/jobs/{self.job_id()}/metrics?get={UPTIME},{NUM_RESTARTS}") or []
        except JobControlError:
            return {}
        return {m["id"]: float(m["value"]) for m in got if _is_number(m.get("value"))}


def _is_number(value: object) -> bool:
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def pick_job(jobs: Sequence[Mapping[str, Any]]) -> str:
    """The only active job; else the most recently started one (to show why it stopped)."""
    if not jobs:
        raise JobControlError("no job on this cluster")
    active = [j for j in jobs if j.get("state") in _ACTIVE_STATES]
    if len(active) > 1:
        ours = [j for j in active if j.get("name") == JOB_NAME]
        if len(ours) != 1:
            listed = ", ".join(f"{j['jid']} ({j.get('name')})" for j in active)
            raise JobControlError(f"{len(active)} jobs are running: {listed}; name one with --job")
        active = ours
    chosen = active[0] if active else max(jobs, key=lambda j: j.get("start-time", 0))
    return str(chosen["jid"])
