"""operators.dedup: the per-batch decision loop of the dedup operator, without Flink.

Driven the way the Flink adapter drives it (tests/operators/drive.py: shards, mini-batches that
never cross a watermark, eviction timers), in batches of any size, against the reference model.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import reference
from operators.dedup import ACCEPTED, DUPLICATE, LATE, ShardMemory, decide_batch, evict, rebuild_memory
from operators.dedup_key import key_hash
from operators.window import NO_WATERMARK, Accepted, LatePolicy, WindowConfig
from tests.operators.drive import DictStore, Driver, options, summarize
from tests.operators.strategies import SIDE, cases, req

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(cases(SIDE), st.integers(1, 8), st.integers(1, 5), st.integers(0, 2**16))
def test_any_batching_and_sharding_gives_the_reference_verdicts(case, max_batch, shards, seed) -> None:
    """With the side-output policy. (With best-effort, a late request accepted with its expiry
    already behind the watermark is evicted by the next watermark, as Flink fires timers then; the
    reference forgets it before the next request. Per-request batches are checked against the
    reference for both policies in test_window_properties.)"""
    cfg, stream = case
    driver = Driver(cfg, shards=shards, seed=seed, max_batch=max_batch)
    assert driver.run(stream) == summarize(reference.run(stream, cfg))


@PROPERTY
@given(cases(SIDE), st.integers(1, 8))
def test_keys_held_are_the_reference_models_live_keys(case, max_batch) -> None:
    cfg, stream = case
    driver = Driver(cfg, max_batch=max_batch)
    driver.run(stream)
    final = max((w for _, w in stream), default=NO_WATERMARK)
    live = {o.dedup_key: o for o in reference.run(stream, cfg) if o.verdict == "new"}
    # the latest acceptance of each key, kept until the watermark reaches its expiry
    latest: dict[str, int] = {}
    for o in reference.run(stream, cfg):
        if o.verdict == "new":
            latest[o.dedup_key] = o.request.event_time + reference.request_window_ms(o.request.dedup_ttl_sec, cfg)
    held = {k for k, exp in latest.items() if final == NO_WATERMARK or exp + cfg.allowed_lateness_ms > final}
    assert driver.held() == len(held) <= len(live)


def test_one_batch_counts_reads_skips_and_false_positives() -> None:
    cfg = WindowConfig()
    opts = options(cfg)
    memory, store = ShardMemory.empty(opts.bloom), DictStore()
    result = decide_batch(
        dedup_keys=["a", "b", "a", "c"], key_hashes=[key_hash(k) for k in "abac"], event_times=[10, 20, 30, 40], notification_ids=["n1", "n2", "n3", "n4"],
        ttls=[None, None, None, None], watermark=NO_WATERMARK, memory=memory, store=store, opts=opts,
    )
    assert result.verdicts.outcome == [ACCEPTED, ACCEPTED, DUPLICATE, ACCEPTED]
    assert result.verdicts.original_notification_id == [None, None, "n1", None]
    assert result.verdicts.first_seen_event_time == [None, None, 10, None]
    assert result.verdicts.occurrence == [None, None, 2, None]
    # the repeat of "a" in the same batch is read from the batch, not from state
    assert store.reads == 0
    assert result.counts["state_reads"] == 1 and result.counts["state_reads_skipped"] == 3
    assert result.written == {"a": Accepted("n1", 10, cfg.default_window_ms, 2), "b": Accepted("n2", 20, cfg.default_window_ms),
                              "c": Accepted("n4", 40, cfg.default_window_ms)}
    assert [key for _, key, _ in result.logged] == ["a", "b", "c"]
    assert memory.held == 3 and memory.pending == 3
    assert result.verdicts.columns()[0] == [ACCEPTED, ACCEPTED, DUPLICATE, ACCEPTED]


def test_late_requests_carry_the_watermark_and_leave_state_alone() -> None:
    cfg = WindowConfig(allowed_lateness_ms=100, late_policy=LatePolicy.SIDE_OUTPUT)
    opts = options(cfg)
    memory, store = ShardMemory.empty(opts.bloom), DictStore()
    result = decide_batch(
        dedup_keys=["a", "b"], key_hashes=[key_hash("a"), key_hash("b")], event_times=[899, 900], notification_ids=["n1", "n2"], ttls=[None, None],
        watermark=1_000, memory=memory, store=store, opts=opts,
    )
    assert result.verdicts.outcome == [LATE, ACCEPTED]
    assert result.verdicts.watermark == [1_000, None]
    assert set(result.written) == {"b"}


def test_an_earlier_reacceptance_is_evicted_at_its_own_expiry() -> None:
    """A key accepted again with an earlier event time (out of order, beyond its window) has an
    earlier expiry than the acceptance before it: its timer must still evict it (an earlier
    build kept only the latest expiry of each key in the log and held such entries too long)."""
    cfg = WindowConfig(default_window_ms=1_000, max_window_ms=1_000, late_policy=LatePolicy.BEST_EFFORT)
    stream = [(req("n1", 5_000), NO_WATERMARK), (req("n2", 1), NO_WATERMARK), (req("n3", 0), 1_001)]
    driver = Driver(cfg)
    assert driver.run(stream) == summarize(reference.run(stream, cfg)) == [
        ("new", None, None, None), ("new", None, None, None), ("new", None, None, None),
    ]
    assert driver.held() == 1  # one key: n2 replaced n1, was evicted at 1001, then n3 was accepted


def test_evict_keeps_unexpired_items_and_removes_expired_entries_once() -> None:
    cfg = WindowConfig()
    store = DictStore()
    store.entries = {"a": ("n1", 0, 100, 1), "b": ("n2", 0, 500, 1)}
    gone = evict([(100, "a", 1), (100, "a", 0), (500, "b", 1), (700, "a", 0)], store, 100, cfg)
    assert gone.evicted == ["a"]
    assert gone.survivors == [(500, "b", 1), (700, "a", 0)]


def test_rebuild_from_entries() -> None:
    cfg = WindowConfig()
    opts = options(cfg)
    memory, log = rebuild_memory([("a", Accepted("n1", 0, 100)), ("b", Accepted("n2", 5, 100))], opts)
    assert memory.held == 2 and sorted(log) == [(100, "a", 1), (105, "b", 1)]
    from operators.dedup_key import key_hash

    assert memory.bloom.might_contain(key_hash("a")) and memory.bloom.might_contain(key_hash("b"))
