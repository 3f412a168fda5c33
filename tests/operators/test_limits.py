"""The job's input limits in Python (operators/limits.py): the same reasons the JVM's
RequestParser gives (tests/jobs/test_hardening.py checks those on the real job)."""

from __future__ import annotations

from operators import codec
from operators.limits import request_problem
from operators.records import Channel, NotificationRequest
from settings import DedupSettings

LIMITS = DedupSettings().request_limits()
NOW = 1_796_115_600_000


def req(**fields: object) -> NotificationRequest:
    base: dict[str, object] = {
        "notification_id": "n-1", "user_id": "u-1", "template_id": "otp", "channels": (Channel.SMS,),
        "event_time": NOW, "params": {"code": "1234"},
    }
    return NotificationRequest(**{**base, **fields})  # type: ignore[arg-type]


def problem(request: NotificationRequest, now: int = NOW) -> str | None:
    return request_problem(request, codec.encode_request(request), LIMITS, now)


def test_a_request_within_every_limit_passes_even_at_the_limits() -> None:
    assert problem(req()) is None
    at_limits = req(
        dedup_key="é" * 256, user_id="u" * 512,
        params={f"p{i}": "v" * 200 for i in range(64)} | {"p0": "9" * 4096},
        event_time=NOW + 300_000,
    )
    assert problem(at_limits) is None


def test_each_limit_gives_the_jobs_reason() -> None:
    assert problem(req(dedup_key="é" * 257)) == (
        "dedup_key of 514 bytes is over the limit of 512 bytes (dedup.max_field_bytes)")
    assert problem(req(user_id="u" * 513)) == (
        "user_id of 513 bytes is over the limit of 512 bytes (dedup.max_field_bytes)")
    assert problem(req(params={f"p{i}": "v" for i in range(65)})) == (
        "params has 65 entries, more than the limit of 64 (dedup.max_params)")
    assert problem(req(params={"code": "9" * 5_000})) == (
        "a params entry of 5000 bytes is over the limit of 4096 bytes (dedup.max_param_bytes)")
    assert problem(req(event_time=NOW + 300_001)) == (
        f"event_time {NOW + 300_001} is 300001 ms ahead of the clock, more than the 300000 ms allowed"
        " (dedup.max_future_ms)")
    big = req(params={f"p{i}": "v" * 1100 for i in range(60)})
    size = len(codec.encode_request(big))
    assert size > 65_536
    assert problem(big) == f"record of {size} bytes is over the limit of 65536 bytes (dedup.max_record_bytes)"
