"""Traces over OpenTelemetry: one trace per notification, from the API call to the provider.

Off unless ``[telemetry] otlp_endpoint`` is set: then ``OFF`` is what every component
holds, ``tracing.on`` is False, and nothing of OpenTelemetry is imported. On, a process has one
``TracerProvider`` whose spans an OTLP/HTTP exporter sends in batches, from a thread of its own.

The context travels as W3C ``traceparent`` text: the caller's header, the request record's
``traceparent`` field, the channel message's, a retry's payload (the same bytes). Span attributes
name the message key, the notification id, the caller, the channel, the provider and outcomes;
never a user id, an address, a token or a message parameter (the logs' rule).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger(__name__)

#: the attribute that finds a notification's trace: ``<dedup_key>:<channel>:<event_time>``
MESSAGE_KEY = "message.key"
NOTIFICATION_ID = "notification.id"
CALLER = "caller"
CHANNEL = "channel"
LANE = "lane"
PROVIDER = "provider"
OUTCOME = "outcome"
ATTEMPT = "attempt"
DECISION = "dedup.decision"
CAMPAIGN_ID = "campaign.id"
#: the span of one traced request's decision in the job (jobs/dedup_function.py)
DECISION_SPAN = "dedup decision"
#: the span of one transaction of a campaign's requests in the API (api/campaigns.py)
CAMPAIGN_BATCH_SPAN = "campaign batch"
#: a traceparent is ``00-<32 hex>-<16 hex>-<2 hex>``: 55 characters; anything longer is not one
TRACEPARENT_CHARS = 55
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

AttributeValue = str | int | float | bool


def sampled(traceparent: str | None) -> bool:
    """Whether a (valid) traceparent says its trace is kept: the sampled bit of its flags."""
    return valid_traceparent(traceparent) is not None and bool(int(traceparent[-2:], 16) & 1)  # type: ignore[index]


def unsampled(traceparent: str | None) -> bool:
    """A valid traceparent whose trace is not kept: passed on as it came, without a span."""
    return valid_traceparent(traceparent) is not None and not sampled(traceparent)


def valid_traceparent(value: str | None) -> str | None:
    """``value`` when it has a traceparent's shape (version 00, lower-case hex, ids not all zero),
    else None: a malformed header starts a new trace rather than failing the request."""
    if value is None or len(value) != TRACEPARENT_CHARS or _TRACEPARENT.fullmatch(value) is None:
        return None
    if value[3:35] == "0" * 32 or value[36:52] == "0" * 16:
        return None
    return value


@dataclass(frozen=True, slots=True)
class Tracing:
    """A process's tracer, or none (``OFF``): components get it through their constructors.

    :param tracer: the OpenTelemetry tracer; None when tracing is off
    :param provider: the provider to flush and shut down at exit; None when off
    """

    tracer: Tracer | None = None
    provider: TracerProvider | None = None

    @property
    def on(self) -> bool:
        return self.tracer is not None

    @contextmanager
    def span(
        self,
        name: str,
        *,
        parent: str | None,
        kind: str = "internal",
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Iterator[Span | None]:
        """A span named ``name``, a child of ``parent`` (a traceparent; None or malformed: a new
        trace), current inside the block (spans opened in it are its children); None when off.
        An exception leaving the block marks the span as an error."""
        if self.tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span(
            name, context=_context_of(parent), kind=getattr(SpanKind, kind.upper()), attributes=attributes
        ) as span:
            yield span

    @contextmanager
    def child(
        self, name: str, *, kind: str = "internal", attributes: Mapping[str, AttributeValue] | None = None
    ) -> Iterator[Span | None]:
        """A span that is a child of the current one (see ``span``); None when off."""
        if self.tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind

        span_kind = getattr(SpanKind, kind.upper())
        with self.tracer.start_as_current_span(name, kind=span_kind, attributes=attributes) as span:
            yield span

    def record(
        self, name: str, *, parent: str | None, start_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> str | None:
        """A span that began at ``start_ns`` (``time.time_ns()``) and ends now, a child of
        ``parent``: for work done before it was known which requests were traced (a batch's
        decision). Its context as a traceparent; None when off."""
        if self.tracer is None:
            return None
        if unsampled(parent):
            return parent  # a trace not kept: passed on as it came, without the SDK's cost (~30 us)
        from opentelemetry.trace import set_span_in_context

        span = self.tracer.start_span(name, context=_context_of(parent), start_time=start_ns, attributes=attributes)
        span.end()
        return _traceparent_of(set_span_in_context(span))

    def follows(self, parent: str | None) -> bool:
        """Whether work with this parent (a record's traceparent) gets spans: tracing on and the
        parent's trace kept. An unsampled parent is passed on as it is instead (``record`` does)."""
        return self.tracer is not None and sampled(parent)

    def traceparent(self) -> str | None:
        """The current span's context as a traceparent (None when off or outside a span)."""
        if self.tracer is None:
            return None
        return _traceparent_of(None)

    def shutdown(self) -> None:
        """Send the spans still batched, then stop the exporter (bounded by its own timeout)."""
        if self.provider is not None:
            self.provider.shutdown()


#: tracing off: what every component holds unless ``[telemetry] otlp_endpoint`` is set
OFF = Tracing()


def _traceparent_of(context: Any) -> str | None:
    """The span of ``context`` (None: the current one) as W3C traceparent text."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return carrier.get("traceparent")


def _context_of(parent: str | None) -> Any:
    if valid_traceparent(parent) is None:
        from opentelemetry.context import Context

        return Context()  # a new trace: not a child of whatever span is current
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": parent})


def sampler(ratio: float) -> Any:
    """Head sampling as OpenTelemetry's SDKs do it: a trace's root keeps ``ratio`` of traces (by
    trace id, so every process of one trace decides alike); a span with a parent follows the
    parent's sampled flag (a caller's ``traceparent``, the request record's, the channel
    message's), so a trace is kept whole or not at all. An unsampled span still passes its context on."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(ratio))


def start_tracing(
    endpoint: str | None, service: str, *, sample_ratio: float = 1.0, namespace: str = "notify-dedup"
) -> Tracing:
    """The process's tracing: ``OFF`` when ``endpoint`` is None or empty; else a provider
    exporting to ``<endpoint>/v1/traces`` (OTLP over HTTP, protobuf) in batches, sampling the
    traces it starts at ``sample_ratio`` (``[telemetry] sample_ratio``)."""
    if not endpoint:
        return OFF
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.namespace": namespace}),
                              sampler=sampler(sample_ratio))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"), schedule_delay_millis=500)
    )
    logger.info("traces of %s are exported over OTLP/HTTP ([telemetry] otlp_endpoint), %g of those it starts",
                service, sample_ratio)
    return Tracing(provider.get_tracer("notify-dedup"), provider)
