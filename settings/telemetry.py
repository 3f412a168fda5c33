"""The ``[telemetry]`` section: where traces go (operators/tracing.py)."""

from __future__ import annotations

from pydantic import field_validator

from settings.base import OptionalStr, Section


class TelemetrySettings(Section):
    """Traces over OpenTelemetry (OTLP over HTTP); off unless ``otlp_endpoint`` is set.

    :param otlp_endpoint: the collector's OTLP/HTTP base URL (``http://127.0.0.1:4318``: Jaeger's or
        an OpenTelemetry Collector's), traces are posted to ``<it>/v1/traces``; unset (the default,
        or ``DEDUP_TELEMETRY_OTLP_ENDPOINT=``): no traces, and nothing of OpenTelemetry is loaded
    :param service_prefix: the services are ``<prefix>-api``, ``<prefix>-job``, ``<prefix>-senders``
    :param sample_ratio: the share of the traces a process starts that are kept (by trace id, 0 to 1);
        a span with a parent (the caller's ``traceparent``, a record's) follows its parent's decision
    """

    otlp_endpoint: OptionalStr = None
    service_prefix: str = "notify-dedup"
    sample_ratio: float = 1.0

    @field_validator("sample_ratio")
    @classmethod
    def _ratio(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("a share of traces: 0 to 1 (1: every trace, 0.01: one in a hundred)")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an http:// or https:// URL (the collector's OTLP/HTTP port, 4318 by default)")
        return value

    def service(self, component: str) -> str:
        return f"{self.service_prefix}-{component}"
