"""The few calls of Flink's REST API the tools use: stop with a savepoint, job and metric reads."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from operators.errors import DedupError


class JobControlError(DedupError):
    """The job could not be found, stopped or restored as asked."""


class RestClient:
    """The few calls of Flink's REST API the tools use."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.base}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise JobControlError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
        except urllib.error.URLError as exc:
            raise JobControlError(f"cannot reach Flink at {self.base}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise JobControlError(f"cannot reach Flink at {self.base}: {exc}") from None
        return json.loads(raw) if raw else None

    def running_jobs(self) -> list[dict[str, Any]]:
        overview = self.call("GET", "/jobs/overview")
        return [j for j in overview.get("jobs", []) if j.get("state") in ("RUNNING", "RESTARTING", "CREATED")]

    def job_id(self, job_id: str | None = None) -> str:
        if job_id:
            return job_id
        jobs = self.running_jobs()
        if len(jobs) != 1:
            raise JobControlError(f"expected one running job, found {len(jobs)}; name one with --job")
        return str(jobs[0]["jid"])

    def stop_with_savepoint(self, job_id: str, target_dir: str, timeout_s: float = 300.0) -> str:
        """POST /jobs/:id/stop and wait; returns the savepoint's location.

        On the local mini-cluster the REST server goes away with the job (``dedupctl run``
        returns once its job has stopped), sometimes before the completed status can be read:
        then the savepoint is looked for where Flink writes it, ``savepoint-<job id[:6]>-*``.
        """
        trigger = self.call("POST", f"/jobs/{job_id}/stop", {"targetDirectory": target_dir, "drain": False})
        request_id = trigger["request-id"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status = self.call("GET", f"/jobs/{job_id}/savepoints/{request_id}")
            except JobControlError:
                found = _written_savepoint(target_dir, job_id)
                if found is not None:
                    return found
                time.sleep(0.5)
                continue
            if status["status"]["id"] == "COMPLETED":
                op = status.get("operation", {})
                if "failure-cause" in op:
                    cause = op["failure-cause"].get("stack-trace", "")[:2000]
                    raise JobControlError(f"stop with savepoint failed: {cause}")
                return str(op["location"])
            time.sleep(0.5)
        raise JobControlError(f"savepoint not finished after {timeout_s:.0f} s")

    def vertex_ids(self, job_id: str) -> dict[str, str]:
        """Vertex name -> id."""
        job = self.call("GET", f"/jobs/{job_id}")
        return {v["name"]: v["id"] for v in job["vertices"]}

    def operator_metrics(self, job_id: str, operator: str, names: list[str]) -> dict[str, float]:
        """Metrics of one operator summed over its subtasks (0 for one not reported yet)."""
        totals = {n: 0.0 for n in names}
        for vertex_name, vid in self.vertex_ids(job_id).items():
            if operator not in vertex_name:
                continue
            query = ",".join(f"{operator}.{n}" for n in names)
            for metric in self.call("GET", f"/jobs/{job_id}/vertices/{vid}/subtasks/metrics?get={query}&agg=sum"):
                name = metric["id"][len(operator) + 1:]
                if name in totals and "sum" in metric:
                    totals[name] += float(metric["sum"])
        return totals


def _written_savepoint(target_dir: str, job_id: str) -> str | None:
    """The newest complete savepoint of ``job_id`` in a local ``target_dir``, as a URI."""
    base = Path(target_dir.removeprefix("file:").removeprefix("//"))
    done = [p.parent for p in base.glob(f"savepoint-{job_id[:6]}-*/_metadata")]
    if not done:
        return None
    return "file:" + str(max(done, key=lambda p: p.stat().st_mtime_ns))
