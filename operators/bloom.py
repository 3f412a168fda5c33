"""A Bloom prefilter in front of keyed state, split by event time so it never saturates.

Keys are filed under the segment of their *expiry* (``t0 + W0 + lateness``), segment length
``span_ms``. Once the watermark passes a segment's end every key in it has been evicted from
state, so the whole segment is dropped. "Not in any live segment" means definitely new and the
state read is skipped; "maybe" always falls through to state. The filter is never the truth.

Persistence: PyFlink has no operator state, so the owner (jobs/dedup_function.py) keeps, in keyed
state, each segment as ``save_segment`` writes it and the keys accepted since (the eviction log's
newest part); ``load_segment`` and ``add`` rebuild the exact filter from those two, so a restored
or rescaled job skips state reads from its first record on.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from rbloom import Bloom


def _identity(item: int) -> int:
    return item


@dataclass(frozen=True, slots=True)
class BloomConfig:
    """Sizing of one shard's prefilter.

    :param expected_keys: keys one shard is expected to hold over one window
    :param fp_rate: target false-positive rate of a lookup across all live segments
    :param span_ms: event-time length of one segment
    :param segments_per_window: how many segments one default window spans (for sizing)
    """

    expected_keys: int
    fp_rate: float
    span_ms: int
    segments_per_window: int

    def segment_capacity(self) -> int:
        return max(64, math.ceil(self.expected_keys / self.segments_per_window))

    def segment_fp_rate(self) -> float:
        # a lookup probes every live segment: about segments_per_window + 1 of them
        return self.fp_rate / (self.segments_per_window + 1)


class SegmentedBloom:
    """Bloom segments keyed by ``expiry // span_ms``; items are stable 128-bit key hashes.

    A segment that receives more keys than it was sized for (a burst, a backfill) grows a
    chain of filters instead of over-filling one, so the false-positive rate stays bounded by
    the number of filters, never by how unevenly keys arrive.
    """

    def __init__(self, cfg: BloomConfig) -> None:
        self._cfg = cfg
        self._segments: dict[int, list[Bloom]] = {}
        self._last_count: dict[int, int] = {}

    def segment_id(self, expiry_ms: int) -> int:
        return expiry_ms // self._cfg.span_ms

    def _new_filter(self) -> Bloom:
        return Bloom(self._cfg.segment_capacity(), self._cfg.segment_fp_rate(), _identity)

    def add(self, key_hash: int, expiry_ms: int) -> int:
        """File a key under its expiry's segment; returns the segment id."""
        seg = self.segment_id(expiry_ms)
        self.add_to_segment(seg, key_hash)
        return seg

    def add_to_segment(self, seg: int, key_hash: int) -> None:
        chain = self._segments.get(seg)
        if chain is None:
            chain = self._segments[seg] = [self._new_filter()]
            self._last_count[seg] = 0
        elif self._last_count[seg] >= self._cfg.segment_capacity():
            chain.append(self._new_filter())
            self._last_count[seg] = 0
        chain[-1].add(key_hash)
        self._last_count[seg] += 1

    def might_contain(self, key_hash: int) -> bool:
        for chain in self._segments.values():
            for bloom in chain:
                if key_hash in bloom:
                    return True
        return False

    def expire(self, watermark: int) -> list[int]:
        """Drop every segment whose keys have all expired by ``watermark``; returns their ids."""
        dead = [s for s in self._segments if (s + 1) * self._cfg.span_ms <= watermark]
        for seg in dead:
            del self._segments[seg]
            del self._last_count[seg]
        return dead

    def segment_ids(self) -> list[int]:
        return sorted(self._segments)

    def save_segment(self, seg: int) -> bytes:
        """One segment's chain as bytes: a count, then each filter's length and bytes."""
        parts = [bytes(b.save_bytes()) for b in self._segments[seg]]
        out = bytearray(struct.pack(">I", len(parts)))
        for part in parts:
            out += struct.pack(">Q", len(part)) + part
        return bytes(out)

    def load_segment(self, seg: int, data: bytes) -> None:
        (count,), pos = struct.unpack_from(">I", data), 4
        chain = []
        for _ in range(count):
            (length,) = struct.unpack_from(">Q", data, pos)
            chain.append(Bloom.load_bytes(data[pos + 8:pos + 8 + length], _identity))
            pos += 8 + length
        self._segments[seg] = chain
        self._last_count[seg] = round(chain[-1].approx_items) if chain else 0

    def filters(self) -> int:
        return sum(len(c) for c in self._segments.values())

    def size_bits(self) -> int:
        return sum(b.size_in_bits for c in self._segments.values() for b in c)

    def approx_items(self) -> float:
        return sum(b.approx_items for c in self._segments.values() for b in c)

    def fill_ratio(self) -> float:
        """Items filed over the designed capacity of the live filters (0 when empty)."""
        filters = self.filters()
        if not filters:
            return 0.0
        return self.approx_items() / (filters * self._cfg.segment_capacity())
