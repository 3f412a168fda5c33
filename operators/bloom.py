"""A Bloom prefilter in front of keyed state, split by event time so it never saturates.

Keys are filed under the segment of their *expiry* (``t0 + W0 + lateness``), segment length
``span_ms``. Once the watermark passes a segment's end every key in it has been evicted from
state, so the whole segment is dropped. "Not in any live segment" means definitely new and the
state read is skipped; "maybe" always falls through to state. The filter is never the truth.

Persistence: PyFlink has no operator state, so the owner keeps, in keyed state, a snapshot of
each segment (``save_bytes``) and the hashes added since (``pending``). ``restore`` rebuilds the
exact filter from those two, so a restored or rescaled job skips state reads from its first
record on.
"""

from __future__ import annotations

import math
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
    """Bloom segments keyed by ``expiry // span_ms``; items are stable 128-bit key hashes."""

    def __init__(self, cfg: BloomConfig) -> None:
        self._cfg = cfg
        self._segments: dict[int, Bloom] = {}

    def segment_id(self, expiry_ms: int) -> int:
        return expiry_ms // self._cfg.span_ms

    def _new_segment(self) -> Bloom:
        return Bloom(self._cfg.segment_capacity(), self._cfg.segment_fp_rate(), _identity)

    def add(self, key_hash: int, expiry_ms: int) -> int:
        """File a key under its expiry's segment; returns the segment id."""
        seg = self.segment_id(expiry_ms)
        bloom = self._segments.get(seg)
        if bloom is None:
            bloom = self._segments[seg] = self._new_segment()
        bloom.add(key_hash)
        return seg

    def add_to_segment(self, seg: int, key_hash: int) -> None:
        bloom = self._segments.get(seg)
        if bloom is None:
            bloom = self._segments[seg] = self._new_segment()
        bloom.add(key_hash)

    def might_contain(self, key_hash: int) -> bool:
        return any(key_hash in bloom for bloom in self._segments.values())

    def expire(self, watermark: int) -> list[int]:
        """Drop every segment whose keys have all expired by ``watermark``; returns their ids."""
        dead = [s for s in self._segments if (s + 1) * self._cfg.span_ms <= watermark]
        for seg in dead:
            del self._segments[seg]
        return dead

    def segment_ids(self) -> list[int]:
        return sorted(self._segments)

    def save_segment(self, seg: int) -> bytes:
        return bytes(self._segments[seg].save_bytes())

    def load_segment(self, seg: int, data: bytes) -> None:
        self._segments[seg] = Bloom.load_bytes(data, _identity)

    def size_bits(self) -> int:
        return sum(b.size_in_bits for b in self._segments.values())

    def approx_items(self) -> float:
        return sum(b.approx_items for b in self._segments.values())

    def fill_ratio(self) -> float:
        """Items filed over the designed capacity of the live segments (0 when empty)."""
        if not self._segments:
            return 0.0
        return self.approx_items() / (len(self._segments) * self._cfg.segment_capacity())
