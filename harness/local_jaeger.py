"""A throwaway Jaeger (v2: the OpenTelemetry Collector with Jaeger's storage and query) on
loopback, in-memory storage, for the traces' tests and benchmark: an OTLP/HTTP receiver to export
to and the query API (``/api/traces``) to read back from, each on a free port.

The binary is built by ``make setup`` (``make jaeger``: tools/jaeger/go.mod pins the version) into
``.cache/jaeger/<version>/jaeger``; ``DEDUP_JAEGER_BIN`` names another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import server_process
from harness.ports import free_port
from operators.errors import DedupError
from settings.base import REPO_ROOT

#: the version ``make jaeger`` builds (tools/jaeger/go.mod)
JAEGER_VERSION = "v1.76.0"
JAEGER_BIN = REPO_ROOT / ".cache" / "jaeger" / JAEGER_VERSION / "jaeger"


class JaegerError(DedupError):
    """The local Jaeger could not be started, or did not answer."""


def jaeger_binary() -> Path:
    return Path(os.environ.get("DEDUP_JAEGER_BIN") or JAEGER_BIN)


def jaeger_config(*, otlp_port: int, query_port: int, query_grpc_port: int, health_port: int) -> dict[str, Any]:
    """All-in-one on 127.0.0.1 only: the OTLP/HTTP receiver, memory storage, the query service;
    no other receiver, and the collector's own metrics off (their default port is fixed)."""
    loopback = "127.0.0.1"
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                     "exporters": ["jaeger_storage_exporter"]}},
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "jaeger_query": {"storage": {"traces": "memstore"},
                             "http": {"endpoint": f"{loopback}:{query_port}"},
                             "grpc": {"endpoint": f"{loopback}:{query_grpc_port}"}},
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100_000}}}},
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"{loopback}:{health_port}"}},
        },
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"{loopback}:{otlp_port}"}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


def render_trace(trace: dict[str, Any]) -> str:
    """A trace of the query API as text: one line per span, in start order, children indented under
    their parent: service, span name, duration, the parent's span id (``-`` for a root; a parent
    outside the trace, the caller's, is named as such)."""
    services = {pid: proc["serviceName"] for pid, proc in trace["processes"].items()}
    spans = sorted(trace["spans"], key=lambda s: s["startTime"])
    ids = {s["spanID"] for s in spans}

    def parent(span: dict[str, Any]) -> str | None:
        refs = [r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
        return refs[0] if refs else None

    def depth(span: dict[str, Any]) -> int:
        by_id = {s["spanID"]: s for s in spans}
        n, up = 0, parent(span)
        while up in by_id:
            n, up = n + 1, parent(by_id[up])
        return n

    lines = [f"trace {trace['traceID']}"]
    for span in spans:
        up = parent(span)
        where = "-" if up is None else (up if up in ids else f"{up} (the caller's)")
        name = "  " * depth(span) + span["operationName"]
        lines.append(f"  {services[span['processID']]:<22} {name:<36} {span['duration'] / 1000:>9.1f} ms"
                     f"  span {span['spanID']}  parent {where}")
    return "\n".join(lines)


@dataclass
class LocalJaeger:
    """:param home: where its config and log go"""

    home: Path
    otlp_port: int = field(default_factory=free_port)
    query_port: int = field(default_factory=free_port)
    query_grpc_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def otlp_endpoint(self) -> str:
        """What ``[telemetry] otlp_endpoint`` is set to."""
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def start(self, timeout_s: float = 60.0) -> LocalJaeger:
        binary = jaeger_binary()
        if not binary.exists():
            raise JaegerError(f"no Jaeger at {binary}: `make setup` (make jaeger) builds it")
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "jaeger.json"  # JSON is YAML
        config.write_text(json.dumps(jaeger_config(otlp_port=self.otlp_port, query_port=self.query_port,
                                                   query_grpc_port=self.query_grpc_port,
                                                   health_port=self.health_port)), encoding="utf-8")
        self._proc = server_process.launch([str(binary), "--config", f"file:{config}"], self.home / "jaeger.log")
        if server_process.wait_ready(self._proc, self._answers, timeout_s):
            return self
        if self._proc.poll() is not None:
            raise JaegerError(f"jaeger exited with {self._proc.returncode}: see {self.home / 'jaeger.log'}")
        self.stop()
        raise JaegerError(f"jaeger's query API did not answer within {timeout_s:.0f} s")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.query_url}/api/services", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def traces(self, service: str, tags: dict[str, str] | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The query API's traces of ``service`` with a span that has every one of ``tags``."""
        query = {"service": service, "limit": str(limit), "lookback": "1h"}
        if tags:
            query["tags"] = json.dumps(tags)
        url = f"{self.query_url}/api/traces?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            found: list[dict[str, Any]] = json.load(reply).get("data") or []
        return found

    def stop(self) -> None:
        if self._proc is not None:
            server_process.stop(self._proc)
            self._proc = None

    def __enter__(self) -> LocalJaeger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
