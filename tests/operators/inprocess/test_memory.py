"""operators.inprocess.MemoryDedup against the reference model, and its bounds."""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import reference
from operators.dedup_key import resolve_dedup_key
from operators.inprocess import Check, MemoryDedup
from operators.records import NotificationRequest
from operators.window import NO_WATERMARK, LatePolicy, WindowConfig
from tests.operators.strategies import cases

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_engine(stream: list[tuple[NotificationRequest, int]], cfg: WindowConfig, **kw: object) -> list[tuple]:
    engine = MemoryDedup(cfg, **kw)  # type: ignore[arg-type]
    out = []
    for r, _ in stream:
        c = engine.check(resolve_dedup_key(r), r.notification_id, r.event_time, ttl_sec=r.dedup_ttl_sec)
        out.append(("new", None, None, None) if c.new else ("duplicate", c.original_notification_id,
                                                              c.first_seen_ms, c.occurrence))
    return out


def as_reference_sees_it(stream: list[tuple[NotificationRequest, int]]) -> list[tuple[NotificationRequest, int]]:
    """The engine's time is the newest it has seen: a watermark of the requests before each one."""
    out, newest = [], NO_WATERMARK
    for r, _ in stream:
        out.append((r, newest))
        newest = max(newest, r.event_time)
    return out


def summarize(outcomes: list[reference.Outcome]) -> list[tuple]:
    return [(o.verdict, o.original_notification_id, o.first_seen_event_time, o.occurrence) for o in outcomes]


@PROPERTY
@given(cases(LatePolicy.BEST_EFFORT))
def test_one_shard_is_the_reference_model_with_its_own_time_as_the_watermark(case) -> None:
    cfg, stream = case
    cfg = WindowConfig(cfg.default_window_ms, cfg.max_window_ms, 0, LatePolicy.BEST_EFFORT)
    expected = summarize(reference.run(as_reference_sees_it(stream), cfg))
    assert run_engine(stream, cfg, shards=1) == expected


@PROPERTY
@given(cases(LatePolicy.BEST_EFFORT), st.sampled_from([2, 8, 64]), st.booleans())
def test_in_time_order_any_sharding_and_hashing_gives_the_reference_verdicts(case, shards, hashed) -> None:
    cfg, stream = case
    cfg = WindowConfig(cfg.default_window_ms, cfg.max_window_ms, 0, LatePolicy.BEST_EFFORT)
    ordered = sorted(stream, key=lambda item: item[0].event_time)
    expected = summarize(reference.run(as_reference_sees_it(ordered), cfg))
    got = run_engine(ordered, cfg, shards=shards, hashed=hashed)
    if hashed:  # the original's id is not kept
        expected = [(v, None if v == "duplicate" else o, f, n) for v, o, f, n in expected]
    assert got == expected


def test_should_send_and_memory_bounded_by_the_window() -> None:
    engine = MemoryDedup(WindowConfig(default_window_ms=1_000), shards=4)
    assert engine.should_send("a", 0) is True
    assert engine.should_send("a", 999) is False
    assert engine.should_send("a", 1_000) is True  # the bound is exclusive, as in the job
    for i in range(10_000):
        engine.should_send(f"k{i}", 2_000 + i // 10)
    assert len(engine) <= 10_000
    assert engine.advance(10_000) > 0
    assert len(engine) == 0


def test_check_names_the_original_and_counts_occurrences() -> None:
    engine = MemoryDedup()
    assert engine.check("k", "n-1", 100) == Check(True)
    assert engine.check("k", "n-2", 200) == Check(False, "n-1", 100, 2)
    assert engine.check("k", "n-3", 50) == Check(False, "n-1", 100, 3)
    assert engine.check("k", "n-4", 100, ttl_sec=1) == Check(False, "n-1", 100, 4)  # the original's window


def test_threads_share_one_engine_and_each_key_is_new_once() -> None:
    engine = MemoryDedup(shards=8)
    sent: list[str] = []
    lock = threading.Lock()

    def work(offset: int) -> None:
        mine = [k for k in (f"key-{i}" for i in range(5_000)) if engine.should_send(k, 1_000 + offset)]
        with lock:
            sent.extend(mine)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == sorted(f"key-{i}" for i in range(5_000))


def test_shards_must_be_a_power_of_two() -> None:
    import pytest

    with pytest.raises(ValueError, match="power of two"):
        MemoryDedup(shards=3)
