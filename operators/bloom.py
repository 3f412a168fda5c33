"""A Bloom prefilter in front of keyed state, sized for the keys a shard holds, rebuilt as they go.

One rbloom filter per shard holds the keys in its state. "Not in the filter" means definitely
new and the state read is skipped; "maybe" always falls through to state, so the filter can cost
a read but never decide wrongly. It forgets by being rebuilt: at each eviction (an event-time
timer, once per eviction grain) the shard's owner builds a new filter from the keys that stay,
sized for them with room to grow (``growth``), so its bits per key held stay near the ideal for
the false-positive rate however the key count moves. A shard that outgrows its filter between
two evictions is rebuilt at once (the owner reads the keys from its eviction log).

Persistence: PyFlink has no operator state, so the owner (jobs/dedup_function.py) keeps, in keyed
state, the filter as :meth:`ShardFilter.save` writes it and the keys accepted since (the newest
part of its eviction log); :meth:`ShardFilter.load` and :meth:`ShardFilter.add` rebuild the exact
filter from those two, so a restored or rescaled job skips state reads from its first record on.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from rbloom import Bloom


def _identity(item: int) -> int:
    return item



@dataclass(frozen=True, slots=True)
class BloomConfig:
    """Sizing of one shard's prefilter.

    :param initial_keys: the capacity of a shard's first filter (before it holds any key)
    :param fp_rate: the false-positive rate of a lookup while the filter is within its capacity
    :param growth: capacity over the keys held, at each rebuild (room for the keys that come
        before the next eviction; more room, fewer rebuilds, more bits per key)
    """

    initial_keys: int
    fp_rate: float
    growth: float = 1.2

    def __post_init__(self) -> None:
        if self.initial_keys < 1 or not 0.0 < self.fp_rate < 1.0 or self.growth < 1.0:
            raise ValueError("bloom: initial_keys >= 1, 0 < fp_rate < 1, growth >= 1")

    def capacity_for(self, keys: int) -> int:
        return max(self.initial_keys, math.ceil(keys * self.growth))


class ShardFilter:
    """One shard's filter: items are stable 64-bit key hashes (``operators.dedup_key.key_hash``),
    given to rbloom as they are (it derives its bit positions from the item by an LCG: the measured
    false-positive rate is the configured one, tests/operators/test_bloom.py)."""

    __slots__ = ("_cfg", "_bloom", "_capacity", "_count")

    def __init__(self, cfg: BloomConfig, capacity: int | None = None) -> None:
        self._cfg = cfg
        self._capacity = capacity if capacity is not None else cfg.initial_keys
        self._bloom = Bloom(self._capacity, cfg.fp_rate, _identity)
        self._count = 0

    @classmethod
    def build(cls, cfg: BloomConfig, hashes: Iterable[int], keys: int) -> ShardFilter:
        """A filter of ``keys`` distinct keys (their hashes), with room to grow."""
        f = cls(cfg, cfg.capacity_for(keys))
        for h in hashes:
            f.add(h)
        return f

    def add(self, key_hash: int) -> None:
        self._bloom.add(key_hash)
        self._count += 1

    def might_contain(self, key_hash: int) -> bool:
        return key_hash in self._bloom

    def full(self) -> bool:
        """More keys added than it was sized for: its false-positive rate is past the configured."""
        return self._count > self._capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    def save(self) -> bytes:
        """The filter as bytes: its capacity, the keys added, then rbloom's own bytes."""
        return struct.pack(">QQ", self._capacity, self._count) + bytes(self._bloom.save_bytes())

    @classmethod
    def load(cls, cfg: BloomConfig, data: bytes) -> ShardFilter:
        capacity, count = struct.unpack_from(">QQ", data)
        f = cls.__new__(cls)
        f._cfg = cfg
        f._capacity = capacity
        f._count = count
        f._bloom = Bloom.load_bytes(data[16:], _identity)
        return f

    def size_bits(self) -> int:
        return int(self._bloom.size_in_bits)

    def approx_items(self) -> float:
        return float(self._bloom.approx_items)

    def fill_ratio(self) -> float:
        """Keys added over the capacity it was sized for."""
        return self._count / self._capacity if self._capacity else 0.0
