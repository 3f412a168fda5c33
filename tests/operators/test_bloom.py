"""operators.bloom: the event-time segmented Bloom prefilter."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.bloom import BloomConfig, SegmentedBloom
from operators.dedup_key import key_hash

PROPERTY = settings(max_examples=200, deadline=None)

SPAN = 1_000
CFG = BloomConfig(expected_keys=1_000, fp_rate=0.01, span_ms=SPAN, segments_per_window=4)

HASHES = st.integers(-(2**127), 2**127 - 1)
EXPIRIES = st.integers(-20_000, 20_000)
ENTRIES = st.lists(st.tuples(HASHES, EXPIRIES), max_size=60)


@PROPERTY
@given(ENTRIES)
def test_no_false_negatives(entries: list[tuple[int, int]]) -> None:
    bloom = SegmentedBloom(CFG)
    for h, exp in entries:
        assert bloom.add(h, exp) == exp // SPAN
    for h, _ in entries:
        assert bloom.might_contain(h)
    assert bloom.segment_ids() == sorted({exp // SPAN for _, exp in entries})


@PROPERTY
@given(st.lists(st.tuples(st.text(max_size=10), EXPIRIES), max_size=60))
def test_no_false_negatives_for_real_key_hashes(entries: list[tuple[str, int]]) -> None:
    bloom = SegmentedBloom(CFG)
    for key, exp in entries:
        bloom.add(key_hash(key), exp)
    assert all(bloom.might_contain(key_hash(key)) for key, _ in entries)


def test_segment_id_floors_negative_expiries() -> None:
    bloom = SegmentedBloom(CFG)
    assert [bloom.segment_id(e) for e in (-1_001, -1_000, -1, 0, 999, 1_000)] == [-2, -1, -1, 0, 0, 1]


@PROPERTY
@given(ENTRIES, st.lists(st.integers(-25_000, 25_000), min_size=1, max_size=4))
def test_expire_drops_exactly_the_segments_that_ended(
    entries: list[tuple[int, int]], marks: list[int]
) -> None:
    bloom = SegmentedBloom(CFG)
    for h, exp in entries:
        bloom.add(h, exp)
    for watermark in sorted(marks):
        before = set(bloom.segment_ids())
        dead = bloom.expire(watermark)
        assert len(dead) == len(set(dead))
        assert set(dead) == {s for s in before if (s + 1) * SPAN <= watermark}
        assert set(bloom.segment_ids()) == before - set(dead)
        for h, exp in entries:
            if exp > watermark:  # still in state: must still be found
                assert bloom.might_contain(h)
                assert exp // SPAN in bloom.segment_ids()


def test_expire_boundary() -> None:
    bloom = SegmentedBloom(CFG)
    bloom.add(1, 1_999)  # segment 1 = [1000, 2000)
    bloom.add(2, 2_000)  # segment 2
    assert bloom.expire(1_999) == []  # key 1 expires at 1999 but the segment runs to 2000
    assert bloom.might_contain(1)
    assert bloom.expire(2_000) == [1]
    assert not bloom.might_contain(1)  # the segment is gone (no other segment holds it)
    assert bloom.might_contain(2)
    assert bloom.segment_ids() == [2]
    assert bloom.expire(2_999) == []
    assert bloom.expire(10**9) == [2]
    assert bloom.segment_ids() == [] and not bloom.might_contain(2)


@PROPERTY
@given(ENTRIES, st.lists(HASHES, max_size=40))
def test_save_and_load_give_identical_membership(entries: list[tuple[int, int]], probes: list[int]) -> None:
    bloom = SegmentedBloom(CFG)
    for h, exp in entries:
        bloom.add(h, exp)
    restored = SegmentedBloom(CFG)
    for seg in bloom.segment_ids():
        restored.load_segment(seg, bloom.save_segment(seg))
    assert restored.segment_ids() == bloom.segment_ids()
    for h in [h for h, _ in entries] + probes:
        assert restored.might_contain(h) == bloom.might_contain(h)
    for seg in bloom.segment_ids():
        assert restored.save_segment(seg) == bloom.save_segment(seg)
    assert restored.size_bits() == bloom.size_bits()
    assert restored.approx_items() == pytest.approx(bloom.approx_items())


def test_save_and_load_keep_answers_for_many_absent_keys() -> None:
    bloom = SegmentedBloom(CFG)
    for i in range(2_000):
        bloom.add(key_hash(f"present-{i}"), (i % 5) * SPAN)
    restored = SegmentedBloom(CFG)
    for seg in bloom.segment_ids():
        restored.load_segment(seg, bloom.save_segment(seg))
    absent = [key_hash(f"absent-{i}") for i in range(20_000)]
    assert [restored.might_contain(h) for h in absent] == [bloom.might_contain(h) for h in absent]
    # and the restored filter keeps working: adds land in the loaded segment
    restored.add_to_segment(3, key_hash("late-add"))
    assert restored.might_contain(key_hash("late-add"))
    assert restored.segment_ids() == bloom.segment_ids()


def test_add_to_segment() -> None:
    bloom = SegmentedBloom(CFG)
    bloom.add_to_segment(7, 42)
    assert bloom.segment_ids() == [7] and bloom.might_contain(42)
    bloom.add_to_segment(7, 43)
    assert bloom.segment_ids() == [7] and bloom.might_contain(43)
    assert bloom.expire(8 * SPAN) == [7]


def test_false_positive_rate_near_the_configured_rate() -> None:
    """Live segments filled to their designed capacity; 100k keys that were never added."""
    cfg = BloomConfig(expected_keys=40_000, fp_rate=0.01, span_ms=SPAN, segments_per_window=4)
    bloom = SegmentedBloom(cfg)
    live = cfg.segments_per_window + 1  # what a lookup probes, per the sizing
    for seg in range(live):
        for i in range(cfg.segment_capacity()):
            bloom.add(key_hash(f"present-{seg}-{i}"), seg * SPAN + i % SPAN)
    assert bloom.segment_ids() == list(range(live))
    false_positives = sum(bloom.might_contain(key_hash(f"absent-{i}")) for i in range(100_000))
    rate = false_positives / 100_000
    assert rate < 2 * cfg.fp_rate
    assert rate > cfg.fp_rate / 4, "far below the target: the filter is oversized"


def test_sizing() -> None:
    assert CFG.segment_capacity() == 250
    assert CFG.segment_fp_rate() == pytest.approx(0.01 / 5)
    assert (
        BloomConfig(expected_keys=10, fp_rate=0.01, span_ms=SPAN, segments_per_window=4).segment_capacity()
        == 64
    )
    assert (
        BloomConfig(expected_keys=1_001, fp_rate=0.01, span_ms=SPAN, segments_per_window=4).segment_capacity()
        == 251
    )


def test_size_bits_and_fill_ratio() -> None:
    bloom = SegmentedBloom(CFG)
    assert bloom.size_bits() == 0
    assert bloom.fill_ratio() == 0.0
    assert bloom.approx_items() == 0
    n, p = CFG.segment_capacity(), CFG.segment_fp_rate()
    optimal = -n * math.log(p) / math.log(2) ** 2  # bits of one segment at its capacity and rate
    bloom.add(key_hash("x"), 0)
    assert optimal <= bloom.size_bits() < 1.1 * optimal + 64
    assert 0 < bloom.fill_ratio() < 0.05
    for i in range(n - 1):
        bloom.add(key_hash(f"k{i}"), 500)
    assert bloom.fill_ratio() == pytest.approx(1.0, abs=0.1)
    assert bloom.approx_items() == pytest.approx(n, rel=0.1)
    bloom.add(key_hash("y"), SPAN)  # a second, almost empty segment halves the ratio
    assert bloom.size_bits() == pytest.approx(2 * optimal, rel=0.1)
    assert bloom.fill_ratio() == pytest.approx(0.5, abs=0.06)
    bloom.expire(10 * SPAN)
    assert bloom.size_bits() == 0 and bloom.fill_ratio() == 0.0


def test_a_burst_grows_a_chain_and_keeps_the_false_positive_rate() -> None:
    """Ten times a segment's capacity in one segment: no false negatives, FP rate still bounded."""
    bloom = SegmentedBloom(CFG)
    n = 10 * CFG.segment_capacity()
    for i in range(n):
        bloom.add(key_hash(f"burst{i}"), 500)
    assert bloom.filters() == 10
    assert all(bloom.might_contain(key_hash(f"burst{i}")) for i in range(n))
    absent = 20_000
    fps = sum(bloom.might_contain(key_hash(f"absent{i}")) for i in range(absent))
    # ten filters at the per-filter rate: about 10 x segment_fp_rate, not a saturated filter
    assert fps / absent < 10 * CFG.segment_fp_rate() * 1.5
    restored = SegmentedBloom(CFG)
    restored.load_segment(0, bloom.save_segment(0))
    assert restored.filters() == 10
    assert all(restored.might_contain(key_hash(f"burst{i}")) for i in range(0, n, 7))
