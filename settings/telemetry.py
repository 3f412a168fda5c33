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
    """

    otlp_endpoint: OptionalStr = None
    service_prefix: str = "notify-dedup"

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an http:// or https:// URL (the collector's OTLP/HTTP port, 4318 by default)")
        return value

    def service(self, component: str) -> str:
        return f"{self.service_prefix}-{component}"
