"""operators.bloom: the shard filter, sized for the keys held and rebuilt as they go."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.bloom import BloomConfig, ShardFilter
from operators.dedup import ShardMemory
from operators.dedup_key import key_hash

PROPERTY = settings(max_examples=200, deadline=None)
CFG = BloomConfig(initial_keys=1_000, fp_rate=0.01)
HASHES = st.integers(-(2**127), 2**127 - 1)


@PROPERTY
@given(st.lists(HASHES, max_size=2_000))
def test_no_false_negatives_even_past_its_capacity(hashes: list[int]) -> None:
    f = ShardFilter(CFG)
    for h in hashes:
        f.add(h)
    assert all(f.might_contain(h) for h in hashes)
    assert f.full() == (len(hashes) > 1_000)


@PROPERTY
@given(st.lists(st.text(max_size=10), max_size=300), st.lists(HASHES, max_size=50))
def test_save_and_load_give_identical_answers(keys: list[str], probes: list[int]) -> None:
    f = ShardFilter(CFG)
    for k in keys:
        f.add(key_hash(k))
    g = ShardFilter.load(CFG, f.save())
    assert all(g.might_contain(key_hash(k)) for k in keys)
    assert [g.might_contain(p) for p in probes] == [f.might_contain(p) for p in probes]
    assert (g.capacity, g.fill_ratio(), g.size_bits()) == (f.capacity, f.fill_ratio(), f.size_bits())


def test_false_positive_rate_at_capacity_is_the_configured_one() -> None:
    f = ShardFilter.build(CFG, (key_hash(f"present-{i}") for i in range(10_000)), 10_000)
    assert f.capacity == 12_000
    false_positives = sum(f.might_contain(key_hash(f"absent-{i}")) for i in range(100_000))
    assert false_positives / 100_000 < 0.01  # below capacity: below the rate
    for i in range(10_000, 12_000):
        f.add(key_hash(f"present-{i}"))
    false_positives = sum(f.might_contain(key_hash(f"absent-{i}")) for i in range(100_000))
    assert 0.005 < false_positives / 100_000 < 0.015


def test_bits_per_key_held_stay_near_the_ideal_after_a_rebuild() -> None:
    """At 1%: 9.6 bits per key for a full, ideally sized filter; 11.5 with 20% room."""
    f = ShardFilter.build(CFG, (key_hash(f"k{i}") for i in range(50_000)), 50_000)
    assert 11.0 < f.size_bits() / 50_000 < 12.0
    assert 9.0 < f.size_bits() / f.capacity < 10.0


def test_memory_refilter_forgets_what_left_and_keeps_what_stays() -> None:
    memory = ShardMemory.empty(CFG)
    for i in range(3_000):
        memory.remember(f"k{i}", fresh=True)
    assert memory.bloom.full() and memory.held == 3_000 and memory.dirty
    memory.refilter((f"k{i}" for i in range(2_000, 3_000)), CFG)
    assert memory.bloom.capacity == 1_200  # 1,000 live keys, 20% room: not the initial capacity
    assert all(memory.bloom.might_contain(key_hash(f"k{i}")) for i in range(2_000, 3_000))
    gone = sum(memory.bloom.might_contain(key_hash(f"k{i}")) for i in range(2_000))
    assert gone < 40  # the forgotten keys are false positives now, at about the configured rate


def test_config_bounds() -> None:
    with pytest.raises(ValueError):
        BloomConfig(initial_keys=0, fp_rate=0.01)
    with pytest.raises(ValueError):
        BloomConfig(initial_keys=10, fp_rate=1.0)
    with pytest.raises(ValueError):
        BloomConfig(initial_keys=10, fp_rate=0.01, growth=0.9)
    assert BloomConfig(initial_keys=64, fp_rate=0.01).capacity_for(10) == 64
