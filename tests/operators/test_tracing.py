"""operators.tracing: off costs a check and loads nothing; on, spans continue a traceparent."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from operators.errors import ConfigError
from operators.tracing import OFF, Tracing, sampled, sampler, start_tracing, valid_traceparent
from settings import Settings, load_settings

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), provider), exporter


@pytest.mark.parametrize("value", [
    None, "", PARENT[:-1], PARENT + "0", PARENT.upper(), "01" + PARENT[2:], PARENT.replace("-", "_"),
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
])
def test_a_malformed_traceparent_is_none(value: str | None) -> None:
    assert valid_traceparent(value) is None


def test_a_valid_traceparent_is_kept() -> None:
    assert valid_traceparent(PARENT) == PARENT


def test_off_yields_no_span_and_no_context() -> None:
    assert not OFF.on and start_tracing(None, "x") is OFF and start_tracing("", "x") is OFF
    with OFF.span("s", parent=PARENT) as span, OFF.child("c") as child:
        assert span is None and child is None
    assert OFF.traceparent() is None
    OFF.shutdown()


def test_off_imports_nothing_of_opentelemetry() -> None:
    code = ("import sys; from operators.tracing import start_tracing; t = start_tracing(None, 'x');"
            "\nwith t.span('s', parent=None): pass\nprint(any(m.startswith('opentelemetry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_span_continues_its_parent_and_its_child_continues_it() -> None:
    tracing, exporter = in_memory()
    with tracing.span("api", parent=PARENT, kind="server", attributes={"caller": "shop"}) as span:
        assert span is not None
        carried = tracing.traceparent()
        with tracing.child("inner", kind="client"):
            pass
    with tracing.span("sender", parent=carried):
        pass
    inner, api, sender = exporter.get_finished_spans()
    assert {s.context.trace_id for s in (inner, api, sender)} == {int(PARENT[3:35], 16)}
    assert api.parent is not None and api.parent.span_id == int(PARENT[36:52], 16)
    assert carried == f"00-{api.context.trace_id:032x}-{api.context.span_id:016x}-01"
    assert inner.parent is not None and inner.parent.span_id == api.context.span_id
    assert sender.parent is not None and sender.parent.span_id == api.context.span_id
    assert api.attributes == {"caller": "shop"} and api.kind.name == "SERVER" and inner.kind.name == "CLIENT"


def test_a_malformed_parent_starts_a_new_trace_even_inside_another_span() -> None:
    tracing, exporter = in_memory()
    with tracing.span("outer", parent=PARENT), tracing.span("new", parent="garbage"):
        pass
    new, outer = exporter.get_finished_spans()
    assert new.parent is None and new.context.trace_id != outer.context.trace_id


def test_an_exception_marks_the_span_as_an_error() -> None:
    tracing, exporter = in_memory()
    with pytest.raises(RuntimeError), tracing.span("failing", parent=None):
        raise RuntimeError("boom")
    [span] = exporter.get_finished_spans()
    assert span.status.status_code.name == "ERROR"


def test_the_setting_and_its_variable() -> None:
    assert Settings().telemetry.otlp_endpoint is None
    cfg = load_settings(env={"DEDUP_TELEMETRY_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert cfg.telemetry.otlp_endpoint == "http://127.0.0.1:4318"
    assert cfg.telemetry.service("api") == "notify-dedup-api"
    assert load_settings(env={"DEDUP_TELEMETRY_OTLP_ENDPOINT": ""}).telemetry.otlp_endpoint is None
    with pytest.raises(ConfigError, match="otlp_endpoint"):
        load_settings(env={"DEDUP_TELEMETRY_OTLP_ENDPOINT": "127.0.0.1:4318"})


def test_a_recorded_span_keeps_its_start_continues_its_parent_and_gives_its_own_context() -> None:
    tracing, exporter = in_memory()
    started = time.time_ns() - 5_000_000
    carried = tracing.record("decision", parent=PARENT, start_ns=started, attributes={"dedup.decision": "accepted"})
    [span] = exporter.get_finished_spans()
    assert span.name == "decision" and span.start_time == started and span.end_time is not None
    assert span.end_time >= started + 5_000_000
    assert f"{span.context.trace_id:032x}" == PARENT[3:35] and f"{span.parent.span_id:016x}" == PARENT[36:52]
    assert carried == f"00-{PARENT[3:35]}-{span.context.span_id:016x}-01"
    assert dict(span.attributes or {}) == {"dedup.decision": "accepted"}
    assert OFF.record("decision", parent=PARENT, start_ns=started) is None


def test_a_recorded_span_with_a_malformed_parent_starts_a_trace_of_its_own() -> None:
    tracing, exporter = in_memory()
    carried = tracing.record("decision", parent="00-" + "z" * 52, start_ns=time.time_ns())
    [span] = exporter.get_finished_spans()
    assert span.parent is None
    assert valid_traceparent(carried) == carried
    assert (carried[3:35], carried[36:52]) == (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")


def with_ratio(ratio: float) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler(ratio))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), provider), exporter


def test_a_root_is_kept_at_the_ratio_and_a_child_follows_its_parents_decision() -> None:
    none, dropped = with_ratio(0.0)
    with none.span("root", parent=None):
        unsampled = none.traceparent()
    with none.span("caller's", parent=PARENT):  # the caller sampled it: kept whatever the ratio
        pass
    assert unsampled is not None and not int(unsampled[-2:], 16) & 1  # the context travels, its sampled bit off
    [kept] = dropped.get_finished_spans()
    assert kept.name == "caller's"
    every, exported = with_ratio(1.0)
    with every.span("downstream", parent=unsampled):  # a record carrying an unsampled context
        carried = every.traceparent()
    assert exported.get_finished_spans() == () and carried is not None and not int(carried[-2:], 16) & 1
    assert carried[3:35] == unsampled[3:35]
    # the job's decision of a trace not kept: the parent passed on as it came, no span made
    assert every.record("decision", parent=unsampled, start_ns=time.time_ns()) == unsampled
    assert exported.get_finished_spans() == ()
    assert not every.follows(unsampled) and every.follows(PARENT) and not every.follows(None)
    assert not OFF.follows(PARENT)
    assert sampled(PARENT) and not sampled(PARENT[:-2] + "00") and sampled(PARENT[:-2] + "03")
    assert not sampled(None) and not sampled("garbage")


def test_the_ratio_is_a_share() -> None:
    with pytest.raises(ConfigError, match="sample_ratio"):
        load_settings(None, env={"DEDUP_TELEMETRY_SAMPLE_RATIO": "1.5"})
    assert load_settings(None, env={"DEDUP_TELEMETRY_SAMPLE_RATIO": "0.01"}).telemetry.sample_ratio == 0.01
