"""The ``[dedup]`` section: the window rule, watermarks, input limits, the Bloom prefilter and
the mini-batches."""

from __future__ import annotations

from pydantic import field_validator

from operators.bloom import BloomConfig
from operators.limits import RequestLimits
from operators.window import LatePolicy, WindowConfig
from settings.base import Section


class DedupSettings(Section):
    """The dedup rule, watermarks and the Bloom prefilter.

    :param default_window_sec: window of a request without dedup_ttl_sec
    :param max_window_sec: upper clamp of dedup_ttl_sec
    :param allowed_lateness_ms: how far behind the watermark a request is still on time
    :param late_policy: side-output (late requests only to the late topic) or best-effort
    :param out_of_orderness_ms: watermark = newest event time of a partition minus this
    :param watermark_interval_ms: how often the sources emit a watermark; every one closes the
        mini-batches into Python, so a longer interval means fewer, larger calls (and lateness
        judged on a watermark up to this much older)
    :param idleness_ms: a partition with no records for this long stops holding the watermark
    :param max_future_ms: a request whose event time is more than this far ahead of the wall clock
        is invalid and never moves the watermark (the clock skew tolerated between producers and
        the job)
    :param max_record_bytes: a serialized request longer than this is invalid
    :param max_field_bytes: the longest ``dedup_key``, ``notification_id``, ``user_id`` and
        ``template_id`` (UTF-8 bytes each)
    :param max_params: the most entries in a request's params
    :param max_param_bytes: the longest key or value of a params entry (UTF-8 bytes)
    :param invalid_raw_prefix_bytes: how many bytes of a rejected record its InvalidRecord keeps
        (with the record's length and SHA-256)
    :param shards: keyed-state shards the dedup keys are spread over (the key of key_by)
    :param bloom_expected_keys: keys the whole job is expected to hold at first: a shard's first
        filter is sized for its share; later ones for the keys the shard holds (a filter that
        fills up is rebuilt larger at once), so a low estimate costs a few rebuilds, a high one
        memory until the first eviction
    :param bloom_fp_rate: target false-positive rate of the prefilter
    :param bloom_growth: a shard's filter is rebuilt at each eviction with room for this many
        times the keys it holds (1.2: about 11.5 bits per key held at 1%)
    :param bloom_snapshot_every: keys added to a shard between two snapshots of its filter
    :param batch_max_requests: requests buffered (over all shards of a subtask) before they go to
        the Python dedup operator as one mini-batch per shard
    :param batch_max_bytes: the most bytes (about) of requests buffered at once; the mini-batches
        are sent before a request would pass it (a request larger than it goes alone)
    :param batch_max_delay_ms: the longest a request waits for its mini-batch; batches are also
        sent before every watermark and checkpoint barrier
    """

    default_window_sec: int = 7 * 86_400
    max_window_sec: int = 30 * 86_400
    allowed_lateness_ms: int = 0
    late_policy: str = LatePolicy.SIDE_OUTPUT.value
    out_of_orderness_ms: int = 60_000
    idleness_ms: int = 30_000
    watermark_interval_ms: int = 1_000
    max_future_ms: int = 5 * 60_000
    max_record_bytes: int = 64 * 1024
    max_field_bytes: int = 512
    max_params: int = 64
    max_param_bytes: int = 4 * 1024
    invalid_raw_prefix_bytes: int = 4 * 1024
    shards: int = 128
    bloom_expected_keys: int = 131_072
    bloom_fp_rate: float = 0.01
    bloom_growth: float = 1.2
    bloom_snapshot_every: int = 512
    batch_max_requests: int = 8_000
    batch_max_bytes: int = 4 * 1024 * 1024
    batch_max_delay_ms: int = 50

    @field_validator("late_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        policies = [p.value for p in LatePolicy]
        if value not in policies:
            raise ValueError(f"must be one of {', '.join(policies)}")
        return value

    def window_config(self) -> WindowConfig:
        return WindowConfig(
            default_window_ms=self.default_window_sec * 1000,
            max_window_ms=self.max_window_sec * 1000,
            allowed_lateness_ms=self.allowed_lateness_ms,
            late_policy=LatePolicy(self.late_policy),
        )

    def eviction_grain_ms(self) -> int:
        """State outlives its window by at most this: 1/256 of the window, 1 s to 1 h."""
        return min(3_600, max(1, self.default_window_sec // 256)) * 1000

    def bloom_config(self) -> BloomConfig:
        return BloomConfig(
            initial_keys=max(64, self.bloom_expected_keys // self.shards),
            fp_rate=self.bloom_fp_rate,
            growth=self.bloom_growth,
        )

    def request_limits(self) -> RequestLimits:
        """The input limits, as producers that check a request before writing it read them."""
        return RequestLimits(
            max_record_bytes=self.max_record_bytes,
            max_field_bytes=self.max_field_bytes,
            max_params=self.max_params,
            max_param_bytes=self.max_param_bytes,
            max_future_ms=self.max_future_ms,
        )
